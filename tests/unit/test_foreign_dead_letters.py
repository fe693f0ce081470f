"""Other systems' dead letters mapped onto retryd's fields: exact header encodings of Spring
for Apache Kafka, Karafka, Kafka Connect and share groups (KIP-1191), hostile values, the
setting, and the shared read path (records, replayed copies, reserved targets)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pydantic import ValidationError

from retryd.config import Settings
from retryd.policy import headers as h
from retryd.policy.foreign import (
    AUTO,
    MAX_PROBLEMS,
    ForeignFormat,
    detect,
    is_foreign_header,
    parse_format,
    record_format,
    strip_foreign,
    to_dead_letter_fields,
    topics_from_value,
)
from retryd.replay.copies import replay_copy_kwargs
from retryd.replay.records import FailedRecord, RecordFilter, render_record
from retryd.replay.sources import dead_letter_topics, foreign_formats, source_topic
from retryd.replay.targets import reserved_topics


def spring_headers(
    topic: str = "orders",
    partition: int = 3,
    offset: int = 4_294_967_301,
    timestamp: int = 1_700_000_000_123,
) -> list[tuple[str, bytes | None]]:
    """What DeadLetterPublishingRecoverer writes: ByteBuffer.putInt / putLong are big-endian."""
    return [
        ("trace", b"t-1"),
        ("kafka_dlt-original-topic", topic.encode()),
        ("kafka_dlt-original-partition", struct.pack(">i", partition)),
        ("kafka_dlt-original-offset", struct.pack(">q", offset)),
        ("kafka_dlt-original-timestamp", struct.pack(">q", timestamp)),
        ("kafka_dlt-original-timestamp-type", b"CreateTime"),
        ("kafka_dlt-original-consumer-group", b"orders-app"),
        (
            "kafka_dlt-exception-fqcn",
            b"org.springframework.kafka.listener.ListenerExecutionFailedException",
        ),
        ("kafka_dlt-exception-cause-fqcn", b"java.lang.IllegalStateException"),
        ("kafka_dlt-exception-message", "Listener failed; price \u20ac < 0".encode()),
        ("kafka_dlt-exception-stacktrace", b"java.lang.IllegalStateException: ...\n\tat x"),
    ]


KARAFKA = [
    ("user", b"u"),
    ("source_topic", b"payments"),
    ("source_partition", b"2"),
    ("source_offset", b"812"),
    ("source_consumer_group", b"karafka_app"),
    ("source_attempts", b"4"),
    ("source_trace_id", b"8c1c0b1e-5a3e-4bd0-9a4b-1d5b1e0b7f00"),
]

CONNECT = [
    ("__connect.errors.topic", b"clicks"),
    ("__connect.errors.partition", b"1"),
    ("__connect.errors.offset", b"77"),
    ("__connect.errors.connector.name", b"clicks-sink"),
    ("__connect.errors.task.id", b"0"),
    ("__connect.errors.stage", b"VALUE_CONVERTER"),
    ("__connect.errors.class.name", b"org.apache.kafka.connect.json.JsonConverter"),
    (
        "__connect.errors.exception.class.name",
        b"org.apache.kafka.connect.errors.DataException",
    ),
    ("__connect.errors.exception.message", b"Converting byte[] to Kafka Connect data failed"),
    ("__connect.errors.exception.stacktrace", b"org.apache.kafka.connect.errors..."),
]

SHARE = [
    ("__dlq.errors.topic", b"jobs"),
    ("__dlq.errors.partition", b"0"),
    ("__dlq.errors.offset", b"41"),
    ("__dlq.errors.group", b"job-workers"),
    ("__dlq.errors.delivery.count", b"5"),
    ("__dlq.errors.message", b"Offset delivery count exceeded the threshold."),
]


def test_spring_binary_numbers_and_wrapped_cause() -> None:
    got = to_dead_letter_fields(ForeignFormat.SPRING, spring_headers())
    assert got.problems == ()
    assert got.fields == {
        h.ORIGINAL_TOPIC: "orders",
        h.ORIGINAL_PARTITION: 3,
        h.ORIGINAL_OFFSET: 4_294_967_301,  # needs the whole 8 bytes
        h.ORIGINAL_TIMESTAMP: 1_700_000_000_123,
        h.ERROR_CLASS: "java.lang.IllegalStateException",  # the cause, not Spring's wrapper
        h.ERROR_MESSAGE: "Listener failed; price \u20ac < 0",
        h.DEAD_REASON: None,
        h.RETRY_NUMBER: None,
        h.GROUP: "orders-app",
    }


@pytest.mark.parametrize(
    ("value", "retries"),
    [
        (b"\x04", 2),  # one byte (older Spring): 3 deliveries, the DLT stamped 3 + 1
        ((4).to_bytes(4, "big"), 2),  # ByteBuffer.putInt (current Spring)
        ((2).to_bytes(4, "big"), 0),  # dead-lettered on the first delivery
        (b"\x00\x04", None),  # neither length Spring reads
        ((-1).to_bytes(4, "big", signed=True), None),
    ],
)
def test_spring_retry_topic_attempts_give_the_retries_made(
    value: bytes, retries: int | None
) -> None:
    got = to_dead_letter_fields(
        ForeignFormat.SPRING, [*spring_headers(), ("retry_topic-attempts", value)]
    )
    assert got.fields[h.RETRY_NUMBER] == retries
    # a length Spring does not write is reported, like any other unreadable header
    wrong_length = len(value) not in (1, 4)
    assert any("retry_topic-attempts" in p for p in got.problems) == wrong_length, got.problems


def test_spring_first_original_header_wins_and_last_exception() -> None:
    """appendOriginalHeaders (default true): a record dead-lettered twice carries two sets."""
    hops = [
        *spring_headers("orders", 1, 10),
        *spring_headers("orders-retry-0", 0, 5),
        ("kafka_dlt-exception-fqcn", b"com.acme.Boom"),
    ]
    got = to_dead_letter_fields(ForeignFormat.SPRING, hops).fields
    assert (got[h.ORIGINAL_TOPIC], got[h.ORIGINAL_PARTITION], got[h.ORIGINAL_OFFSET]) == (
        "orders",
        1,
        10,
    )
    assert got[h.ERROR_CLASS] == "com.acme.Boom"


def test_spring_deserialization_failure_is_malformed() -> None:
    headers = [
        ("kafka_dlt-original-topic", b"orders"),
        (
            "kafka_dlt-key-exception-fqcn",
            b"org.springframework.kafka.support.serializer.DeserializationException",
        ),
        ("kafka_dlt-key-exception-message", b"failed to deserialize; nested exception"),
    ]
    got = to_dead_letter_fields(ForeignFormat.SPRING, headers).fields
    assert got[h.DEAD_REASON] == h.DEAD_MALFORMED
    assert got[h.ERROR_MESSAGE] == "failed to deserialize; nested exception"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("kafka_dlt-original-partition", b"\x00\x03"),  # 2 bytes, not 4
        ("kafka_dlt-original-partition", b"3"),  # decimal text is not Spring's encoding
        ("kafka_dlt-original-offset", b"\x00" * 9),
        ("kafka_dlt-original-offset", b""),
    ],
)
def test_spring_wrong_lengths_are_unread_not_guessed(name: str, value: bytes) -> None:
    headers = [(n, value if n == name else v) for n, v in spring_headers()]
    got = to_dead_letter_fields(ForeignFormat.SPRING, headers)
    field = h.ORIGINAL_PARTITION if name.endswith("partition") else h.ORIGINAL_OFFSET
    assert got.fields[field] is None
    assert got.fields[h.ORIGINAL_TOPIC] == "orders"  # the rest still maps
    assert any(name in p and "big-endian" in p for p in got.problems)


def test_spring_negative_numbers_are_none() -> None:
    """Kafka's 'no timestamp' is -1 (RecordBatch.NO_TIMESTAMP), written as 8 bytes of 0xff."""
    got = to_dead_letter_fields(ForeignFormat.SPRING, spring_headers(timestamp=-1)).fields
    assert got[h.ORIGINAL_TIMESTAMP] is None


