"""Issue 15: hostile headers never stop anything. Every header decode retryd has (the strict
tier envelope, the lenient one, ``route_malformed``, the header helpers, the failed-record
views of ``retryd.replay.records``) against huge digit strings, non-UTF-8 values, null and
empty values, ``str`` values, names that are bytes or other types or lone surrogates, items
that are not pairs, many and repeated headers, and the list confluent-kafka leaves behind
after a header name that is not UTF-8 (tuples with a NULL name)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retryd.api.schemas import FailedRecordOut
from retryd.errors import HeaderError
from retryd.policy import headers as h
from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.headers import (
    INT64_MAX,
    clean_headers,
    decode_lenient,
    decode_tier_envelope,
    header_value,
    message_headers,
    parse_uint,
    replay_headers,
    retryd_headers,
    routed_headers,
    user_headers,
)
from retryd.policy.routing import RoutePlanner, route_malformed
from retryd.policy.sequence import RetryPlan
from retryd.replay.records import Coord, FailedRecord, RecordFilter, render_record

REPO = Path(__file__).resolve().parents[2]
PLAN = RetryPlan.parse("5m,30m", failed_topic="failed", group="g")
HUGE = b"9" * 5000  # past Python's 4,300-digit int() limit
INT_NAMES = sorted(h._INT_HEADERS)
RETRYD_NAMES = [
    *INT_NAMES,
    h.ORIGINAL_TOPIC,
    h.ERROR_CLASS,
    h.ERROR_MESSAGE,
    h.DEAD_REASON,
    h.GROUP,
]


def good_tier_headers(**override: bytes | None) -> list[tuple[str, bytes | None]]:
    base: dict[str, bytes | None] = {
        h.RETRY_NUMBER: b"1",
        h.RETRY_TIMESTAMP: b"1700000000000",
        h.ORIGINAL_TOPIC: b"orders",
        h.ORIGINAL_PARTITION: b"0",
        h.ORIGINAL_OFFSET: b"7",
    }
    base.update(override)
    return list(base.items())


def utf8_safe(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def assert_clean(headers: list[tuple[str, bytes | None]]) -> None:
    """What the Kafka producer and a JSON response can take: UTF-8 names, bytes or None."""
    for name, value in headers:
        assert type(name) is str and utf8_safe(name)
        assert value is None or type(value) is bytes


# --- unit: the bugs of issue 15 ----------------------------------------------------------------


@pytest.mark.parametrize("name", INT_NAMES)
def test_decode_lenient_bounds_every_integer_header(name: str) -> None:
    # Before: int() of 5,000 digits raised ValueError out of decode_lenient.
    assert decode_lenient([(name, HUGE)]) == {name: None}
    assert decode_lenient([(name, b"9223372036854775808")]) == {name: None}  # 2**63
    assert decode_lenient([(name, b"9223372036854775807")]) == {name: INT64_MAX}
    assert decode_lenient([(name, b"0042")]) == {name: 42}
    for bad in (b"", b"+1", b" 1", b"1 ", b"-1", "\u0661".encode(), "²".encode(), b"1e3", b"0x1"):
        assert decode_lenient([(name, bad)]) == {name: None}, bad


def test_strict_decode_refuses_values_past_int64() -> None:
    # Before: 19-digit values above 2**63 - 1 were accepted as offsets/timestamps.
    for name in (h.ORIGINAL_OFFSET, h.RETRY_TIMESTAMP, h.ORIGINAL_PARTITION, h.RETRY_NUMBER):
        for bad in (b"9223372036854775808", b"9999999999999999999", HUGE):
            with pytest.raises(HeaderError):
                decode_tier_envelope(good_tier_headers(**{name: bad}))
    env = decode_tier_envelope(good_tier_headers(retryd_original_offset=b"9223372036854775807"))
    assert env.original_offset == INT64_MAX


def test_parse_uint() -> None:
    assert parse_uint("0") == 0 and parse_uint("9" * 18) == int("9" * 18)
    assert parse_uint("9" * 5000) is None and parse_uint("") is None and parse_uint("٣") is None


def test_route_malformed_survives_huge_digit_headers() -> None:
    # Before: ValueError from decode_lenient on the poll thread (the worker exited).
    source: list[tuple[str, bytes | None]] = [("trace", b"t1"), *((n, HUGE) for n in INT_NAMES)]
    route = route_malformed(PLAN, "retry_5m", 2, 99, 1_000, source, "bad retry_number", 5_000)
    assert route.topic == "failed" and route.dead_reason == h.DEAD_MALFORMED
    got = dict(route.headers)
    assert got[h.ORIGINAL_PARTITION] == b"2" and got[h.ORIGINAL_OFFSET] == b"99"
    assert got[h.RETRY_NUMBER] == b"0" and ("trace", b"t1") in route.headers


def test_failed_record_views_survive_huge_digit_headers() -> None:
    # Before: GET /v1/failed answered 500, a bulk replay job failed ("internal error").
    rec = FailedRecord(
        "failed", 0, 3, 1_000, b"k", b"v", good_tier_headers(**dict.fromkeys(INT_NAMES, HUGE))
    )
    assert rec.original_partition is None and rec.original_topic == "orders"
    assert RecordFilter(original_topic="orders").matches(rec)
    out = render_record(rec, 1024)
    assert out["retryd"][h.ORIGINAL_OFFSET] is None
    json.dumps(out).encode("utf-8")


def test_bytes_names_str_values_and_odd_items_are_read_not_raised() -> None:
    # Before: bytes names raised TypeError (bytes.startswith(str)), str values with lone
    # surrogates raised UnicodeEncodeError, non-pairs raised ValueError.
    headers: list[Any] = [
        (b"retry_number", b"3"),
        ("retryd_original_topic", "orders"),
        (b"\xff\xfename", b"x"),
        ("lone-\udcff", "v\udcff"),
        ("three", b"a", b"b"),
        42,
        (None, b"x"),
        ("int-value", 7),
        ["as-list", b"ok"],
    ]
    assert decode_lenient(headers) == {h.RETRY_NUMBER: 3, h.ORIGINAL_TOPIC: "orders"}
    users = user_headers(headers)
    assert_clean(users)
    assert [n for n, _ in users] == ["\ufffd\ufffdname", "lone-?", "as-list"]
    assert header_value(headers, "retry_number") == b"3"
    assert retryd_headers(headers) == {h.RETRY_NUMBER: b"3", h.ORIGINAL_TOPIC: b"orders"}
    with pytest.raises(HeaderError):
        decode_tier_envelope(headers)
    rec = FailedRecord("failed", 0, 0, 0, None, None, headers)
    assert rec.original_topic == "orders"
    json.dumps(render_record(rec, 64)).encode("utf-8")


def test_the_client_shape_still_takes_the_fast_path_unchanged() -> None:
    headers: list[tuple[str, bytes | None]] = [("a", b"1"), ("retry_number", b"2"), ("b", None)]
    assert user_headers(headers) == [("a", b"1"), ("b", None)]
    assert retryd_headers(headers) == {"retry_number": b"2"}
    assert user_headers([("grüße", b"x")]) == [("grüße", b"x")]


def test_coord_parse_is_bounded() -> None:
    assert Coord.parse("t/1/2") == Coord("t", 1, 2)
    for bad in ("t/1/" + "9" * 5000, "t/\u0661/2", "t/1/9223372036854775808", "t//2"):
        with pytest.raises(ValueError):
            Coord.parse(bad)


class FlakyMessage:
    """A consumed message whose ``headers()`` fails like confluent-kafka's on a bad name."""

    def __init__(self, second: Any) -> None:
        self.calls = 0
        self.second = second

    def headers(self) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise SystemError("returned a result with an exception set")
        if isinstance(self.second, BaseException):
            raise self.second
        return self.second


