"""The browse page's filters: read from a query string or a form, checked, and turned into the
API's ``RecordFilter`` (pure logic).

Times take the API's forms (ISO-8601, ``2h``, ``2h ago``) and two more that a person types in
a box: ``-1h`` (an hour ago) and epoch milliseconds (digits only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from urllib.parse import urlencode

from retryd.errors import TimeSpecError
from retryd.policy.timespec import parse_instant
from retryd.replay.errors import InvalidRequest
from retryd.replay.records import DEAD_REASONS, RecordFilter, key_from

LIMITS = {
    "topic": 249,
    "dead_reason": 64,
    "error_class": 1024,
    "fingerprint": 64,
    "original_topic": 249,
    "key": 4096,
    "key_base64": 5464,
    "since": 64,
    "until": 64,
}
MAX_RECORDS = 500  # records one selection may name
_FINGERPRINT = re.compile(r"[0-9a-f]{1,64}")
_RECORD = re.compile(r"(\d{1,10}):(\d{1,19})")


class FilterProblem(ValueError):
    """A filter value that cannot be used; the message names the field, not the value."""


@dataclass(frozen=True)
class UiFilter:
    """The filter fields as typed (empty ones None); ``topic`` None means failed_topic."""

    topic: str | None = None
    dead_reason: str | None = None
    error_class: str | None = None
    fingerprint: str | None = None
    original_topic: str | None = None
    key: str | None = None
    key_base64: str | None = None
    since: str | None = None
    until: str | None = None

    @classmethod
    def read(cls, values: dict[str, list[str]]) -> UiFilter:
        """From query or form fields (the first value of each); FilterProblem when too long."""
        found: dict[str, str | None] = {}
        for f in fields(cls):
            given = values.get(f.name) or [""]
            text = given[0].strip() if f.name != "key" else given[0]
            if len(text) > LIMITS[f.name]:
                raise FilterProblem(f"{f.name} is longer than {LIMITS[f.name]} characters")
            found[f.name] = text or None
        return cls(**found)

    def items(self) -> list[tuple[str, str]]:
        """The fields that are set, as ``(name, value)`` pairs (hidden inputs, links)."""
        return [(f.name, v) for f in fields(self) if (v := getattr(self, f.name)) is not None]

    def query(self, **extra: str) -> str:
        return urlencode([*self.items(), *extra.items()])

    def to_filter(self, now_ms: int) -> RecordFilter:
        if self.dead_reason is not None and self.dead_reason not in DEAD_REASONS:
            raise FilterProblem(f"dead_reason must be one of {', '.join(DEAD_REASONS)}")
        if self.fingerprint is not None and not _FINGERPRINT.fullmatch(self.fingerprint):
            raise FilterProblem("fingerprint is the hex id shown on the overview")
        try:
            key, contradictory = key_from(self.key, self.key_base64)
        except InvalidRequest as exc:
            raise FilterProblem(str(exc)) from None
        return RecordFilter(
            original_topic=self.original_topic,
            error_class=self.error_class,
            dead_reason=self.dead_reason,
            since_ms=instant("since", self.since, now_ms),
            until_ms=instant("until", self.until, now_ms),
            key=key,
            nothing=contradictory,
            fingerprint=self.fingerprint,
        )


def instant(name: str, text: str | None, now_ms: int) -> int | None:
    """Epoch ms of ``-1h`` / ``1h ago`` / ISO-8601 / epoch-ms digits; FilterProblem if none."""
    if text is None:
        return None
    if text.isascii() and text.isdigit():
        if len(text) > 16:
            raise FilterProblem(f"{name}: epoch milliseconds have at most 16 digits")
        return int(text)
    spec = text[1:].strip() + " ago" if text.startswith("-") else text
    try:
        return parse_instant(spec, now_ms)
    except TimeSpecError as exc:
        raise FilterProblem(f"{name}: {exc}") from None


def read_records(values: list[str]) -> frozenset[tuple[int, int]]:
    """``partition:offset`` values of a selection; FilterProblem for a malformed one, none,
    or more than ``MAX_RECORDS``."""
    if not values:
        raise FilterProblem("select at least one dead letter")
    if len(values) > MAX_RECORDS:
        raise FilterProblem(f"select at most {MAX_RECORDS} dead letters at once")
    out = set()
    for value in values:
        match = _RECORD.fullmatch(value)
        if match is None:
            raise FilterProblem("a selected record is not partition:offset")
        out.add((int(match.group(1)), int(match.group(2))))
    return frozenset(out)