def test_karafka_strings() -> None:
    got = to_dead_letter_fields(ForeignFormat.KARAFKA, KARAFKA)
    assert got.problems == ()
    assert got.fields[h.ORIGINAL_TOPIC] == "payments"
    assert got.fields[h.ORIGINAL_PARTITION] == 2
    assert got.fields[h.ORIGINAL_OFFSET] == 812
    assert got.fields[h.RETRY_NUMBER] == 3  # 4 attempts: the first was no retry
    assert got.fields[h.GROUP] == "karafka_app"
    assert got.fields[h.DEAD_REASON] == h.DEAD_EXHAUSTED
    assert got.fields[h.ERROR_CLASS] is None  # Karafka writes no exception headers


def test_connect_strings_first_wins_and_original_timestamp() -> None:
    again = [*CONNECT, ("__connect.errors.topic", b"other")]
    got = to_dead_letter_fields(ForeignFormat.CONNECT, again, timestamp=1_650_000_000_000)
    assert got.problems == ()
    assert got.fields == {
        h.ORIGINAL_TOPIC: "clicks",
        h.ORIGINAL_PARTITION: 1,
        h.ORIGINAL_OFFSET: 77,
        h.ORIGINAL_TIMESTAMP: 1_650_000_000_000,
        h.ERROR_CLASS: "org.apache.kafka.connect.errors.DataException",
        h.ERROR_MESSAGE: "Converting byte[] to Kafka Connect data failed",
        h.DEAD_REASON: h.DEAD_MALFORMED,  # a converter stage
        h.RETRY_NUMBER: None,
        h.GROUP: "connect-clicks-sink",
    }