def test_message_headers_never_raises_and_reads_at_most_twice() -> None:
    msg = FlakyMessage([("ok", b"1")])
    got, problem = message_headers(msg)
    assert got == [("ok", b"1")] and problem is not None and msg.calls == 2
    msg = FlakyMessage(SystemError("again"))
    assert message_headers(msg) == ([], "headers cannot be decoded: SystemError")

    class Fine:
        def headers(self) -> list[tuple[str, bytes | None]]:
            return [("a", b"1"), ("b", None)]

    assert message_headers(Fine()) == ([("a", b"1"), ("b", None)], None)


# --- the list confluent-kafka leaves after a name that is not UTF-8 ----------------------------


def null_name_tuple(value: bytes | None) -> tuple[Any, ...]:
    """A 2-tuple whose name slot is NULL, as ``c_headers_to_py`` builds one for a name that
    ``PyUnicode_FromString`` cannot decode (reading it crashes the interpreter)."""
    item = tuple([str(object()), value])  # a fresh tuple and name, never a shared constant
    slot = ctypes.c_void_p.from_address(id(item) + tuple.__basicsize__)
    slot.value = None  # the name's reference is leaked on purpose: nothing may free it twice
    return item


POISONED_SCRIPT = textwrap.dedent(
    """
    import json
    from tests.unit.test_header_fuzz import PLAN, null_name_tuple
    from retryd.policy import headers as h
    from retryd.policy.routing import route_malformed
    from retryd.replay.records import FailedRecord, render_record

    poisoned = [
        ("retry_number", b"2"),
        null_name_tuple(b"x"),
        ("retryd_original_topic", b"orders"),
        null_name_tuple(None),
        ("trace", b"t"),
    ]
    assert h.decode_lenient(poisoned) == {"retry_number": 2, "retryd_original_topic": "orders"}
    route = route_malformed(PLAN, "retry_5m", 0, 1, 0, poisoned, "names not UTF-8", 0)
    assert ("trace", b"t") in route.headers and route.dead_reason == "malformed"
    rec = FailedRecord("failed", 0, 0, 0, None, None, poisoned)
    assert rec.original_topic == "orders"
    json.dumps(render_record(rec, 64))
    assert h.clean_headers(poisoned) == [
        ("retry_number", b"2"), ("retryd_original_topic", b"orders"), ("trace", b"t")
    ]

    class Msg:  # raises the first time, then returns its cached list (confluent-kafka 2.x)
        calls = 0
        def headers(self):
            self.calls += 1
            if self.calls == 1:
                raise SystemError("returned a result with an exception set")
            return poisoned

    got, problem = h.message_headers(Msg())
    assert got == h.clean_headers(poisoned), got
    assert problem == "2 header(s) dropped: their names are not UTF-8", problem
    print("survived")
    """
)


