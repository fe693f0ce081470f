"""The lean client's framing on answers issue 31 was about, byte by byte (no I/O). The general
agreement with h11 is test_http_framing_oracle.py; these are the named cases."""

from __future__ import annotations

import pytest

from retryd.handlers.http_framing import (
    MAX_HEAD_BYTES,
    HttpFramingError,
    Response,
    ResponseReader,
)

FINAL = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops"
EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"


def _feed(reader: ResponseReader, data: bytes, piece: int) -> Response | None:
    got = None
    for at in range(0, len(data), piece):
        got = reader.feed(data[at : at + piece]) or got
    return got


@pytest.mark.parametrize("piece", [1, 7, 10_000])
def test_interim_answers_are_skipped(piece: int) -> None:
    reader = ResponseReader(max_body=1024)
    data = b"HTTP/1.1 100 Continue\r\n\r\n" + EARLY_HINTS + FINAL
    got = _feed(reader, data, piece)
    assert got is not None and (got.status, got.body) == (500, b"oops")
    assert reader.reusable


def test_switching_protocols_never_asked_for_is_an_error() -> None:
    with pytest.raises(HttpFramingError, match="101"):
        ResponseReader(max_body=1024).feed(b"HTTP/1.1 101 Switching Protocols\r\n\r\n" + FINAL)


def _padded_head(status: bytes, size: int, *fields: bytes) -> bytes:
    """A head of exactly ``size`` bytes."""
    bare = b"HTTP/1.1 " + status + b"\r\n" + b"".join(f + b"\r\n" for f in fields)
    bare += b"X-Pad: "
    return bare + b"p" * (size - len(bare) - 4) + b"\r\n\r\n"


@pytest.mark.parametrize("over", [0, 1])
def test_interim_heads_and_the_head_share_one_bound(over: int) -> None:
    third = MAX_HEAD_BYTES // 3
    last = MAX_HEAD_BYTES - 2 * third + over
    data = (
        _padded_head(b"103 Early Hints", third)
        + _padded_head(b"103 Early Hints", third)
        + _padded_head(b"200 OK", last, b"Content-Length: 2")
        + b"ok"
    )
    reader = ResponseReader(max_body=1024)
    if over:
        with pytest.raises(HttpFramingError, match="more than"):
            _feed(reader, data, 4096)
    else:
        got = _feed(reader, data, 4096)
        assert got is not None and got.body == b"ok"


@pytest.mark.parametrize(
    "endless",
    [
        b"0\r\nX-Trailer: " + b"t" * 4096,  # a trailer that never ends
        b"1;ext=" + b"e" * 4096,  # a chunk-size line that never ends
    ],
)
def test_nothing_but_body_is_buffered_past_the_bound(endless: bytes) -> None:
    reader = ResponseReader(max_body=1024)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n"
    fed = len(head)
    reader.feed(head)
    with pytest.raises(HttpFramingError, match="more than"):
        reader.feed(endless[:64])
        for _ in range(MAX_HEAD_BYTES // len(endless) + 3):  # the server keeps sending
            reader.feed(endless[64:])
            fed += len(endless)
    assert fed <= MAX_HEAD_BYTES + len(endless)  # the client gave up at the bound


def test_trailers_count_against_the_bound() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    room = MAX_HEAD_BYTES - len(head) - len(b"0\r\n")
    fits = b"0\r\nX-T: " + b"t" * (room - len(b"X-T: \r\n\r\n")) + b"\r\n\r\n"
    got = ResponseReader(max_body=1024).feed(head + fits)
    assert got is not None and got.status == 200
    with pytest.raises(HttpFramingError, match="more than"):
        ResponseReader(max_body=1024).feed(head + fits.replace(b"X-T:", b"X-T: t"))


def test_bytes_after_the_answer_end_the_connection() -> None:
    reader = ResponseReader(max_body=1024)
    got = reader.feed(b"HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\nabc")
    assert got is not None and got.status == 204 and got.body == b""
    assert not reader.reusable


def test_an_answer_cut_short_is_an_error() -> None:
    reader = ResponseReader(max_body=1024)
    assert reader.feed(FINAL[:-1]) is None
    with pytest.raises(HttpFramingError, match="closed"):
        reader.feed_eof()


@pytest.mark.parametrize("piece", [1, 10_000])
@pytest.mark.parametrize("max_body", [3, 4])
def test_the_body_is_cut_at_max_body(max_body: int, piece: int) -> None:
    """Reaching ``max_body`` ends the call (the rest is never read) and the connection."""
    reader = ResponseReader(max_body=max_body)
    got = _feed(reader, FINAL, piece)
    assert got is not None and got.body == b"oops"[:max_body]
    assert not reader.reusable


def test_a_body_nested_past_the_recursion_limit_has_no_status_word() -> None:
    """``classify.body_status`` read a deeply nested JSON body with ``json.loads`` and let
    ``RecursionError`` out (issue 31 fault 3): the status code decides instead."""
    from retryd.policy.classify import Outcome, body_status, classify_http

    deep = b"[" * 100_000 + b"]" * 100_000
    assert body_status(deep, "application/json") is None
    assert classify_http(500, deep, "application/json").outcome is Outcome.RETRY