def test_connect_unknown_position_is_minus_one() -> None:
    """populateContextHeaders writes partition -1 and offset -1 without a consumer record."""
    headers = [
        ("__connect.errors.topic", b""),
        ("__connect.errors.partition", b"-1"),
        ("__connect.errors.offset", b"-1"),
        ("__connect.errors.stage", b"TASK_PUT"),
    ]
    got = to_dead_letter_fields(ForeignFormat.CONNECT, headers)
    assert got.fields[h.ORIGINAL_PARTITION] is None and got.fields[h.ORIGINAL_OFFSET] is None
    assert got.fields[h.ORIGINAL_TOPIC] is None
    assert got.fields[h.DEAD_REASON] is None
    assert any("topic name" in p for p in got.problems)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"Offset delivery count exceeded the threshold.", h.DEAD_EXHAUSTED),
        (b"Offset rejected by client.", h.DEAD_NON_RETRYABLE),
        (b"Acquisition lock timed out.", None),
    ],
)
def test_share_group_headers(message: bytes, reason: str | None) -> None:
    headers = [*SHARE[:-1], ("__dlq.errors.message", message)]
    got = to_dead_letter_fields(ForeignFormat.SHARE_GROUP, headers)
    assert got.problems == ()
    assert got.fields[h.ORIGINAL_TOPIC] == "jobs"
    assert (got.fields[h.ORIGINAL_PARTITION], got.fields[h.ORIGINAL_OFFSET]) == (0, 41)
    assert got.fields[h.GROUP] == "job-workers"
    assert got.fields[h.RETRY_NUMBER] == 4
    assert got.fields[h.ERROR_MESSAGE] == message.decode()
    assert got.fields[h.DEAD_REASON] == reason
    assert got.fields[h.ORIGINAL_TIMESTAMP] is None  # the broker stamps the DLQ write time


