"""The retryd message envelope: header names, encoding and decoding.

retryd headers are *replaced, never appended*, so a message does not grow hop by hop.
All values are UTF-8 text; numbers are decimal ASCII.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from retryd.errors import HeaderError
from retryd.policy.sequence import is_topic_name

RETRY_NUMBER = "retry_number"
RETRY_TIMESTAMP = "retry_timestamp"
ORIGINAL_TOPIC = "retryd_original_topic"
ORIGINAL_PARTITION = "retryd_original_partition"
ORIGINAL_OFFSET = "retryd_original_offset"
ORIGINAL_TIMESTAMP = "retryd_original_timestamp"
FIRST_FAILURE_TIMESTAMP = "retryd_first_failure_timestamp"
ERROR_CLASS = "retryd_error_class"
ERROR_MESSAGE = "retryd_error_message"
DEAD_REASON = "retryd_dead_reason"
GROUP = "retryd_group"
REPLAY_ID = "retryd_replay_id"
REPLAYED_FROM = "retryd_replayed_from"

ERROR_MESSAGE_MAX_BYTES = 512
ERROR_CLASS_MAX_BYTES = 256
_FIXED_NAMES = frozenset({"retry_number", "retry_timestamp"})

DEAD_EXHAUSTED = "exhausted"
DEAD_NON_RETRYABLE = "non_retryable"
DEAD_MALFORMED = "malformed"
DEAD_REASONS = (DEAD_EXHAUSTED, DEAD_NON_RETRYABLE, DEAD_MALFORMED)

Headers = list[tuple[str, bytes | None]]


def is_retryd_header(name: str) -> bool:
    return name in _FIXED_NAMES or name.startswith("retryd_")


def header_value(
    headers: Iterable[tuple[str, bytes | str | None]] | None, name: str
) -> bytes | None:
    """Last value of ``name`` (Kafka allows repeats; the last one wins), or None."""
    found: bytes | None = None
    for key, value in headers or ():
        if key == name:
            found = value.encode() if isinstance(value, str) else value
    return found


def user_headers(headers: Iterable[tuple[str, bytes | str | None]] | None) -> Headers:
    """Headers that belong to the application, in their original order."""
    out: Headers = []
    for key, value in headers or ():
        if key not in _FIXED_NAMES and not key.startswith("retryd_"):
            out.append((key, value.encode() if isinstance(value, str) else value))
    return out


def truncate_utf8(text: str, max_bytes: int = ERROR_MESSAGE_MAX_BYTES) -> bytes:
    """UTF-8 encode, cutting at a character boundary so the result stays valid UTF-8."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return data
    return data[:max_bytes].decode("utf-8", errors="ignore").encode("utf-8")


# Not frozen: a frozen dataclass costs ~2 µs to build (object.__setattr__ per field) and
# one is built per failed record. Treat instances as values: never mutate one.
@dataclass(slots=True)
class Envelope:
    """retryd's view of a message: where it first entered and what has happened to it."""

    original_topic: str
    original_partition: int
    original_offset: int
    original_timestamp: int
    retry_number: int = 0
    retry_timestamp: int | None = None
    first_failure_timestamp: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    dead_reason: str | None = None
    group: str | None = None  # the consumer group that routed this copy

    def failed_again(
        self,
        *,
        retry_number: int,
        due_ms: int | None,
        now_ms: int,
        error_class: str,
        error_message: str,
        dead_reason: str | None = None,
        group: str | None = None,
    ) -> Envelope:
        # Positional construction: dataclasses.replace costs several times more, per failure.
        return Envelope(
            self.original_topic,
            self.original_partition,
            self.original_offset,
            self.original_timestamp,
            retry_number,
            due_ms,
            self.first_failure_timestamp or now_ms,
            error_class,
            error_message,
            dead_reason,
            group if group is not None else self.group,
        )


def envelope_for_source(topic: str, partition: int, offset: int, timestamp: int) -> Envelope:
    """Envelope of a message seen for the first time (on a main topic)."""
    return Envelope(topic, partition, offset, timestamp)


def retryd_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, bytes | None]:
    """The retryd headers of a record in one pass (the last of a repeated name wins)."""
    out: dict[str, bytes | None] = {}
    for key, value in headers or ():
        if key in _FIXED_NAMES or key.startswith("retryd_"):
            out[key] = value
    return out


def _text(found: dict[str, bytes | None], name: str, *, required: bool) -> str | None:
    raw = found.get(name)
    if raw is None:
        if required:
            raise HeaderError(f"header {name} is missing")
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"header {name} is not valid UTF-8") from exc


def _int(found: dict[str, bytes | None], name: str, *, required: bool) -> int | None:
    text = _text(found, name, required=required)
    if text is None:
        return None
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise HeaderError(f"header {name}={text[:40]!r} is not a non-negative decimal integer")
    return int(text)


