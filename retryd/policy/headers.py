"""The retryd message envelope: header names, encoding and decoding.

retryd headers are *replaced, never appended*, so a message does not grow hop by hop.
All values are UTF-8 text; numbers are decimal ASCII.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

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
ROUTE = "retryd_route"  # the error route a copy is on (retryd.policy.error_routes)
REPLAY_ID = "retryd_replay_id"
REPLAYED_FROM = "retryd_replayed_from"
PARKED = "retryd_parked"  # key_order = strict: a copy parked behind its key's chain

ERROR_MESSAGE_MAX_BYTES = 512
ERROR_CLASS_MAX_BYTES = 256
_FIXED_NAMES = frozenset({"retry_number", "retry_timestamp"})

DEAD_EXHAUSTED = "exhausted"
DEAD_NON_RETRYABLE = "non_retryable"
DEAD_MALFORMED = "malformed"
DEAD_ROUTED = "routed"  # an error route's dlt:<topic> sent it there
DEAD_REASONS = (DEAD_EXHAUSTED, DEAD_NON_RETRYABLE, DEAD_MALFORMED, DEAD_ROUTED)
ROUTE_MAX_BYTES = 200  # error_routes.MAX_NAME: a route name is an ASCII token

Headers = list[tuple[str, bytes | None]]

INT64_MAX = 2**63 - 1
_MAX_DIGITS = 19  # len(str(INT64_MAX))


def parse_uint(text: str) -> int | None:
    """A non-negative decimal integer that fits int64 (ASCII digits only, at most 19 of them),
    else None. Never raises: ``int()`` of an unbounded digit string does (Python's limit on
    int/str conversion, 4,300 digits), and costs quadratic time before that."""
    if 0 < len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit():
        value = int(text)
        if value <= INT64_MAX:
            return value
    return None


def is_retryd_header(name: object) -> bool:
    return isinstance(name, str) and (name in _FIXED_NAMES or name.startswith("retryd_"))


# --- Reading headers that nobody vetted -----------------------------------------------------
#
# Headers come from the Kafka client as a list of ``(str, bytes | None)`` tuples, but callers
# also pass ``str`` values, and anything can arrive from tests, Spark rows or a future client:
# bytes names, other types, items that are not pairs. The hot paths (``decode_tier_envelope``,
# ``user_headers``) handle the client's shape at full speed and fall back to ``clean_headers``
# for anything else; the other readers always go through ``clean_headers``.


def _name(raw: object) -> str | None:
    """A header name as text that UTF-8 can encode (so it can be produced and rendered)."""
    if isinstance(raw, str):
        if raw.isascii():
            return str.__str__(raw)
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates
            return raw.encode("utf-8", errors="replace").decode("utf-8")
        return str.__str__(raw)
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw).decode("utf-8", errors="replace")
    return None


def _value(raw: object) -> tuple[bool, bytes | None]:
    """``(usable, value as bytes or None)``."""
    if raw is None or type(raw) is bytes:
        return True, raw
    if isinstance(raw, str):
        return True, raw.encode("utf-8", errors="surrogatepass")  # lone surrogates: not UTF-8
    if isinstance(raw, bytes | bytearray | memoryview):
        return True, bytes(raw)
    return False, None


def _pair(item: object) -> tuple[object, object] | None:
    """``item`` as a (name, value) pair without touching a NULL slot.

    confluent-kafka's ``Message.headers()`` raises on a header name that is not UTF-8 the first
    time and, called again, returns its cached list in which that header's tuple holds a NULL
    name: reading the slot (unpacking, indexing, comparing) crashes the interpreter. The garbage
    collector's traversal skips NULL slots, so a tuple with fewer referents than items has one.
    """
    if type(item) is tuple:
        if len(item) != 2 or len(gc.get_referents(item)) != 2:
            return None
        return item[0], item[1]
    if type(item) is list and len(item) == 2:
        return item[0], item[1]
    return None


def _clean(headers: object) -> tuple[Headers, int]:
    """``(readable pairs, how many items were left out)``; never raises."""
    out: Headers = []
    if headers is None:
        return out, 0
    items: Sequence[object]
    if type(headers) is list or type(headers) is tuple:
        items = headers
    else:
        try:
            items = list(headers)  # type: ignore[call-overload]
        except Exception:
            return out, 1
    dropped = 0
    for item in items:
        pair = _pair(item)
        if pair is None:
            dropped += 1
            continue
        name = _name(pair[0])
        usable, value = _value(pair[1])
        if name is None or not usable:
            dropped += 1
            continue
        out.append((name, value))
    return out, dropped


def clean_headers(headers: object) -> Headers:
    """The readable ``(name, value)`` pairs of ``headers``, in order; never raises.

    Names become text UTF-8 can encode (bytes names decoded, invalid sequences and lone
    surrogates replaced); values become bytes or None (``str`` encoded). Items that are not
    pairs, names that are not text or bytes, values of other types are left out."""
    return _clean(headers)[0]


def message_headers(msg: Any) -> tuple[Headers, str | None]:
    """The headers of a consumed confluent-kafka message: ``(clean headers, None)``, or
    ``(what could be read, why some could not)``. Never raises.

    ``Message.headers()`` decodes names with ``PyUnicode_FromString`` and does not check the
    result: on a name that is not UTF-8 it raises ``SystemError`` (its ``__cause__`` the
    ``UnicodeDecodeError``) and keeps a list whose tuples for such names hold NULL; called
    again it returns that list. The readable headers are taken from it (``_pair`` skips the
    NULL tuples); call this once per message and keep the result."""
    try:
        found = msg.headers()
    except Exception as exc:
        problem = f"headers cannot be decoded: {type(exc).__name__}"
    else:
        if not found:
            return [], None
        # A call that returns usually gives the client's own shape (names decoded from valid
        # UTF-8, values bytes or None: nothing to clean, which cost ~1 µs per header). But it
        # can also return the list with a NULL slot for a name that is not UTF-8: the cached
        # list of an earlier call that raised, or a first call that returned with its
        # UnicodeDecodeError still pending (the next C call then raises SystemError). The
        # tuples are all pairs: one C call counts every tuple's referents (a NULL slot has
        # none), and raises if an error was left pending.
        try:
            whole = len(gc.get_referents(*found)) == 2 * len(found)
        except SystemError:
            whole = False
        if whole:
            return found, None
        problem = "headers cannot be decoded: a header name is not UTF-8"
    try:
        found, dropped = _clean(msg.headers())
    except Exception:
        return [], problem
    if dropped:
        problem = f"{dropped} header(s) dropped: their names are not UTF-8"
    return found, problem


def header_value(
    headers: Iterable[tuple[str, bytes | str | None]] | None, name: str
) -> bytes | None:
    """Last value of ``name`` (Kafka allows repeats; the last one wins), or None."""
    found: bytes | None = None
    for key, value in clean_headers(headers):
        if key == name:
            found = value
    return found


def user_headers(headers: Iterable[tuple[str, bytes | str | None]] | None) -> Headers:
    """Headers that belong to the application, in their original order (see ``clean_headers``
    for what is done with anything but ``(str, bytes | None)`` pairs)."""
    out: Headers = []
    if headers is None:
        return out
    if type(headers) is list or type(headers) is tuple:
        try:
            for key, value in headers:
                if key not in _FIXED_NAMES and not key.startswith("retryd_"):
                    if not key.isascii() or (value is not None and type(value) is not bytes):
                        break  # text or odd values, non-ASCII names: the careful path
                    out.append((key, value))
            else:
                return out
        except Exception:  # not a pair, a name that is not text
            pass
        out = []
    for key, value in clean_headers(headers):
        if key not in _FIXED_NAMES and not key.startswith("retryd_"):
            out.append((key, value))
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
    route: str | None = None  # the error route this copy is on (None: retry_sequence)

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
        route: str | None = None,
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
            route if route is not None else self.route,
        )


def envelope_for_source(topic: str, partition: int, offset: int, timestamp: int) -> Envelope:
    """Envelope of a message seen for the first time (on a main topic)."""
    return Envelope(topic, partition, offset, timestamp)


def retryd_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, bytes | None]:
    """The retryd headers of a record in one pass (the last of a repeated name wins)."""
    out: dict[str, bytes | None] = {}
    if headers is None:
        return out
    if type(headers) is list or type(headers) is tuple:
        try:
            for key, value in headers:
                if key in _FIXED_NAMES or key.startswith("retryd_"):
                    if value is not None and type(value) is not bytes:
                        break  # the careful path
                    out[key] = value
            else:
                return out
        except Exception:  # not a pair, a name that is not text
            pass
        out = {}
    for key, value in clean_headers(headers):
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
    value = parse_uint(text)
    if value is None:
        raise HeaderError(
            f"header {name}={text[:40]!r} is not a non-negative decimal integer below 2**63"
        )
    return value


def decode_tier_envelope(headers: Sequence[tuple[str, bytes | None]] | None) -> Envelope:
    """Strictly decode a tier message's envelope; raises HeaderError when unusable.

    ``retryd_original_topic`` must be a valid Kafka topic name: it is echoed to HTTP handlers
    and used as a metric-free routing fact, so anything else (non-ASCII text, control bytes)
    makes the record malformed rather than reaching a handler.
    """
    found = retryd_headers(headers)
    retry_number = _int(found, RETRY_NUMBER, required=True)
    assert retry_number is not None
    if retry_number < 1 and PARKED not in found:  # a parked record may not have failed yet
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
        _route(found),
    )


def _route(found: dict[str, bytes | None]) -> str | None:
    """The error route a tier record is on; a value that is not a short ASCII token (no route
    of any plan is named so) is no route: the record continues on retry_sequence."""
    raw = found.get(ROUTE)
    if raw is None or not 0 < len(raw) <= ROUTE_MAX_BYTES or not raw.isascii():
        return None
    text = raw.decode("ascii")
    return text if text.isprintable() and " " not in text else None


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
    if env.route:
        out.append((ROUTE, truncate_utf8(env.route, ROUTE_MAX_BYTES)))
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
    """Every retryd header that parses, for browsing and analytics; bad values become None
    (integers: a non-negative decimal that fits int64, see ``parse_uint``). Never raises: the
    last occurrence of a repeated name wins, whatever it holds."""
    out: dict[str, str | int | None] = {}
    for key, raw in clean_headers(headers):
        if not is_retryd_header(key):
            continue
        text: str | None
        try:
            text = raw.decode("utf-8") if raw is not None else None
        except UnicodeDecodeError:
            text = None
        if key in _INT_HEADERS:
            out[key] = parse_uint(text) if text is not None else None
        else:
            out[key] = text
    return out


ENVELOPE_FIELDS = tuple(f.name for f in fields(Envelope))