HOSTILE: list[object] = [
    None,
    [],
    "not headers",
    [("__dlq.errors.topic", b"\xff\xfe")],
    [("__dlq.errors.partition", b"9" * 5000), ("__dlq.errors.offset", b"-5")],
    [("source_offset", b"99999999999999999999999"), ("source_partition", b"2147483648")],
    [("kafka_dlt-exception-message", b"\xc3\x28 broken" * 200)],
    [(b"\xff", b"x"), ("x",), 5, ("kafka_dlt-original-topic", 7)],
    [("__connect.errors.topic", b"a" * 300)],
    [("__connect.errors.exception.message", "lone \udc80 surrogate")],
]


@pytest.mark.parametrize("fmt", [f for f in ForeignFormat if f is not ForeignFormat.RETRYD])
@pytest.mark.parametrize("headers", HOSTILE)
def test_hostile_headers_never_raise(fmt: ForeignFormat, headers: object) -> None:
    got = to_dead_letter_fields(fmt, headers, timestamp=-1)
    assert set(got.fields) >= {h.ORIGINAL_TOPIC, h.ORIGINAL_PARTITION, h.ORIGINAL_OFFSET}
    assert len(got.problems) <= MAX_PROBLEMS
    for value in got.fields.values():
        assert value is None or isinstance(value, int | str)
        if isinstance(value, str):
            assert len(value.encode("utf-8", errors="surrogatepass")) <= 512
            value.encode("utf-8")  # renderable
        if isinstance(value, int):
            assert 0 <= value < 2**63
    assert detect(headers) in (None, *ForeignFormat)
    strip_foreign(fmt, headers)  # type: ignore[arg-type]


NOT_UTF8 = b"caf\xe9 \xff\xfe"  # Latin-1 and stray bytes: no UTF-8 decoder reads them


def _with(headers: list[tuple[str, bytes | None]], name: str) -> list[tuple[str, bytes | None]]:
    """``headers`` with ``name``'s value replaced by bytes that are not UTF-8."""
    assert any(n == name for n, _ in headers), name
    return [(n, NOT_UTF8 if n == name else v) for n, v in headers]


SPRING_KEY_ONLY = [
    *(pair for pair in spring_headers() if not pair[0].startswith("kafka_dlt-exception")),
    ("kafka_dlt-key-exception-fqcn", b"org.apache.kafka.common.errors.SerializationException"),
    ("kafka_dlt-key-exception-message", b"key failed"),
]


@pytest.mark.parametrize(
    ("fmt", "headers", "header", "field"),
    [
        (ForeignFormat.SPRING, spring_headers(), "kafka_dlt-exception-fqcn", h.ERROR_CLASS),
        (ForeignFormat.SPRING, spring_headers(), "kafka_dlt-exception-cause-fqcn", h.ERROR_CLASS),
        (ForeignFormat.SPRING, spring_headers(), "kafka_dlt-exception-message", h.ERROR_MESSAGE),
        (ForeignFormat.SPRING, spring_headers(), "kafka_dlt-original-consumer-group", h.GROUP),
        (ForeignFormat.SPRING, SPRING_KEY_ONLY, "kafka_dlt-key-exception-fqcn", h.ERROR_CLASS),
        (ForeignFormat.SPRING, SPRING_KEY_ONLY, "kafka_dlt-key-exception-message", h.ERROR_MESSAGE),
        (ForeignFormat.KARAFKA, KARAFKA, "source_consumer_group", h.GROUP),
        (ForeignFormat.CONNECT, CONNECT, "__connect.errors.exception.class.name", h.ERROR_CLASS),
        (ForeignFormat.CONNECT, CONNECT, "__connect.errors.exception.message", h.ERROR_MESSAGE),
        (ForeignFormat.CONNECT, CONNECT, "__connect.errors.connector.name", h.GROUP),
        (ForeignFormat.SHARE_GROUP, SHARE, "__dlq.errors.message", h.ERROR_MESSAGE),
        (ForeignFormat.SHARE_GROUP, SHARE, "__dlq.errors.group", h.GROUP),
    ],
)
def test_text_that_is_not_utf8_is_null_and_named(
    fmt: ForeignFormat, headers: list[tuple[str, bytes | None]], header: str, field: str
) -> None:
    """README and the spec: a mapped text field whose bytes are not UTF-8 is null (never a
    guess with U+FFFD in it), its header is named in the problems, and the other fields are
    read as they would be without it."""
    clean = to_dead_letter_fields(fmt, headers).fields
    assert clean[field] is not None
    got = to_dead_letter_fields(fmt, _with(headers, header))
    assert got.fields[field] is None, got.fields
    assert [p for p in got.problems if header in p and "UTF-8" in p], got.problems

    def others(fields: dict[str, str | int | None]) -> dict[str, str | int | None]:
        return {k: v for k, v in fields.items() if k not in (field, h.DEAD_REASON)}

    assert others(got.fields) == others(clean)  # (a share group's reason is read from its text)
    assert not any("\ufffd" in str(v) for v in (*got.fields.values(), *got.problems))