def decode_tier_envelope(headers: Sequence[tuple[str, bytes | None]] | None) -> Envelope:
    """Strictly decode a tier message's envelope; raises HeaderError when unusable.

    ``retryd_original_topic`` must be a valid Kafka topic name: it is echoed to HTTP handlers
    and used as a metric-free routing fact, so anything else (non-ASCII text, control bytes)
    makes the record malformed rather than reaching a handler.
    """
    found = retryd_headers(headers)
    retry_number = _int(found, RETRY_NUMBER, required=True)
    assert retry_number is not None
    if retry_number < 1:
        raise HeaderError(f"header {RETRY_NUMBER}={retry_number} must be >= 1 on a tier message")
    topic = _text(found, ORIGINAL_TOPIC, required=True)
    partition = _int(found, ORIGINAL_PARTITION, required=True)
    offset = _int(found, ORIGINAL_OFFSET, required=True)
    assert topic is not None and partition is not None and offset is not None
    if not topic:
        raise HeaderError(f"header {ORIGINAL_TOPIC} is empty")
    if not is_topic_name(topic):
        raise HeaderError(f"header {ORIGINAL_TOPIC}={topic[:60]!r} is not a Kafka topic name")
    return Envelope(
        topic,
        partition,
        offset,
        _int(found, ORIGINAL_TIMESTAMP, required=False) or 0,
        retry_number,
        _int(found, RETRY_TIMESTAMP, required=True),
        _int(found, FIRST_FAILURE_TIMESTAMP, required=False),
        _text(found, ERROR_CLASS, required=False),
        _text(found, ERROR_MESSAGE, required=False),
        None,
        _group(found),
    )


def _group(found: dict[str, bytes | None]) -> str | None:
    """The routing group; an undecodable value is a foreign group, never a crash."""
    raw = found.get(GROUP)
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace")


def encode_envelope(env: Envelope) -> Headers:
    """retryd headers for a routed copy (tier or failed topic)."""
    out: Headers = [
        (RETRY_NUMBER, b"%d" % env.retry_number),
    ]
    if env.retry_timestamp is not None:
        out.append((RETRY_TIMESTAMP, b"%d" % env.retry_timestamp))
    out.append((ORIGINAL_TOPIC, env.original_topic.encode("utf-8", errors="replace")))
    out.append((ORIGINAL_PARTITION, b"%d" % env.original_partition))
    out.append((ORIGINAL_OFFSET, b"%d" % env.original_offset))
    out.append((ORIGINAL_TIMESTAMP, b"%d" % env.original_timestamp))
    if env.first_failure_timestamp is not None:
        out.append((FIRST_FAILURE_TIMESTAMP, b"%d" % env.first_failure_timestamp))
    if env.error_class is not None:
        out.append((ERROR_CLASS, truncate_utf8(env.error_class, ERROR_CLASS_MAX_BYTES)))
    if env.error_message is not None:
        out.append((ERROR_MESSAGE, truncate_utf8(env.error_message)))
    if env.dead_reason is not None:
        out.append((DEAD_REASON, env.dead_reason.encode("ascii")))
    if env.group:
        out.append((GROUP, env.group.encode("utf-8", errors="replace")))
    return out


def routed_headers(
    source: Iterable[tuple[str, bytes | str | None]] | None, env: Envelope
) -> Headers:
    """User headers of ``source`` kept in order, every retryd header replaced by ``env``'s."""
    return user_headers(source) + encode_envelope(env)


def replay_headers(
    source: Iterable[tuple[str, bytes | str | None]] | None, *, replay_id: str, replayed_from: str
) -> Headers:
    """Headers of a replayed copy: a fresh retry sequence, so every retryd header goes."""
    return [
        *user_headers(source),
        (REPLAY_ID, replay_id.encode("utf-8")),
        (REPLAYED_FROM, replayed_from.encode("utf-8")),
    ]


_INT_HEADERS = {
    RETRY_NUMBER,
    RETRY_TIMESTAMP,
    ORIGINAL_PARTITION,
    ORIGINAL_OFFSET,
    ORIGINAL_TIMESTAMP,
    FIRST_FAILURE_TIMESTAMP,
}


def decode_lenient(
    headers: Iterable[tuple[str, bytes | str | None]] | None,
) -> dict[str, str | int | None]:
    """Every retryd header that parses, for browsing and analytics; bad values become None."""
    out: dict[str, str | int | None] = {}
    for key, value in headers or ():
        if not is_retryd_header(key):
            continue
        raw = value.encode() if isinstance(value, str) else value
        text: str | None
        try:
            text = raw.decode("utf-8") if raw is not None else None
        except UnicodeDecodeError:
            text = None
        if key in _INT_HEADERS:
            out[key] = int(text) if text is not None and text.isascii() and text.isdigit() else None
        else:
            out[key] = text
    return out


ENVELOPE_FIELDS = tuple(f.name for f in fields(Envelope))
