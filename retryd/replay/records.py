"""How failed records are matched by filters and shown to people (previews, cursors)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any

from retryd.policy import headers as h
from retryd.policy.fingerprint import fingerprint, fingerprint_id
from retryd.policy.foreign import ForeignFormat, strip_foreign, to_dead_letter_fields
from retryd.policy.oversize import DEAD_TOO_LARGE
from retryd.replay.errors import InvalidRequest

PREVIEW_DEFAULT = 1024
PREVIEW_MAX = 1_048_576
# Every ``retryd_dead_reason`` a failed record can carry: the routing reasons of the envelope
# (``retryd.policy.headers.DEAD_REASONS``, ``routed`` included) and the oversize fallback.
# Every filter (API, CLI) is derived from it, so a reason the worker learns is never refused.
DEAD_REASONS: tuple[str, ...] = (*h.DEAD_REASONS, DEAD_TOO_LARGE)


@dataclass(frozen=True, slots=True)
class Coord:
    """Where a failed record lives; ``str()`` is the ledger key and ``retryd_replayed_from``."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"

    @classmethod
    def parse(cls, text: str) -> Coord:
        topic, _, rest = text.rpartition("/")
        topic, _, part = topic.rpartition("/")
        partition, offset = h.parse_uint(part), h.parse_uint(rest)
        if not topic or partition is None or offset is None:
            raise ValueError(f"{text[:300]!r} is not topic/partition/offset")
        return cls(topic, partition, offset)