def test_an_unreadable_share_group_message_keeps_who_decided() -> None:
    """The broker names no class: ``ShareGroupDLQ`` says a message was there (it was, only
    unreadable); the dead reason, read from the message's words, is unknown."""
    got = to_dead_letter_fields(ForeignFormat.SHARE_GROUP, _with(SHARE, "__dlq.errors.message"))
    assert got.fields[h.ERROR_CLASS] == "ShareGroupDLQ"
    assert got.fields[h.ERROR_MESSAGE] is None and got.fields[h.DEAD_REASON] is None


def test_every_unreadable_header_of_a_record_is_named() -> None:
    """All of Spring's text and number headers unreadable at once: each is named (the bound
    on problems is above what any format reads), none shows U+FFFD, numbers as escapes."""
    headers = [
        (n, b"\xff\xfe\x80" if n.startswith("kafka_dlt-") else v) for n, v in spring_headers()
    ]
    got = to_dead_letter_fields(ForeignFormat.SPRING, headers)
    named = {
        "kafka_dlt-original-topic", "kafka_dlt-original-partition", "kafka_dlt-original-offset",
        "kafka_dlt-original-timestamp", "kafka_dlt-original-consumer-group",
        "kafka_dlt-exception-fqcn", "kafka_dlt-exception-cause-fqcn",
        "kafka_dlt-exception-message",
    }  # fmt: skip
    assert {n for n in named if any(n + " " in p for p in got.problems)} == named, got.problems
    assert all(v is None for k, v in got.fields.items() if k != h.DEAD_REASON), got.fields
    karafka = to_dead_letter_fields(ForeignFormat.KARAFKA, _with(KARAFKA, "source_offset"))
    assert karafka.fields[h.ORIGINAL_OFFSET] is None
    assert any("source_offset" in p and "\\xe9" in p for p in karafka.problems), karafka.problems
    for problem in (*got.problems, *karafka.problems):
        assert "\ufffd" not in problem


def test_the_api_view_of_an_unreadable_field_is_null_with_its_problem() -> None:
    """What ``/v1/failed`` serves (``render_record``) and what Spark's columns hold
    (``map_batch``) for a Spring dead letter whose exception headers are not UTF-8."""
    headers = _with(
        _with(spring_headers(), "kafka_dlt-exception-fqcn"), "kafka_dlt-exception-message"
    )
    view = render_record(spring_record(headers=headers), 64)
    assert view["retryd"][h.ERROR_CLASS] is None and view["retryd"][h.ERROR_MESSAGE] is None
    assert view["retryd"][h.ORIGINAL_TOPIC] == "orders"
    problems = view["mapping_problems"]
    assert any("kafka_dlt-exception-fqcn" in p for p in problems), problems
    assert any("kafka_dlt-exception-message" in p for p in problems), problems
    assert "\ufffd" not in repr(view)
    pytest.importorskip("pyarrow")
    from retryd.pipeline.columns import Record, build_batch
    from retryd.pipeline.foreign import map_batch

    batch = build_batch([Record("orders.DLT", 0, 0, (1, 1), b"k", b"v", headers)])
    row = map_batch(batch, {"orders.DLT": "spring"}).to_pylist()[0]
    assert (row["error_class"], row["original_topic"]) == (None, "orders")


