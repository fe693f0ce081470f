"""The retryd message envelope: header names, encoding and decoding.

retryd headers are *replaced, never appended*, so a message does not grow hop by hop.
All values are UTF-8 text; numbers are decimal ASCII.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace

from retryd.errors import HeaderError

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
REPLAY_ID = "retryd_replay_id"
REPLAYED_FROM = "retryd_replayed_from"

ERROR_MESSAGE_MAX_BYTES = 512

DEAD_EXHAUSTED = "exhausted"
DEAD_NON_RETRYABLE = "non_retryable"
DEAD_MALFORMED = "malformed"
DEAD_REASONS = (DEAD_EXHAUSTED, DEAD_NON_RETRYABLE, DEAD_MALFORMED)

Headers = list[tuple[str, bytes | None]]


def is_retryd_header(name: str) -> bool:
    return name in (RETRY_NUMBER, RETRY_TIMESTAMP) or name.startswith("retryd_")


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
        if not is_retryd_header(key):
            out.append((key, value.encode() if isinstance(value, str) else value))
    return out


def truncate_utf8(text: str, max_bytes: int = ERROR_MESSAGE_MAX_BYTES) -> bytes:
    """UTF-8 encode, cutting at a character boundary so the result stays valid UTF-8."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return data
    return data[:max_bytes].decode("utf-8", errors="ignore").encode("utf-8")


@dataclass(frozen=True, slots=True)
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

    def failed_again(
        self,
        *,
        retry_number: int,
        due_ms: int | None,
        now_ms: int,
        error_class: str,
        error_message: str,
        dead_reason: str | None = None,
    ) -> Envelope:
        return replace(
            self,
            retry_number=retry_number,
            retry_timestamp=due_ms,
            first_failure_timestamp=self.first_failure_timestamp or now_ms,
            error_class=error_class,
            error_message=error_message,
            dead_reason=dead_reason,
        )


def envelope_for_source(topic: str, partition: int, offset: int, timestamp: int) -> Envelope:
    """Envelope of a message seen for the first time (on a main topic)."""
    return Envelope(topic, partition, offset, timestamp)


def _text(
    headers: Sequence[tuple[str, bytes | None]] | None, name: str, *, required: bool
) -> str | None:
    raw = header_value(headers, name)
    if raw is None:
        if required:
            raise HeaderError(f"header {name} is missing")
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"header {name} is not valid UTF-8") from exc


def _int(
    headers: Sequence[tuple[str, bytes | None]] | None, name: str, *, required: bool
) -> int | None:
    text = _text(headers, name, required=required)
    if text is None:
        return None
    if not text.isascii() or not text.isdigit():
        raise HeaderError(f"header {name}={text[:40]!r} is not a non-negative decimal integer")
    return int(text)


def decode_tier_envelope(headers: Sequence[tuple[str, bytes | None]] | None) -> Envelope:
    """Strictly decode a tier message's envelope; raises HeaderError when unusable."""
    retry_number = _int(headers, RETRY_NUMBER, required=True)
    assert retry_number is not None
    if retry_number < 1:
        raise HeaderError(f"header {RETRY_NUMBER}={retry_number} must be >= 1 on a tier message")
    topic = _text(headers, ORIGINAL_TOPIC, required=True)
    partition = _int(headers, ORIGINAL_PARTITION, required=True)
    offset = _int(headers, ORIGINAL_OFFSET, required=True)
    assert topic is not None and partition is not None and offset is not None
    if not topic:
        raise HeaderError(f"header {ORIGINAL_TOPIC} is empty")
    return Envelope(
        original_topic=topic,
        original_partition=partition,
        original_offset=offset,
        original_timestamp=_int(headers, ORIGINAL_TIMESTAMP, required=False) or 0,
        retry_number=retry_number,
        retry_timestamp=_int(headers, RETRY_TIMESTAMP, required=True),
        first_failure_timestamp=_int(headers, FIRST_FAILURE_TIMESTAMP, required=False),
        error_class=_text(headers, ERROR_CLASS, required=False),
        error_message=_text(headers, ERROR_MESSAGE, required=False),
    )


def encode_envelope(env: Envelope) -> Headers:
    """retryd headers for a routed copy (tier or failed topic)."""
    out: Headers = []

    def put(name: str, value: object) -> None:
        if value is not None:
            out.append((name, str(value).encode("utf-8")))

    put(RETRY_NUMBER, env.retry_number)
    put(RETRY_TIMESTAMP, env.retry_timestamp)
    put(ORIGINAL_TOPIC, env.original_topic)
    put(ORIGINAL_PARTITION, env.original_partition)
    put(ORIGINAL_OFFSET, env.original_offset)
    put(ORIGINAL_TIMESTAMP, env.original_timestamp)
    put(FIRST_FAILURE_TIMESTAMP, env.first_failure_timestamp)
    put(ERROR_CLASS, env.error_class)
    if env.error_message is not None:
        out.append((ERROR_MESSAGE, truncate_utf8(env.error_message)))
    put(DEAD_REASON, env.dead_reason)
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