@dataclass(frozen=True, slots=True)
class FailedRecord:
    """One record of ``failed_topic`` with its retryd envelope decoded leniently.

    ``headers`` may hold anything (see ``retryd.policy.headers.clean_headers``): nothing here
    raises on it. ``headers_error`` says why some or all of the record's headers could not be
    read from the Kafka client (names that are not UTF-8). ``format`` says who wrote the dead
    letter: another system's (``foreign_dead_letters``) headers are mapped onto the envelope's
    fields (``retryd.policy.foreign``), so every reader sees one shape."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    headers_error: str | None = None
    format: ForeignFormat = ForeignFormat.RETRYD

    @property
    def coord(self) -> Coord:
        return Coord(self.topic, self.partition, self.offset)

    @property
    def nothing_to_replay(self) -> str | None:
        """Why a replay of this record would send nothing of it, or None. A share group's
        dead-letter queue holds the headers only (no key, no value) unless the group copies
        records (Kafka 4.4 writes them so by default): a copy would be an empty record."""
        if self.format is ForeignFormat.SHARE_GROUP and self.key is None and self.value is None:
            return (
                f"dead letter {self.coord} holds no key and no value: its share group "
                "dead-letters headers only (set the group config "
                "errors.deadletterqueue.copy.record.enable=true to keep the records); "
                "there is nothing to replay"
            )
        return None

    @property
    def envelope(self) -> dict[str, str | int | None]:
        if self.format is ForeignFormat.RETRYD:
            return h.decode_lenient(self.headers)
        return to_dead_letter_fields(self.format, self.headers, timestamp=self.timestamp).fields

    @property
    def mapping_problems(self) -> list[str]:
        """What could not be read of a foreign dead letter's headers (empty for retryd's)."""
        if self.format is ForeignFormat.RETRYD:
            return []
        found = to_dead_letter_fields(self.format, self.headers, timestamp=self.timestamp)
        return list(found.problems)

    @property
    def kept_headers(self) -> h.Headers:
        """The application's headers, which a replayed copy keeps: every retryd header and
        the foreign system's dead-letter headers left out."""
        return strip_foreign(self.format, h.user_headers(h.clean_headers(self.headers)))

    def text_header(self, name: str) -> str | None:
        value = self.envelope.get(name)
        return value if isinstance(value, str) else None

    @property
    def original_topic(self) -> str | None:
        return self.text_header(h.ORIGINAL_TOPIC) or None

    @property
    def original_partition(self) -> int | None:
        value = self.envelope.get(h.ORIGINAL_PARTITION)
        return value if isinstance(value, int) else None


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """Every given field must match; ``None`` matches anything. Times are epoch ms of the
    failed record's Kafka timestamp (when it was dead-lettered), ``until_ms`` exclusive."""

    original_topic: str | None = None
    error_class: str | None = None
    dead_reason: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    key: bytes | None = None
    partition: int | None = None
    nothing: bool = False  # contradictory filters (two different keys): matches no record
    # The error's fingerprint id (``retryd.policy.fingerprint.fingerprint_id`` of the error
    # class and the message's template), as the explorer's overview groups dead letters.
    fingerprint: str | None = None
    # Exactly these (partition, offset) records (the explorer's selection), when given.
    records: frozenset[tuple[int, int]] | None = None

    def matches(self, rec: FailedRecord) -> bool:
        if self.nothing:
            return False
        if self.partition is not None and rec.partition != self.partition:
            return False
        if self.records is not None and (rec.partition, rec.offset) not in self.records:
            return False
        if self.since_ms is not None and rec.timestamp < self.since_ms:
            return False
        if self.until_ms is not None and rec.timestamp >= self.until_ms:
            return False
        if self.key is not None and rec.key != self.key:
            return False
        env = rec.envelope
        checks = (
            (self.original_topic, h.ORIGINAL_TOPIC),
            (self.error_class, h.ERROR_CLASS),
            (self.dead_reason, h.DEAD_REASON),
        )
        if not all(want is None or env.get(name) == want for want, name in checks):
            return False
        return self.fingerprint is None or fingerprint_of(env) == self.fingerprint

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("original_topic", "error_class", "dead_reason", "since_ms", "until_ms"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.partition is not None:
            out["partition"] = self.partition
        if self.key is not None:
            out["key"] = render_bytes(self.key, 256)
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint
        if self.records is not None:
            out["records"] = len(self.records)
        return out


def fingerprint_of(envelope: dict[str, str | int | None]) -> str:
    """The fingerprint id of a dead letter's error class and message."""
    cls = envelope.get(h.ERROR_CLASS)
    msg = envelope.get(h.ERROR_MESSAGE)
    return fingerprint_id(
        cls if isinstance(cls, str) else None, fingerprint(msg if isinstance(msg, str) else None)
    )


def key_from(text: str | None, b64: str | None) -> tuple[bytes | None, bool]:
    """A key filter from text (UTF-8) and/or base64: ``(key, contradictory)``. Both given
    must name the same bytes, else the filter matches nothing (it is not an error)."""
    keys: list[bytes] = []
    if b64 is not None:
        try:
            keys.append(base64.b64decode(b64, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequest("key_base64 is not valid base64") from exc
    if text is not None:
        keys.append(text.encode("utf-8", errors="surrogatepass"))
    if not keys:
        return None, False
    return keys[0], len(set(keys)) > 1


def render_bytes(data: bytes | None, limit: int) -> dict[str, Any]:
    """Text when the whole value is UTF-8, else base64; at most ``limit`` bytes of it shown."""
    if data is None:
        return {"encoding": None, "data": None, "size": 0, "truncated": False}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        part = data[:limit]
        return {
            "encoding": "base64",
            "data": base64.b64encode(part).decode("ascii"),
            "size": len(data),
            "truncated": len(part) < len(data),
        }
    if len(data) <= limit:
        return {"encoding": "utf-8", "data": text, "size": len(data), "truncated": False}
    cut = data[:limit].decode("utf-8", errors="ignore")
    return {"encoding": "utf-8", "data": cut, "size": len(data), "truncated": True}


def render_record(rec: FailedRecord, preview_bytes: int) -> dict[str, Any]:
    """JSON-ready view: decoded retryd headers (a foreign dead letter's mapped onto them),
    the headers a replay keeps, key and value previews."""
    user = [
        {"name": name, **render_bytes(value, min(preview_bytes, 4096))}
        for name, value in rec.kept_headers
    ]
    return {
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "timestamp": rec.timestamp,
        "coordinate": str(rec.coord),
        "retryd": rec.envelope,
        "headers": user,
        "headers_error": rec.headers_error,
        "format": rec.format.value,
        "mapping_problems": rec.mapping_problems,
        "key": render_bytes(rec.key, preview_bytes),
        "value": render_bytes(rec.value, preview_bytes),
    }


def encode_cursor(positions: dict[int, int]) -> str:
    """Opaque cursor: urlsafe base64 of ``{partition: next offset}``."""
    raw = json.dumps({str(p): o for p, o in sorted(positions.items())}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode("ascii").rstrip("=")


# A cursor is exactly what ``encode_cursor`` writes: a flat JSON object of partition -> offset.
# Checking that shape before parsing keeps hostile input (deep nesting, huge numbers, megabytes)
# away from the JSON parser, whose recursion would otherwise fail with a 500.
MAX_CURSOR_CHARS = 65_536
_CURSOR_SHAPE = re.compile(rb'\{(?:"\d{1,10}":\d{1,19}(?:,"\d{1,10}":\d{1,19})*)?\}')


def decode_cursor(cursor: str) -> dict[int, int]:
    """The positions of a cursor from ``encode_cursor``; InvalidRequest for anything else."""
    bad = InvalidRequest("cursor is not valid: pass back a next_cursor exactly as returned")
    if len(cursor) > MAX_CURSOR_CHARS or not cursor.isascii():
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError) as exc:
        raise bad from exc
    if _CURSOR_SHAPE.fullmatch(raw) is None:
        raise bad
    data = json.loads(raw)
    out: dict[int, int] = {}
    for part, offset in data.items():
        if int(part) >= 2**31 or not 0 <= offset < 2**63:
            raise bad
        out[int(part)] = offset
    return out