def test_detect() -> None:
    assert detect(spring_headers()) is ForeignFormat.SPRING
    assert detect(KARAFKA) is ForeignFormat.KARAFKA
    assert detect(CONNECT) is ForeignFormat.CONNECT
    assert detect(SHARE) is ForeignFormat.SHARE_GROUP
    assert detect([("source_topic", b"x")]) is None  # Karafka only with all three
    assert detect([("user", b"x")]) is None
    # a retryd dead letter whose original record carried a foreign header stays retryd's
    assert detect([*CONNECT, (h.ORIGINAL_TOPIC, b"a")]) is ForeignFormat.RETRYD
    assert record_format(AUTO, KARAFKA) is ForeignFormat.KARAFKA
    assert record_format(AUTO, [("user", b"x")]) is ForeignFormat.RETRYD
    assert record_format(ForeignFormat.SPRING, KARAFKA) is ForeignFormat.SPRING


def test_strip_foreign_keeps_application_headers() -> None:
    spring = [*spring_headers(), ("retry_topic-attempts", b"\x00\x00\x00\x03")]
    assert strip_foreign(ForeignFormat.SPRING, spring) == [("trace", b"t-1")]
    assert strip_foreign(ForeignFormat.KARAFKA, KARAFKA) == [("user", b"u")]
    assert strip_foreign(ForeignFormat.CONNECT, [*CONNECT, ("k", None)]) == [("k", None)]
    assert strip_foreign(ForeignFormat.SHARE_GROUP, SHARE) == []
    assert strip_foreign(ForeignFormat.RETRYD, KARAFKA) == KARAFKA
    assert not is_foreign_header(ForeignFormat.KARAFKA, "source_system")


def test_parse_format_and_topics_from_value() -> None:
    assert parse_format(" Spring ") is ForeignFormat.SPRING
    assert parse_format("auto") == AUTO
    for bad in ("retryd", "kafka", 3, None):
        with pytest.raises(ValueError, match="not one of spring, karafka, connect"):
            parse_format(bad)
    assert topics_from_value('{"a.DLT": "spring"}') == {"a.DLT": "spring"}
    assert topics_from_value("a.DLT=spring; b=connect, c=auto") == {
        "a.DLT": "spring",
        "b": "connect",
        "c": "auto",
    }
    with pytest.raises(ValueError, match="expected topic=format"):
        topics_from_value("a.DLT")
    with pytest.raises(ValueError, match="not a Kafka topic name"):
        topics_from_value({"bad topic": "spring"})


def settings(**extra: object) -> Settings:
    return Settings(
        main_topics=["orders", "payments"],
        foreign_dead_letters={"orders.DLT": "spring", "dlq.mixed": "auto"},
        **extra,  # type: ignore[arg-type]
    )


def test_setting_validation_names_the_problem() -> None:
    with pytest.raises(ValidationError, match=r"orders\.DLT: format 'springs' is not one of"):
        Settings(main_topics=["orders"], foreign_dead_letters={"orders.DLT": "springs"})
    with pytest.raises(ValidationError, match="foreign_dead_letters: orders is a main topic"):
        Settings(main_topics=["orders"], foreign_dead_letters={"orders": "spring"})
    with pytest.raises(ValidationError, match="failed_topic is failed_topic"):
        Settings(main_topics=["orders"], foreign_dead_letters={"failed_topic": "connect"})
    with pytest.raises(ValidationError, match="Kafka-internal"):
        Settings(main_topics=["orders"], foreign_dead_letters={"__consumer_offsets": "connect"})


