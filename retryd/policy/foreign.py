"""Dead letters written by other systems, read as if retryd had written them.

A topic named in ``foreign_dead_letters`` holds records another system dead-lettered. Their
headers are mapped onto the fields retryd's own dead letters carry (``retryd_original_topic``
and the rest, see ``retryd.policy.headers``), so browsing, filters, replays and the Spark
report treat them alike. Nothing here raises: a header that is missing, of the wrong length or
not UTF-8 leaves its field None and adds one line naming it to ``ForeignFields.problems``
(text that is not UTF-8 is never shown with replacement characters: a guess at what it said
would pass for what the other system wrote).

Where each mapping comes from (the exact encodings were read in these sources):

* ``spring``: Spring for Apache Kafka, ``org.springframework.kafka.support.KafkaHeaders``
  (``DLT_ORIGINAL_TOPIC = "kafka_dlt-original-topic"`` etc., ``PREFIX = "kafka_"``) and
  ``org.springframework.kafka.listener.DeadLetterPublishingRecoverer``
  (``maybeAddOriginalHeaders``): topic, timestamp type and consumer group as UTF-8 text; the
  partition as a 4-byte big-endian int (``ByteBuffer.allocate(Integer.BYTES).putInt``), the
  offset and the timestamp as 8-byte big-endian longs (``putLong``): the same in every version
  read, from 2.2's direct ``RecordHeader``s to the current header suppliers. With the default
  ``appendOriginalHeaders = true`` a record dead-lettered again (e.g. through Spring's retry
  topics) carries each "original" header once per hop: the first one names where the record
  first entered, which is retryd's meaning of "original". The exception headers
  (``addExceptionInfoHeaders``: ``kafka_dlt-exception-fqcn``, ``-exception-cause-fqcn``,
  ``-exception-message``, ``-exception-stacktrace``, and ``kafka_dlt-key-exception-*`` for a
  key that failed to deserialize) are UTF-8 text, previous ones removed by default
  (``stripPreviousExceptionHeaders``): the last one wins. Spring's non-blocking retries
  (``DeadLetterPublishingRecovererFactory``) stamp every record they forward, the DLT's
  included, with ``retry_topic-attempts`` = the forwarded record's attempt number + 1, one byte
  in older versions (``BigInteger.toByteArray``) or a 4-byte big-endian int (``getAttempts``
  reads both): on a DLT record it is the deliveries made + 1, so retries made = value - 2.
* ``karafka``: Karafka's DLQ dispatch (``build_dlq_message`` of its DLQ strategies): the
  original headers merged with ``source_topic``, ``source_partition``, ``source_offset``,
  ``source_consumer_group``, ``source_attempts`` (attempts made) and ``source_trace_id``, every
  value a Ruby string (decimal numbers). Karafka writes no exception headers.
* ``connect``: Apache Kafka Connect, ``org.apache.kafka.connect.runtime.errors.
  DeadLetterQueueReporter`` (``populateContextHeaders``, with
  ``errors.deadletterqueue.context.headers.enable=true``): ``__connect.errors.`` + ``topic``,
  ``partition``, ``offset`` (decimal text, ``-1`` when unknown), ``connector.name``,
  ``task.id``, ``stage``, ``class.name``, ``exception.class.name``, ``exception.message``,
  ``exception.stacktrace``, all UTF-8; a header already present is kept (the first wins).
  The DLQ record keeps the original record's timestamp. A sink task's consumer group is
  ``connect-<connector name>`` unless overridden (``consumer.override.group.id``).
* ``share_group``: Apache Kafka 4.4 share groups' dead-letter queues (KIP-1191), read in the
  broker's code, ``org.apache.kafka.server.share.dlq.ShareGroupDLQStateManager``
  (``headers(offset)``, whose constants the broker's ShareConsumerDLQTest calls the wire
  contract of DLQ records):
  ``__dlq.errors.topic`` (the topic name, or its topic id when the name was not found),
  ``__dlq.errors.partition``, ``__dlq.errors.offset``, ``__dlq.errors.group``,
  ``__dlq.errors.delivery.count`` (optional) and ``__dlq.errors.message`` (optional: the
  ``ShareGroupDLQThrowable`` message, "Offset rejected by client." or "Offset delivery count
  exceeded the threshold."), all UTF-8 with decimal numbers, in that order. The broker copies
  key and value only with the group config ``errors.deadletterqueue.copy.record.enable=true``
  (default false: headers only, null key and value), never the original headers, and stamps
  the DLQ write time, so there is no original timestamp. A real 4.4.0 broker writes exactly
  this (tests/integration/test_share_group_dlq.py): delivery count 1 for a rejection, the
  group's ``share.delivery.count.limit`` for a record archived at the limit.

The dead reason stays within retryd's vocabulary and is given only where the source says it:
a share group's rejection is ``non_retryable`` and its delivery limit ``exhausted``; Karafka
dispatches once its retries ran out (``exhausted``); a Connect converter stage or a Spring
``DeserializationException`` is ``malformed``; anything else is None (unknown).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from retryd.policy import headers as h
from retryd.policy.sequence import is_topic_name
from retryd.policy.tables import table_from_value

AUTO: Final = "auto"


class ForeignFormat(enum.StrEnum):
    """Who wrote a dead letter (``retryd``: retryd itself)."""

    RETRYD = "retryd"
    SPRING = "spring"
    KARAFKA = "karafka"
    CONNECT = "connect"
    SHARE_GROUP = "share_group"


# What a topic of foreign_dead_letters is configured as: one format, or detected per record.
TopicFormat = ForeignFormat | Literal["auto"]
FORMAT_NAMES: tuple[str, ...] = (*(f.value for f in ForeignFormat if f.value != "retryd"), AUTO)

# --- Spring for Apache Kafka (KafkaHeaders) ---------------------------------------------------
SPRING_PREFIX = "kafka_dlt-"
SPRING_TOPIC = "kafka_dlt-original-topic"
SPRING_PARTITION = "kafka_dlt-original-partition"
SPRING_OFFSET = "kafka_dlt-original-offset"
SPRING_TIMESTAMP = "kafka_dlt-original-timestamp"
SPRING_TIMESTAMP_TYPE = "kafka_dlt-original-timestamp-type"
SPRING_GROUP = "kafka_dlt-original-consumer-group"
SPRING_EXCEPTION = "kafka_dlt-exception-fqcn"
SPRING_CAUSE = "kafka_dlt-exception-cause-fqcn"
SPRING_MESSAGE = "kafka_dlt-exception-message"
SPRING_STACKTRACE = "kafka_dlt-exception-stacktrace"
SPRING_KEY_EXCEPTION = "kafka_dlt-key-exception-fqcn"
SPRING_KEY_MESSAGE = "kafka_dlt-key-exception-message"
SPRING_KEY_STACKTRACE = "kafka_dlt-key-exception-stacktrace"
# Spring's non-blocking retries (RetryTopicHeaders): stale on a replayed record, so stripped.
SPRING_RETRY_PREFIX = "retry_topic-"
SPRING_ATTEMPTS = "retry_topic-attempts"
_SPRING_WRAPPER = "org.springframework.kafka.listener.ListenerExecutionFailedException"

# --- Karafka (DLQ strategies, build_dlq_message) ----------------------------------------------
KARAFKA_TOPIC = "source_topic"
KARAFKA_PARTITION = "source_partition"
KARAFKA_OFFSET = "source_offset"
KARAFKA_GROUP = "source_consumer_group"
KARAFKA_ATTEMPTS = "source_attempts"
KARAFKA_TRACE_ID = "source_trace_id"
KARAFKA_HEADERS = frozenset(
    {KARAFKA_TOPIC, KARAFKA_PARTITION, KARAFKA_OFFSET, KARAFKA_GROUP, KARAFKA_ATTEMPTS,
     KARAFKA_TRACE_ID}
)  # fmt: skip

# --- Kafka Connect (DeadLetterQueueReporter) --------------------------------------------------
CONNECT_PREFIX = "__connect.errors."
CONNECT_TOPIC = "__connect.errors.topic"
CONNECT_PARTITION = "__connect.errors.partition"
CONNECT_OFFSET = "__connect.errors.offset"
CONNECT_CONNECTOR = "__connect.errors.connector.name"
CONNECT_TASK = "__connect.errors.task.id"
CONNECT_STAGE = "__connect.errors.stage"
CONNECT_CLASS = "__connect.errors.class.name"
CONNECT_EXCEPTION = "__connect.errors.exception.class.name"
CONNECT_MESSAGE = "__connect.errors.exception.message"
CONNECT_STACKTRACE = "__connect.errors.exception.stacktrace"
_CONNECT_MALFORMED_STAGES = frozenset({"KEY_CONVERTER", "VALUE_CONVERTER", "HEADER_CONVERTER"})

# --- Share groups, KIP-1191 (ShareGroupDLQStateManager) ---------------------------------------
SHARE_PREFIX = "__dlq.errors."
SHARE_TOPIC = "__dlq.errors.topic"
SHARE_PARTITION = "__dlq.errors.partition"
SHARE_OFFSET = "__dlq.errors.offset"
SHARE_GROUP = "__dlq.errors.group"
SHARE_DELIVERY_COUNT = "__dlq.errors.delivery.count"
SHARE_MESSAGE = "__dlq.errors.message"
SHARE_REJECTED = "Offset rejected by client."
SHARE_DELIVERY_LIMIT = "Offset delivery count exceeded the threshold."
SHARE_ERROR_CLASS = "ShareGroupDLQ"  # the broker names no class: this says who decided

INT32_MAX = 2**31 - 1
GROUP_MAX_BYTES = 256
MAX_PROBLEMS = 16  # more than any format reads headers: each unreadable one is named


@dataclass(frozen=True, slots=True)
class ForeignFields:
    """A foreign dead letter's headers as retryd's dead-letter fields.

    ``fields`` has the keys of ``retryd.policy.headers.decode_lenient`` (a field the source
    does not give, or gives unreadably, is None); ``problems`` says what could not be read."""

    format: ForeignFormat
    fields: dict[str, str | int | None]
    problems: tuple[str, ...] = field(default=())


def parse_format(name: object) -> TopicFormat:
    """A ``foreign_dead_letters`` value: one of ``FORMAT_NAMES``; ValueError naming them."""
    text = name.strip().lower() if isinstance(name, str) else None
    if text == AUTO:
        return AUTO
    if text is not None and text != ForeignFormat.RETRYD.value:
        try:
            return ForeignFormat(text)
        except ValueError:
            pass
    shown = repr(name)[:60]
    raise ValueError(f"format {shown} is not one of {', '.join(FORMAT_NAMES)}")


def topics_from_value(value: Any) -> dict[str, str]:
    """``foreign_dead_letters`` from any source, as topic -> format name: a TOML table, a JSON
    object, or ``topic=format`` pairs separated by ``;`` or ``,`` (the environment). Raises
    ValueError naming what is wrong (a topic that is no Kafka topic name, an unknown format)."""
    if isinstance(value, str) and not value.strip().startswith("{"):
        value = value.replace(",", ";")  # formats hold no commas: either separator
    value = table_from_value(value, name="topic", value_name="format")
    out: dict[str, str] = {}
    for topic, fmt in value.items():
        if not isinstance(topic, str) or not is_topic_name(topic):
            raise ValueError(f"{str(topic)[:80]!r} is not a Kafka topic name")
        try:
            out[topic] = str(parse_format(fmt))
        except ValueError as exc:
            raise ValueError(f"{topic}: {exc}") from None
    return out


# --- reading values ---------------------------------------------------------------------------


class _Reader:
    """Header values by name (first and last occurrence) and the problems met reading them."""

    def __init__(self, headers: object) -> None:
        self.first: dict[str, bytes | None] = {}
        self.last: dict[str, bytes | None] = {}
        for name, value in _pairs(headers):
            self.first.setdefault(name, value)
            self.last[name] = value
        self.problems: list[str] = []

    def note(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def raw(self, name: str, *, first: bool) -> bytes | None:
        return (self.first if first else self.last).get(name)

    def text(self, name: str, *, first: bool = False, limit: int | None = None) -> str | None:
        """UTF-8 text cut to ``limit`` bytes; None (noted) when the bytes are not UTF-8."""
        raw = self.raw(name, first=first)
        if raw is None:
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.note(f"header {name} is not valid UTF-8: its field is null")
            return None
        if limit is not None:
            text = h.truncate_utf8(text, limit).decode("utf-8")
        return text

    def topic(self, name: str, *, first: bool = False) -> str | None:
        raw = self.raw(name, first=first)
        if raw is None:
            return None
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            text = ""
        if not is_topic_name(text):
            self.note(f"header {name} is not a Kafka topic name")
            return None
        return text

    def decimal(
        self, name: str, *, first: bool = False, max_value: int = h.INT64_MAX
    ) -> int | None:
        """A non-negative decimal number; -1 (Connect's "unknown") is None without a problem."""
        raw = self.raw(name, first=first)
        if raw is None:
            return None
        # bytes that are not ASCII named in the problem as \xff, never as U+FFFD
        text = raw.decode("ascii", errors="backslashreplace").strip()
        if text == "-1":
            return None
        value = h.parse_uint(text)
        if value is None or value > max_value:
            self.note(f"header {name}={text[:24]!r} is not a non-negative decimal number")
            return None
        return value

    def big_endian(self, name: str, size: int, *, first: bool = False) -> int | None:
        """A Java int (4 bytes) or long (8 bytes), big-endian and signed, as Spring writes them
        with ``ByteBuffer``; a negative value (Kafka's "none", -1) is None."""
        raw = self.raw(name, first=first)
        if raw is None:
            return None
        if len(raw) != size:
            self.note(f"header {name} has {len(raw)} bytes, not the {size} of a big-endian number")
            return None
        value = int.from_bytes(raw, "big", signed=True)
        return value if value >= 0 else None


def _pairs(headers: object) -> h.Headers:
    """The ``(name, value)`` pairs of ``headers``: the client's shape (text names, bytes or
    None values, as ``retryd.policy.headers.message_headers`` hands them on) as it is, at full
    speed like ``user_headers``; anything else through ``clean_headers``."""
    if type(headers) is list or type(headers) is tuple:
        out: h.Headers = []
        try:
            for name, value in headers:
                if type(name) is not str or not name.isascii():
                    break
                if value is not None and type(value) is not bytes:
                    break
                out.append((name, value))
            else:
                return out
        except Exception:  # an item that is not a pair: the careful path
            pass
    return h.clean_headers(headers)


def _fields(
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    timestamp: int | None = None,
    error_class: str | None = None,
    error_message: str | None = None,
    dead_reason: str | None = None,
    retry_number: int | None = None,
    group: str | None = None,
) -> dict[str, str | int | None]:
    return {
        h.ORIGINAL_TOPIC: topic,
        h.ORIGINAL_PARTITION: partition,
        h.ORIGINAL_OFFSET: offset,
        h.ORIGINAL_TIMESTAMP: timestamp,
        h.ERROR_CLASS: error_class,
        h.ERROR_MESSAGE: error_message,
        h.DEAD_REASON: dead_reason,
        h.RETRY_NUMBER: retry_number,
        h.GROUP: group,
    }


def _attempts_to_retries(attempts: int | None) -> int | None:
    """Deliveries made -> retries made (the first delivery is no retry)."""
    return attempts - 1 if attempts is not None and attempts >= 1 else None


def _spring(r: _Reader) -> dict[str, str | int | None]:
    # "original" headers: the first occurrence names where the record first entered
    # only the key failed (to deserialize) when the value's exception header is absent (one
    # present but unreadable stays the value's: null, named in the problems)
    key_only = r.raw(SPRING_EXCEPTION, first=False) is None
    exception = r.text(
        SPRING_KEY_EXCEPTION if key_only else SPRING_EXCEPTION, limit=h.ERROR_CLASS_MAX_BYTES
    )
    message = r.text(
        SPRING_KEY_MESSAGE if key_only else SPRING_MESSAGE, limit=h.ERROR_MESSAGE_MAX_BYTES
    )
    cause = r.text(SPRING_CAUSE, limit=h.ERROR_CLASS_MAX_BYTES)
    # Spring wraps a listener's exception: the cause is the class that failed (null when its
    # header is there but unreadable; the wrapper when it is absent or empty)
    wrapped = exception == _SPRING_WRAPPER and r.raw(SPRING_CAUSE, first=False) is not None
    error_class = cause if wrapped and cause != "" else exception
    malformed = any(c and c.endswith("DeserializationException") for c in (exception, cause))
    return _fields(
        topic=r.topic(SPRING_TOPIC, first=True),
        partition=_partition(r.big_endian(SPRING_PARTITION, 4, first=True)),
        offset=r.big_endian(SPRING_OFFSET, 8, first=True),
        timestamp=r.big_endian(SPRING_TIMESTAMP, 8, first=True),
        error_class=error_class,
        error_message=message,
        dead_reason=h.DEAD_MALFORMED if malformed else None,
        retry_number=_spring_retries(r),
        group=r.text(SPRING_GROUP, first=True, limit=GROUP_MAX_BYTES),
    )


def _spring_retries(r: _Reader) -> int | None:
    """Retries made, from a DLT record's last ``retry_topic-attempts`` (deliveries made + 1):
    one byte or a 4-byte big-endian int, as Spring reads it; another length is not guessed,
    and is a problem like any other unreadable header."""
    raw = r.raw(SPRING_ATTEMPTS, first=False)
    if raw is None:
        return None
    if len(raw) not in (1, 4):
        r.note(f"header {SPRING_ATTEMPTS} has {len(raw)} bytes, not 1 or 4")
        return None
    stamped = int.from_bytes(raw, "big", signed=True)
    return stamped - 2 if stamped >= 2 else None


def _karafka(r: _Reader) -> dict[str, str | int | None]:
    return _fields(
        topic=r.topic(KARAFKA_TOPIC),
        partition=r.decimal(KARAFKA_PARTITION, max_value=INT32_MAX),
        offset=r.decimal(KARAFKA_OFFSET),
        dead_reason=h.DEAD_EXHAUSTED,
        retry_number=_attempts_to_retries(r.decimal(KARAFKA_ATTEMPTS)),
        group=r.text(KARAFKA_GROUP, limit=GROUP_MAX_BYTES),
    )


def _connect(r: _Reader, timestamp: int | None) -> dict[str, str | int | None]:
    stage = r.text(CONNECT_STAGE, first=True, limit=64)
    connector = r.text(CONNECT_CONNECTOR, first=True, limit=GROUP_MAX_BYTES - 8)
    return _fields(
        topic=r.topic(CONNECT_TOPIC, first=True),
        partition=r.decimal(CONNECT_PARTITION, first=True, max_value=INT32_MAX),
        offset=r.decimal(CONNECT_OFFSET, first=True),
        timestamp=timestamp if timestamp is not None and 0 <= timestamp <= h.INT64_MAX else None,
        error_class=r.text(CONNECT_EXCEPTION, first=True, limit=h.ERROR_CLASS_MAX_BYTES),
        error_message=r.text(CONNECT_MESSAGE, first=True, limit=h.ERROR_MESSAGE_MAX_BYTES),
        dead_reason=h.DEAD_MALFORMED if stage in _CONNECT_MALFORMED_STAGES else None,
        group=f"connect-{connector}" if connector else None,
    )


def _share_group(r: _Reader) -> dict[str, str | int | None]:
    message = r.text(SHARE_MESSAGE, limit=h.ERROR_MESSAGE_MAX_BYTES)
    reason = {SHARE_REJECTED: h.DEAD_NON_RETRYABLE, SHARE_DELIVERY_LIMIT: h.DEAD_EXHAUSTED}
    has_message = r.raw(SHARE_MESSAGE, first=False) is not None  # readable or not
    return _fields(
        topic=r.topic(SHARE_TOPIC),
        partition=r.decimal(SHARE_PARTITION, max_value=INT32_MAX),
        offset=r.decimal(SHARE_OFFSET),
        error_class=SHARE_ERROR_CLASS if has_message else None,
        error_message=message,
        dead_reason=reason.get(message or ""),
        retry_number=_attempts_to_retries(r.decimal(SHARE_DELIVERY_COUNT, max_value=2**15 - 1)),
        group=r.text(SHARE_GROUP, limit=GROUP_MAX_BYTES),
    )


def _partition(value: int | None) -> int | None:
    return value if value is not None and value <= INT32_MAX else None


# --- the public functions ---------------------------------------------------------------------


def detect(headers: object) -> ForeignFormat | None:
    """Who wrote this dead letter, from its header names; None when nobody known did.

    retryd's own headers win (a retryd dead letter may carry a foreign header its original
    record had); Karafka's generic ``source_*`` names count only all three together."""
    names = {name for name, _ in h.clean_headers(headers)}
    if h.ORIGINAL_TOPIC in names or h.DEAD_REASON in names:
        return ForeignFormat.RETRYD
    if SPRING_TOPIC in names:
        return ForeignFormat.SPRING
    if CONNECT_TOPIC in names:
        return ForeignFormat.CONNECT
    if SHARE_TOPIC in names:
        return ForeignFormat.SHARE_GROUP
    if {KARAFKA_TOPIC, KARAFKA_PARTITION, KARAFKA_OFFSET} <= names:
        return ForeignFormat.KARAFKA
    return None


def record_format(configured: TopicFormat, headers: object) -> ForeignFormat:
    """The format one record of a topic is read in: the configured one, or (``auto``) the one
    ``detect`` finds, retryd's when it finds none."""
    if configured != AUTO:
        return ForeignFormat(configured)
    return detect(headers) or ForeignFormat.RETRYD


def to_dead_letter_fields(
    fmt: ForeignFormat, headers: object, *, timestamp: int | None = None
) -> ForeignFields:
    """``headers`` of a dead letter written by ``fmt`` as retryd's dead-letter fields.
    ``timestamp`` is the dead letter's own Kafka timestamp (Connect keeps the original's).
    Never raises: whatever cannot be read is None, and ``problems`` says why."""
    if fmt is ForeignFormat.RETRYD:
        return ForeignFields(fmt, h.decode_lenient(h.clean_headers(headers)))
    reader = _Reader(headers)
    try:
        if fmt is ForeignFormat.SPRING:
            found = _spring(reader)
        elif fmt is ForeignFormat.KARAFKA:
            found = _karafka(reader)
        elif fmt is ForeignFormat.CONNECT:
            found = _connect(reader, timestamp)
        else:
            found = _share_group(reader)
    except Exception as exc:  # a bug must not stop a page or a job: say so, map nothing
        return ForeignFields(fmt, _fields(), (f"cannot map the headers: {type(exc).__name__}",))
    if found[h.ORIGINAL_TOPIC] is None and not reader.problems:
        reader.note(f"no original topic: the {fmt.value} header naming it is missing")
    return ForeignFields(fmt, found, tuple(reader.problems))


def is_foreign_header(fmt: ForeignFormat, name: str) -> bool:
    """Whether ``name`` is one of the headers ``fmt`` writes when it dead-letters a record:
    a replayed copy leaves them behind, so the handler sees a clean record."""
    if fmt is ForeignFormat.SPRING:
        return name.startswith((SPRING_PREFIX, SPRING_RETRY_PREFIX))
    if fmt is ForeignFormat.KARAFKA:
        return name in KARAFKA_HEADERS
    if fmt is ForeignFormat.CONNECT:
        return name.startswith(CONNECT_PREFIX)
    if fmt is ForeignFormat.SHARE_GROUP:
        return name.startswith(SHARE_PREFIX)
    return False


def strip_foreign(fmt: ForeignFormat, headers: Iterable[tuple[str, bytes | None]]) -> h.Headers:
    """``headers`` without the ones ``fmt`` wrote (in order; everything else kept as it is)."""
    clean = h.clean_headers(headers)
    if fmt is ForeignFormat.RETRYD:
        return clean
    return [(name, value) for name, value in clean if not is_foreign_header(fmt, name)]
