"""Points in time given on a command line: ISO-8601 or relative to now (pure logic).

Accepted forms, for ``--since`` / ``--until`` and any other option that names an instant:

- ISO-8601 date or date-time: ``2024-05-01``, ``2024-05-01T10:00``, ``2024-05-01 10:00:00Z``,
  ``2024-05-01T12:00:00.250+02:00``. A value without a UTC offset is UTC: jobs run on hosts in
  any time zone and must mean the same instant everywhere.
- Relative, meaning "that long before now": ``90s``, ``30m``, ``2h``, ``7d``, ``1w``, compounds
  such as ``1h30m``, optionally followed by ``ago`` (``2h ago``).
- ``now``.

The current time is a parameter, so callers resolve every option of one command against the
same instant and tests need no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from retryd.errors import TimeSpecError

UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
# Longest unit names first so "ms" is not read as "m" followed by garbage.
_PART_RE = re.compile(r"(\d+)\s*(ms|s|m|h|d|w)", re.ASCII)
_RELATIVE_RE = re.compile(r"^(?:\d+\s*(?:ms|s|m|h|d|w)\s*)+(?:ago)?$", re.ASCII)
# Datetimes Python (and Spark) can represent, as epoch milliseconds.
MIN_MS = int(datetime(1970, 1, 1, tzinfo=UTC).timestamp() * 1000)
MAX_MS = int(datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC).timestamp() * 1000)
FORMS = "ISO-8601 (2024-05-01, 2024-05-01T10:00:00Z) or relative (30m, 2h, 7d, 1h30m ago)"
# The shape of the accepted forms, for the HTTP API's schema (a value of this shape may still be
# refused: a 13th month, a time before 1970).
TIME_PATTERN = (
    r"^(now|([0-9]{1,9} ?(ms|s|m|h|d|w) ?)+(ago)?|"
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}(:[0-9]{2}(:[0-9]{2}([.][0-9]{1,6})?)?)?"
    r"(Z|[+-][0-9]{2}:?[0-9]{2})?)?)$"
)


def parse_duration(text: str) -> int:
    """Milliseconds of a duration such as ``2h``, ``1h30m`` or ``500ms``."""
    cleaned = text.strip().lower()
    if cleaned.endswith("ago"):
        cleaned = cleaned[: -len("ago")].rstrip()
    if not cleaned or not _RELATIVE_RE.match(cleaned):
        raise TimeSpecError(f"invalid duration {text!r}: expected e.g. 30m, 2h, 7d or 1h30m")
    return sum(int(n) * UNIT_MS[unit] for n, unit in _PART_RE.findall(cleaned))


def parse_instant(text: str, now_ms: int) -> int:
    """Epoch milliseconds (UTC) of an ISO-8601 or relative time; ``now_ms`` anchors ``2h``."""
    cleaned = text.strip()
    if not cleaned:
        raise TimeSpecError(f"empty time: expected {FORMS}")
    lowered = cleaned.lower()
    if lowered == "now":
        return now_ms
    if _RELATIVE_RE.match(lowered):
        at = now_ms - parse_duration(lowered)
        if at < MIN_MS:
            raise TimeSpecError(f"{text!r} reaches before 1970-01-01")
        return at
    try:
        parsed = datetime.fromisoformat(cleaned)
    except ValueError:
        raise TimeSpecError(f"invalid time {text!r}: expected {FORMS}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    at = (parsed - epoch) // timedelta(milliseconds=1)
    if not MIN_MS <= at <= MAX_MS:
        raise TimeSpecError(f"{text!r} is before 1970-01-01")
    return at


def format_instant(epoch_ms: int) -> str:
    """``2024-05-01T10:00:00.250Z``: how an instant is shown in output (milliseconds kept)."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    millis = epoch_ms % 1000
    return f"{text}.{millis:03d}Z" if millis else f"{text}Z"


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """``[since, until)`` in epoch milliseconds; a side that is None is open."""

    since_ms: int | None = None
    until_ms: int | None = None

    @property
    def is_open(self) -> bool:
        return self.since_ms is None and self.until_ms is None

    def contains(self, epoch_ms: int) -> bool:
        if self.since_ms is not None and epoch_ms < self.since_ms:
            return False
        return self.until_ms is None or epoch_ms < self.until_ms

    def describe(self) -> str:
        since = "the beginning" if self.since_ms is None else format_instant(self.since_ms)
        until = "now" if self.until_ms is None else format_instant(self.until_ms)
        return f"[{since}, {until})"


def parse_window(since: str | None, until: str | None, now_ms: int) -> TimeWindow:
    """Both ends against one ``now``; ``since`` must come before ``until``."""
    since_ms = None if since is None else parse_instant(since, now_ms)
    until_ms = None if until is None else parse_instant(until, now_ms)
    if since_ms is not None and until_ms is not None and since_ms >= until_ms:
        raise TimeSpecError(
            f"--since {since!r} ({format_instant(since_ms)}) is not before "
            f"--until {until!r} ({format_instant(until_ms)})"
        )
    return TimeWindow(since_ms, until_ms)