def test_sources_and_reserved_targets() -> None:
    s = settings()
    assert dead_letter_topics(s) == ("failed_topic", "orders.DLT", "dlq.mixed")
    assert source_topic(s, "orders.DLT") == "orders.DLT"
    assert foreign_formats(s) == {"orders.DLT": ForeignFormat.SPRING, "dlq.mixed": AUTO}
    assert "orders.DLT" in reserved_topics(s)


def spring_record(**kw: object) -> FailedRecord:
    base: dict[str, object] = {
        "topic": "orders.DLT",
        "partition": 0,
        "offset": 9,
        "timestamp": 1_700_000_100_000,
        "key": b"k",
        "value": b"v",
        "headers": spring_headers(),
        "format": ForeignFormat.SPRING,
    }
    base.update(kw)
    return FailedRecord(**base)  # type: ignore[arg-type]


def test_record_reads_mapping_filters_and_renders() -> None:
    rec = spring_record()
    assert rec.original_topic == "orders" and rec.original_partition == 3
    assert RecordFilter(original_topic="orders").matches(rec)
    assert RecordFilter(error_class="java.lang.IllegalStateException").matches(rec)
    assert not RecordFilter(original_topic="payments").matches(rec)
    view = render_record(rec, 64)
    assert view["format"] == "spring"
    assert view["retryd"][h.ORIGINAL_OFFSET] == 4_294_967_301
    assert [x["name"] for x in view["headers"]] == ["trace"]  # Spring's own left out
    assert view["mapping_problems"] == []


def test_replayed_copy_of_a_foreign_record_is_clean() -> None:
    """The copy keeps key, value and the application's headers; Spring's DLT headers go."""
    kw = replay_copy_kwargs(spring_record(), "orders", 6, "r-1")
    names = [name for name, _ in kw["headers"]]
    assert names == ["trace", h.REPLAY_ID, h.REPLAYED_FROM]
    assert kw["partition"] == 3  # the original partition, as for retryd's dead letters
    assert (kw["key"], kw["value"]) == (b"k", b"v")
    assert dict(kw["headers"])[h.REPLAYED_FROM] == b"orders.DLT/0/9"


CLI_ENV = {
    "RETRYD_MAIN_TOPICS": "orders",
    "RETRYD_FAILED_TOPIC": "orders.failed",
    "RETRYD_FOREIGN_DEAD_LETTERS": "orders.DLT=spring",
    # nothing below reaches Kafka or starts Spark: every case exits on its arguments first
    "RETRYD_BOOTSTRAP_SERVERS": "127.0.0.1:1",
}


@pytest.mark.parametrize("command", [["replay"], ["spark", "replay", "--dry-run"]])
def test_clis_name_the_foreign_topics_when_refusing_one(command: list[str]) -> None:
    from typer.testing import CliRunner

    from retryd.cli import app

    bad = CliRunner().invoke(app, [*command, "--topic", "orders"], env=CLI_ENV)
    assert bad.exit_code == 2, bad.output
    assert "not a dead-letter topic" in bad.output and "orders.failed, orders.DLT" in bad.output


