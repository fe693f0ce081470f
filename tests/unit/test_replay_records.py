"""Pure logic of failed-record previews, filters, cursors and coordinates."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retryd.policy.headers import Envelope, routed_headers
from retryd.replay.errors import InvalidRequest
from retryd.replay.records import (
    Coord,
    FailedRecord,
    RecordFilter,
    decode_cursor,
    encode_cursor,
    key_from,
    render_bytes,
    render_record,
)


def _rec(**kw: object) -> FailedRecord:
    env = Envelope(
        "orders",
        1,
        42,
        1000,
        retry_number=3,
        error_class="ValueError",
        error_message="bad",
        dead_reason="exhausted",
    )
    base: dict = dict(
        topic="failed",
        partition=0,
        offset=7,
        timestamp=5000,
        key=b"k",
        value=b"v",
        headers=routed_headers([("trace", b"t")], env),
    )
    base.update(kw)
    return FailedRecord(**base)


def test_render_text_and_binary_and_truncation() -> None:
    assert render_bytes(None, 10) == {"encoding": None, "data": None, "size": 0, "truncated": False}
    assert render_bytes("héllo".encode(), 100)["data"] == "héllo"
    out = render_bytes("héllo".encode(), 2)  # cut inside the two-byte é: dropped, still text
    assert out == {"encoding": "utf-8", "data": "h", "size": 6, "truncated": True}
    raw = b"\xff\x00\x01"
    out = render_bytes(raw, 2)
    assert out["encoding"] == "base64" and base64.b64decode(out["data"]) == raw[:2]
    assert out["truncated"] and out["size"] == 3


def test_render_record_decodes_envelope_and_user_headers() -> None:
    view = render_record(_rec(), 100)
    assert view["coordinate"] == "failed/0/7"
    assert view["retryd"]["retryd_original_topic"] == "orders"
    assert view["retryd"]["retry_number"] == 3
    assert [h["name"] for h in view["headers"]] == ["trace"]


def test_filter_matches_each_field() -> None:
    rec = _rec()
    assert RecordFilter().matches(rec)
    assert RecordFilter(
        original_topic="orders",
        error_class="ValueError",
        dead_reason="exhausted",
        key=b"k",
        partition=0,
    ).matches(rec)
    assert not RecordFilter(original_topic="other").matches(rec)
    assert not RecordFilter(error_class="KeyError").matches(rec)
    assert not RecordFilter(dead_reason="malformed").matches(rec)
    assert not RecordFilter(key=b"x").matches(rec)
    assert not RecordFilter(partition=1).matches(rec)
    assert RecordFilter(since_ms=5000, until_ms=5001).matches(rec)
    assert not RecordFilter(until_ms=5000).matches(rec)
    assert not RecordFilter(since_ms=5001).matches(rec)
    assert not RecordFilter(original_topic="orders").matches(_rec(headers=[]))


@given(st.dictionaries(st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), max_size=50))
def test_cursor_round_trip(positions: dict[int, int]) -> None:
    assert decode_cursor(encode_cursor(positions)) == positions


@pytest.mark.parametrize(
    "bad",
    [
        "!!!",
        "e30",
        base64.urlsafe_b64encode(b"[1]").decode(),
        base64.urlsafe_b64encode(b'{"a":1}').decode(),
        base64.urlsafe_b64encode(b'{"1":-1}').decode(),
        base64.urlsafe_b64encode(b'{"1":true}').decode(),
        base64.urlsafe_b64encode(b'{"99999999999":1}').decode(),
        "x" * 70000,
        # Hostile shapes: deep nesting (RecursionError in a JSON parser), nested objects,
        # non-ASCII, huge numbers, floats, padding games.
        base64.urlsafe_b64encode(b"[" * 6000 + b"]" * 6000).decode(),
        base64.urlsafe_b64encode(b'{"0":' * 3000 + b"1" + b"}" * 3000).decode(),
        base64.urlsafe_b64encode(b'{"0":{"0":1}}').decode(),
        base64.urlsafe_b64encode(b'{"0":1e3}').decode(),
        base64.urlsafe_b64encode(b'{"0":99999999999999999999}').decode(),
        base64.urlsafe_b64encode(b'{ "0": 1 }').decode(),
        "\u00e9" * 10,
        "====",
    ],
)
def test_bad_cursors_are_rejected_readably(bad: str) -> None:
    if bad == "e30":  # {} is a valid (empty) cursor
        assert decode_cursor(bad) == {}
        return
    with pytest.raises(InvalidRequest, match="cursor"):
        decode_cursor(bad)


def test_key_from_text_or_base64() -> None:
    assert key_from("abc", None) == (b"abc", False)
    assert key_from(None, base64.b64encode(b"\x00\x01").decode()) == (b"\x00\x01", False)
    assert key_from(None, None) == (None, False)
    assert key_from("a", "YQ==") == (b"a", False)
    assert key_from("b", "YQ==") == (b"a", True)  # contradictory: matches nothing
    assert not RecordFilter(key=b"k", nothing=True).matches(_rec())
    with pytest.raises(InvalidRequest, match="base64"):
        key_from(None, "@@@")


def test_coord_round_trip() -> None:
    c = Coord("a.b-c_d", 3, 99)
    assert str(c) == "a.b-c_d/3/99" and Coord.parse(str(c)) == c
    with pytest.raises(ValueError):
        Coord.parse("nope")