def test_lists_with_null_names_are_read_without_touching_them() -> None:
    # A subprocess: on code that unpacks such a tuple the interpreter dies (SIGSEGV).
    proc = subprocess.run(
        [sys.executable, "-c", POISONED_SCRIPT], cwd=REPO, capture_output=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.strip() == b"survived", (
        proc.returncode,
        proc.stderr[-2000:],
    )


# --- fuzz --------------------------------------------------------------------------------------

digits = st.integers(0, 10_000).map(lambda n: b"9" * n) | st.text("0123456789", max_size=40).map(
    str.encode
)
values: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.binary(max_size=64),
    digits,
    st.sampled_from([b"", b"-1", b"+1", b" 7", "٣".encode(), b"\xff\xfe", b"orders"]),
    st.text(max_size=20),  # str values, lone surrogates included
    st.integers(),
    st.builds(bytearray, st.binary(max_size=8)),
)
names: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(RETRYD_NAMES),
    st.sampled_from(RETRYD_NAMES).map(str.encode),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.just("retryd_\udcff"),
    st.none(),
    st.integers(),
)
items: st.SearchStrategy[Any] = st.one_of(
    st.tuples(names, values),
    st.tuples(names, values),
    st.tuples(names, values),
    st.lists(st.one_of(names, values), max_size=3),
    st.tuples(names, values, values),
    st.integers(),
    st.none(),
    st.binary(max_size=4),
)
header_lists: st.SearchStrategy[Any] = st.one_of(
    st.lists(items, max_size=30),
    st.lists(items, max_size=30).map(tuple),
    st.lists(st.tuples(names, values), max_size=30).map(iter),
    st.none(),
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(header_lists)
def test_fuzz_strict_envelope_raises_header_error_only(headers: Any) -> None:
    try:
        env = decode_tier_envelope(headers)
    except HeaderError:
        return
    for value in (env.original_partition, env.original_offset, env.retry_number):
        assert 0 <= value <= INT64_MAX
    assert env.retry_timestamp is not None and 0 <= env.retry_timestamp <= INT64_MAX


@FUZZ
@given(header_lists)
def test_fuzz_lenient_decode_never_raises(headers: Any) -> None:
    out = decode_lenient(headers)
    for name, value in out.items():
        assert h.is_retryd_header(name) and utf8_safe(name)
        if name in h._INT_HEADERS:
            assert value is None or (type(value) is int and 0 <= value <= INT64_MAX)
        else:
            assert value is None or (type(value) is str and utf8_safe(value))


@FUZZ
@given(header_lists, st.text(max_size=40))
def test_fuzz_route_malformed_never_raises(headers: Any, problem: str) -> None:
    route = route_malformed(PLAN, "retry_5m", 1, 2, 3, headers, problem, 4, "g")
    assert route.topic == "failed" and route.dead_reason == h.DEAD_MALFORMED
    assert_clean(route.headers)
    parsed = decode_lenient(route.headers)
    assert parsed[h.GROUP] == "g" and parsed[h.DEAD_REASON] == h.DEAD_MALFORMED
    assert all(type(parsed[n]) is int for n in (h.ORIGINAL_PARTITION, h.ORIGINAL_OFFSET))


@FUZZ
@given(header_lists)
def test_fuzz_header_helpers_never_raise(headers: Any) -> None:
    listed: Any = (
        list(headers) if headers is not None and not isinstance(headers, list | tuple) else headers
    )
    for fn in (clean_headers, user_headers):
        assert_clean(fn(listed))
    found = retryd_headers(listed)
    assert all(v is None or type(v) is bytes for v in found.values())
    assert header_value(listed, h.RETRY_NUMBER) in (None, *(v for _, v in clean_headers(listed)))
    env = h.envelope_for_source("orders", 0, 0, 0)
    assert_clean(routed_headers(listed, env))
    assert_clean(replay_headers(listed, replay_id="r", replayed_from="failed/0/1"))
    result = HandlerResult(Outcome.RETRY, "ValueError", "boom")
    assert_clean(RoutePlanner(PLAN).route("orders", 0, 1, 2, 0, None, listed, result, 5).headers)


@FUZZ
@given(header_lists, st.sampled_from([0, 16, 4096]))
def test_fuzz_failed_record_views_never_raise(headers: Any, preview: int) -> None:
    listed: Any = (
        list(headers) if headers is not None and not isinstance(headers, list | tuple) else headers
    )
    rec = FailedRecord("failed", 0, 5, 1_000, b"k", b"\xffv", listed if listed is not None else [])
    assert rec.original_topic is None or type(rec.original_topic) is str
    assert rec.original_partition is None or 0 <= rec.original_partition <= INT64_MAX
    rec.text_header(h.ERROR_CLASS)
    RecordFilter(original_topic="orders", error_class="E", dead_reason="exhausted").matches(rec)
    out = render_record(rec, preview)
    json.dumps(out, ensure_ascii=False).encode("utf-8")  # what the sidecar's JSON response does
    FailedRecordOut(**out)  # the API's response model accepts it


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 20_000), st.sampled_from(RETRYD_NAMES))
def test_fuzz_many_repeated_headers(count: int, name: str) -> None:
    headers: list[tuple[str, bytes | None]] = [
        (name, HUGE if i % 2 else b"\xff") for i in range(count)
    ]
    headers.append((name, b"5"))  # the last occurrence wins
    assert decode_lenient(headers)[name] in (5, "5")
    route_malformed(PLAN, "t", 0, 0, 0, headers, "p", 0)
    render_record(FailedRecord("failed", 0, 0, 0, None, None, headers), 16)