def test_pipeline_columns_of_foreign_rows_are_mapped() -> None:
    """What Spark sees (``retryd.pipeline.foreign.map_batch``, run by ``mapInArrow``): the
    mapped columns of a foreign topic's rows, ``auto`` per row, other topics untouched."""
    pytest.importorskip("pyarrow")
    from retryd.pipeline.columns import Record, build_batch
    from retryd.pipeline.foreign import map_batch

    rows = [
        Record("orders.DLT", 0, 0, (1, 1_700_000_100_000), b"k", b"v", spring_headers()),
        Record("failed_topic", 0, 1, (1, 1), None, None, [(h.ORIGINAL_TOPIC, b"payments")]),
        Record("dlq.mixed", 0, 2, (1, 1_650_000_000_000), None, None, CONNECT),
        Record("dlq.mixed", 0, 3, (1, 5), None, None, [("plain", b"x"), (h.ERROR_CLASS, b"E")]),
        Record("dlq.mixed", 0, 4, (1, 5), None, None, [("__dlq.errors.offset", b"\xff")]),
    ]
    batch = build_batch(rows)
    out = map_batch(batch, {"orders.DLT": "spring", "dlq.mixed": "auto"})
    assert out.schema == batch.schema
    got = out.select(
        ["original_topic", "original_partition", "original_offset", "error_class", "dead_reason"]
    ).to_pylist()
    assert got[0] == {
        "original_topic": "orders",
        "original_partition": 3,
        "original_offset": 4_294_967_301,
        "error_class": "java.lang.IllegalStateException",
        "dead_reason": None,
    }
    assert got[1]["original_topic"] == "payments"  # retryd's own: as the reader parsed it
    assert got[2]["original_topic"] == "clicks" and got[2]["dead_reason"] == "malformed"
    assert got[3]["error_class"] == "E"  # auto, nothing foreign: retryd's headers as parsed
    assert got[4]["original_offset"] is None  # hostile: auto finds no format (no topic header)
    stamps = out.column("original_timestamp").cast("int64").to_pylist()
    assert stamps[0] == 1_700_000_000_123_000 and stamps[2] == 1_650_000_000_000_000  # µs
    plain = build_batch(rows[1:2])
    assert map_batch(plain, {"orders.DLT": "spring"}) is plain  # no foreign row: untouched


_NAMES = st.sampled_from(
    [
        "kafka_dlt-original-topic", "kafka_dlt-original-partition", "kafka_dlt-original-offset",
        "kafka_dlt-original-timestamp", "kafka_dlt-exception-fqcn", "source_topic",
        "source_partition", "source_offset", "source_attempts", "__connect.errors.topic",
        "__connect.errors.offset", "__connect.errors.stage", "__dlq.errors.topic",
        "__dlq.errors.delivery.count", "__dlq.errors.message", "retryd_original_topic",
    ]
) | st.text(max_size=20) | st.binary(max_size=20)  # fmt: skip
_VALUES = st.none() | st.binary(max_size=40) | st.text(max_size=20) | st.integers()


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES) | st.tuples(_NAMES), max_size=12), st.integers())
def test_any_headers_map_without_raising(headers: list[tuple[object, ...]], stamp: int) -> None:
    for fmt in ForeignFormat:
        got = to_dead_letter_fields(fmt, headers, timestamp=stamp)
        for value in got.fields.values():
            assert value is None or isinstance(value, int | str)
            if isinstance(value, int):
                assert 0 <= value < 2**63
        strip_foreign(fmt, headers)  # type: ignore[arg-type]
    found = detect(headers)
    assert found is None or isinstance(found, ForeignFormat)


def test_a_headers_only_share_group_dead_letter_is_not_replayed() -> None:
    """Kafka 4.4 dead-letters a share group's record as headers only unless the group sets
    errors.deadletterqueue.copy.record.enable: replaying it would send an empty record, so the
    target choice refuses it (422 nothing_to_replay in the API, skip reason no_payload in a
    job and in Spark); one with its record copied, or a tombstone of another format, goes."""
    from retryd.replay.errors import NothingToReplay
    from retryd.replay.targets import TargetPolicy

    bare = spring_record(format=ForeignFormat.SHARE_GROUP, headers=SHARE, key=None, value=None)
    assert bare.nothing_to_replay is not None
    assert "errors.deadletterqueue.copy.record.enable" in bare.nothing_to_replay
    copied = spring_record(format=ForeignFormat.SHARE_GROUP, headers=SHARE)
    keyless = spring_record(format=ForeignFormat.SHARE_GROUP, headers=SHARE, key=None)
    tombstone = spring_record(key=None, value=None)
    assert copied.nothing_to_replay is keyless.nothing_to_replay is None
    assert tombstone.nothing_to_replay is None
    policy = TargetPolicy({"bootstrap.servers": "unused:9092"}, ["jobs"])
    with pytest.raises(NothingToReplay, match="nothing to replay"):
        policy.choose(bare, None)
    assert policy.choose(copied, None) == "jobs"
