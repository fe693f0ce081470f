"""The header codec: envelope round trip, replace-not-append, truncation, malformed input."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retryd.errors import HeaderError
from retryd.policy import headers as h
from retryd.policy.headers import (
    ERROR_MESSAGE_MAX_BYTES,
    Envelope,
    decode_lenient,
    decode_tier_envelope,
    encode_envelope,
    envelope_for_source,
    header_value,
    is_retryd_header,
    replay_headers,
    routed_headers,
    truncate_utf8,
    user_headers,
)

ms = st.integers(min_value=0, max_value=2**53)
TOPIC_CHARS = "abcdefghijklmnopqrstuvwxyzABC0123456789._-"
topic_names = st.text(alphabet=TOPIC_CHARS, min_size=1, max_size=60).filter(
    lambda t: t not in {".", ".."}  # Kafka forbids these two names
)
# user header names never start with retryd_ and are not the two bare retry headers
user_names = st.text(min_size=0, max_size=20).filter(lambda n: not is_retryd_header(n))
user_values = st.one_of(st.none(), st.binary(max_size=64))
user_header_lists = st.lists(st.tuples(user_names, user_values), max_size=8)

envelopes = st.builds(
    Envelope,
    original_topic=topic_names,
    original_partition=st.integers(0, 100_000),
    original_offset=st.integers(0, 2**63 - 1),
    original_timestamp=ms,
    retry_number=st.integers(1, 1000),
    retry_timestamp=ms,
    first_failure_timestamp=st.one_of(st.none(), ms),
    error_class=st.one_of(st.none(), st.text(max_size=80)),
    error_message=st.one_of(st.none(), st.text(max_size=700)),
    dead_reason=st.one_of(st.none(), st.sampled_from(h.DEAD_REASONS)),
)


def sample_envelope(**kw: object) -> Envelope:
    base = Envelope("orders", 3, 42, 1_700_000_000_000, 1, 1_700_000_300_000, 1_700_000_000_500)
    fields: dict[str, object] = {"error_class": "ValueError", "error_message": "boom", **kw}
    return replace(base, **fields)  # type: ignore[arg-type]


# --- round trip ---------------------------------------------------------------------------------


@given(envelopes)
def test_encode_decode_round_trip(env: Envelope) -> None:
    decoded = decode_tier_envelope(encode_envelope(env))
    expected_message = (
        None if env.error_message is None else truncate_utf8(env.error_message).decode("utf-8")
    )
    # dead_reason only matters on failed_topic; the strict tier decoder does not read it
    assert decoded == replace(env, error_message=expected_message, dead_reason=None)


@given(envelopes)
def test_encoded_values_are_utf8_and_numbers_decimal_ascii(env: Envelope) -> None:
    for name, value in encode_envelope(env):
        assert is_retryd_header(name)
        assert value is not None
        text = value.decode("utf-8")
        if name in (h.RETRY_NUMBER, h.RETRY_TIMESTAMP, h.ORIGINAL_OFFSET, h.ORIGINAL_PARTITION):
            assert text.isascii() and text.isdigit()


def test_header_names_are_the_spec_names() -> None:
    env = sample_envelope(dead_reason=h.DEAD_EXHAUSTED)
    names = [n for n, _ in encode_envelope(env)]
    assert names == [
        "retry_number",
        "retry_timestamp",
        "retryd_original_topic",
        "retryd_original_partition",
        "retryd_original_offset",
        "retryd_original_timestamp",
        "retryd_first_failure_timestamp",
        "retryd_error_class",
        "retryd_error_message",
        "retryd_dead_reason",
    ]


def test_envelope_for_source_and_failed_again() -> None:
    env = envelope_for_source("orders", 2, 7, 1000)
    assert env.retry_number == 0 and env.first_failure_timestamp is None
    first = env.failed_again(
        retry_number=1, due_ms=5000, now_ms=2000, error_class="E", error_message="m"
    )
    second = first.failed_again(
        retry_number=2, due_ms=9000, now_ms=4000, error_class="F", error_message="n"
    )
    assert second.first_failure_timestamp == 2000  # the first failure is remembered
    assert (second.retry_number, second.retry_timestamp, second.error_class) == (2, 9000, "F")
    assert (second.original_topic, second.original_partition, second.original_offset) == (
        "orders",
        2,
        7,
    )


# --- replace, never append ----------------------------------------------------------------------


@given(user=user_header_lists, hops=st.integers(1, 40))
def test_routing_many_hops_replaces_retryd_headers(
    user: list[tuple[str, bytes | None]], hops: int
) -> None:
    headers: list[tuple[str, bytes | None]] = list(user)
    env = envelope_for_source("orders", 0, 1, 1)
    sizes = set()
    for n in range(1, hops + 1):
        env = env.failed_again(
            retry_number=n,
            due_ms=10**12 + n,
            now_ms=10**12,
            error_class="ValueError",
            error_message="x" * 2000,
        )
        headers = routed_headers(headers, env)
        assert headers[: len(user)] == user  # user headers first, unchanged, in order
        assert sum(1 for k, _ in headers if k == h.RETRY_NUMBER) == 1
        assert decode_tier_envelope(headers).retry_number == n
        sizes.add(len(headers))
    assert sizes == {len(user) + len(encode_envelope(env))}
    total = sum(len(k) + len(v or b"") for k, v in headers)
    assert total < sum(len(k) + len(v or b"") for k, v in user) + 1024


def test_user_headers_kept_in_order_with_binary_none_and_repeats() -> None:
    source = [
        ("trace", b"\x00\xff\xfe"),
        (h.RETRY_NUMBER, b"3"),
        ("empty", None),
        ("trace", b"second"),
        ("retryd_error_class", b"Old"),
        ("text", "str value"),
        ("retry_numberish", b"user owned"),
    ]
    out = routed_headers(source, sample_envelope())  # type: ignore[arg-type]
    assert user_headers(out) == [
        ("trace", b"\x00\xff\xfe"),
        ("empty", None),
        ("trace", b"second"),
        ("text", b"str value"),
        ("retry_numberish", b"user owned"),
    ]
    assert header_value(out, h.ERROR_CLASS) == b"ValueError"
    assert [k for k, _ in out].count(h.ERROR_CLASS) == 1


def test_header_value_last_wins() -> None:
    assert header_value([("a", b"1"), ("a", b"2")], "a") == b"2"
    assert header_value([("a", "s")], "a") == b"s"
    assert header_value(None, "a") is None


def test_replay_headers_start_a_fresh_sequence() -> None:
    routed = routed_headers([("u", b"1")], sample_envelope(dead_reason=h.DEAD_EXHAUSTED))
    out = replay_headers(routed, replay_id="job-1", replayed_from="failed_topic/0/9")
    assert out == [("u", b"1"), (h.REPLAY_ID, b"job-1"), (h.REPLAYED_FROM, b"failed_topic/0/9")]
    # replaying a replayed copy does not stack replay headers either
    again = replay_headers(out, replay_id="job-2", replayed_from="failed_topic/0/10")
    assert [k for k, _ in again].count(h.REPLAY_ID) == 1


# --- truncation ---------------------------------------------------------------------------------


@given(st.text(max_size=1200))
def test_error_message_truncated_on_utf8_boundary(text: str) -> None:
    out = truncate_utf8(text)
    full = text.encode("utf-8", errors="replace")
    assert len(out) <= ERROR_MESSAGE_MAX_BYTES
    out.decode("utf-8")  # valid UTF-8: never a cut character
    assert full.startswith(out)
    if len(full) > ERROR_MESSAGE_MAX_BYTES:
        assert len(out) > ERROR_MESSAGE_MAX_BYTES - 4  # at most one character dropped
    else:
        assert out == full


@pytest.mark.parametrize(
    ("char", "expected_len"), [("a", 512), ("é", 512), ("€", 510), ("😀", 512), ("€a", 512)]
)
def test_truncation_multibyte(char: str, expected_len: int) -> None:
    out = truncate_utf8(char * 600)
    assert len(out) == expected_len
    out.decode("utf-8")


def test_truncation_survives_lone_surrogates() -> None:
    out = truncate_utf8("bad \udc80 surrogate")
    assert out.decode("utf-8") == "bad ? surrogate"


def test_encoded_error_message_is_truncated() -> None:
    env = sample_envelope(error_message="é" * 1000)
    value = header_value(encode_envelope(env), h.ERROR_MESSAGE)
    assert value is not None and len(value) == 512


# --- malformed input ----------------------------------------------------------------------------


def good_headers() -> list[tuple[str, bytes | None]]:
    return encode_envelope(sample_envelope())


def with_header(name: str, value: bytes | None) -> list[tuple[str, bytes | None]]:
    return [(k, v) for k, v in good_headers() if k != name] + [(name, value)]


def without(name: str) -> list[tuple[str, bytes | None]]:
    return [(k, v) for k, v in good_headers() if k != name]


@pytest.mark.parametrize(
    "name",
    [h.RETRY_NUMBER, h.RETRY_TIMESTAMP, h.ORIGINAL_TOPIC, h.ORIGINAL_PARTITION, h.ORIGINAL_OFFSET],
)
def test_missing_required_header(name: str) -> None:
    with pytest.raises(HeaderError, match=f"header {name} is missing"):
        decode_tier_envelope(without(name))


@pytest.mark.parametrize("name", [h.RETRY_NUMBER, h.RETRY_TIMESTAMP, h.ORIGINAL_PARTITION])
def test_none_value_counts_as_missing(name: str) -> None:
    with pytest.raises(HeaderError, match="is missing"):
        decode_tier_envelope(with_header(name, None))


@pytest.mark.parametrize(
    "value", [b"", b"abc", b"1.5", b"-1", b"+1", b" 1", b"1 ", b"0x10", "\u0661".encode(), b"1e3"]
)
@pytest.mark.parametrize(
    "name", [h.RETRY_NUMBER, h.RETRY_TIMESTAMP, h.ORIGINAL_OFFSET, h.FIRST_FAILURE_TIMESTAMP]
)
def test_non_digit_and_negative_numbers(name: str, value: bytes) -> None:
    with pytest.raises(HeaderError, match=f"header {name}=.* non-negative decimal integer"):
        decode_tier_envelope(with_header(name, value))


@pytest.mark.parametrize("name", [h.RETRY_NUMBER, h.ORIGINAL_TOPIC, h.ERROR_MESSAGE])
def test_non_utf8(name: str) -> None:
    with pytest.raises(HeaderError, match=f"header {name} is not valid UTF-8"):
        decode_tier_envelope(with_header(name, b"\xff\xfe"))


def test_retry_number_zero_on_a_tier() -> None:
    with pytest.raises(HeaderError, match="retry_number=0 must be >= 1"):
        decode_tier_envelope(with_header(h.RETRY_NUMBER, b"0"))


def test_empty_original_topic() -> None:
    with pytest.raises(HeaderError, match="is empty"):
        decode_tier_envelope(with_header(h.ORIGINAL_TOPIC, b""))


def test_no_headers_at_all() -> None:
    with pytest.raises(HeaderError):
        decode_tier_envelope(None)
    with pytest.raises(HeaderError):
        decode_tier_envelope([])


def test_duplicate_header_last_wins_when_decoding() -> None:
    headers = [*good_headers(), (h.RETRY_NUMBER, b"5")]
    assert decode_tier_envelope(headers).retry_number == 5


def test_error_quotes_are_bounded() -> None:
    with pytest.raises(HeaderError) as info:
        decode_tier_envelope(with_header(h.RETRY_NUMBER, b"x" * 10_000))
    assert len(str(info.value)) < 200


@given(
    st.lists(
        st.tuples(
            st.sampled_from([h.RETRY_NUMBER, h.RETRY_TIMESTAMP, h.ORIGINAL_TOPIC, "user", "x"]),
            st.one_of(st.none(), st.binary(max_size=12)),
        ),
        max_size=10,
    )
)
def test_strict_decoder_only_raises_header_error(headers: list[tuple[str, bytes | None]]) -> None:
    with contextlib.suppress(HeaderError):
        decode_tier_envelope(headers)


# --- lenient decoding ---------------------------------------------------------------------------


def test_decode_lenient_tolerates_bad_values() -> None:
    headers = [
        ("user", b"\xff"),
        (h.RETRY_NUMBER, b"x"),
        (h.RETRY_TIMESTAMP, b"-1"),
        (h.ORIGINAL_TOPIC, b"\xff\xfe"),
        (h.ORIGINAL_PARTITION, "7"),
        (h.ORIGINAL_OFFSET, None),
        (h.ERROR_MESSAGE, b"kaput"),
        (h.DEAD_REASON, b"malformed"),
    ]
    assert decode_lenient(headers) == {
        h.RETRY_NUMBER: None,
        h.RETRY_TIMESTAMP: None,
        h.ORIGINAL_TOPIC: None,
        h.ORIGINAL_PARTITION: 7,
        h.ORIGINAL_OFFSET: None,
        h.ERROR_MESSAGE: "kaput",
        h.DEAD_REASON: "malformed",
    }


@given(envelopes)
def test_decode_lenient_reads_a_good_envelope(env: Envelope) -> None:
    out = decode_lenient(encode_envelope(env))
    assert out[h.RETRY_NUMBER] == env.retry_number
    assert out[h.ORIGINAL_TOPIC] == env.original_topic
    assert out[h.ORIGINAL_OFFSET] == env.original_offset
    assert out.get(h.DEAD_REASON) == env.dead_reason


@given(st.lists(st.tuples(st.text(max_size=30), st.one_of(st.none(), st.binary(max_size=20)))))
def test_decode_lenient_never_raises(headers: list[tuple[str, bytes | None]]) -> None:
    out = decode_lenient(headers)
    assert all(is_retryd_header(k) for k in out)
    assert decode_lenient(None) == {}
