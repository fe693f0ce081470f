"""The lean client's framing against h11 (issue 31): hypothesis writes what a server might send
on one keep-alive connection for a few calls in a row (interim 1xx answers, Content-Length,
chunked and close-delimited bodies, trailers, ``Connection: close``, oversized heads and
trailers, garbage), cut into the pieces a socket might deliver. Whatever the client makes of
each call (the answer's status, body and two headers and whether the connection carries the
next call; or a failure; or still waiting) must be what h11's client state machine makes of
the same bytes, with this client's own rules on top (``retryd.handlers.http_framing``'s
docstring): interim answers skipped, one bound on everything that is not body, the body cut at
``max_body``, bytes after an answer end the connection.

Driven are the real ``ResponseReader`` and the pool's real connection protocol (``_Conn``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retryd.handlers.http_framing import (
    HttpFramingError,
    Response,
    ResponseReader,
)
from retryd.handlers.http_pool import _Conn
from tests.unit.http_streams import MARKERS, Calls, connection

Verdict = tuple[Any, ...]  # ("ok", status, body, content type, error header, reused) | ...
FAIL: Verdict = ("fail",)
PENDING: Verdict = ("pending",)  # no answer yet: the call would end at its deadline

REQUEST = h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")])


# -- the oracle --------------------------------------------------------------------------------


def _last(headers: Any, name: bytes) -> str | None:
    values = [v for n, v in headers if n == name]
    return values[-1].decode("latin-1") if values else None


def h11_verdict(
    conn: h11.Connection, data: bytes, eof: bool, max_body: int, max_head: int
) -> Verdict:
    """What h11 makes of one call's bytes, with this client's rules on top. ``conn`` has just
    sent the request."""
    if data:  # (h11 reads no bytes as the end of the connection)
        conn.receive_data(data)
    if eof:
        conn.receive_data(b"")
    left = len(data)
    not_body = 0  # every byte h11 consumed that is not in a Data event
    response: h11.Response | None = None
    body = b""
    try:
        while True:
            event = conn.next_event()
            now = len(conn.trailing_data[0])
            used, left = left - now, now
            not_body += used - (len(event.data) if type(event) is h11.Data else 0)
            if event is h11.NEED_DATA:  # what is left is an incomplete head, line or trailer
                return FAIL if not_body + left > max_head else PENDING
            if not_body > max_head:
                return FAIL
            if type(event) is h11.Response:
                response = event
            elif type(event) is h11.Data:
                body += event.data
                if len(body) >= max_body:  # cut: the rest is never read
                    assert response is not None
                    return _ok(response, body[:max_body], reused=False)
            elif type(event) is h11.EndOfMessage:
                assert response is not None
                clean = conn.our_state is h11.DONE and conn.their_state is h11.DONE
                return _ok(response, body, reused=clean and not left and not eof)
            elif type(event) is not h11.InformationalResponse:
                return FAIL  # ConnectionClosed before the answer's end
    except h11.ProtocolError:
        return FAIL


def _ok(response: h11.Response, body: bytes, reused: bool) -> Verdict:
    ctype = _last(response.headers, b"content-type")
    named = _last(response.headers, b"x-retryd-error")
    return ("ok", response.status_code, body, ctype, named, reused)


def reader_verdict(reader: ResponseReader, pieces: list[bytes], eof: bool) -> Verdict:
    """What ``ResponseReader`` makes of one call's bytes, delivered in ``pieces``."""
    reader.begin()
    response: Response | None = None
    try:
        for piece in pieces:
            got = reader.feed(piece)
            if got is not None:
                assert response is None, "one answer per call"
                response = got
        if eof:
            got = reader.feed_eof()
            response = response or got
    except HttpFramingError:
        assert response is None, "no failure after the answer"
        return FAIL
    if response is None:
        return FAIL if eof else PENDING
    reused = reader.reusable and not eof
    return (
        "ok",
        response.status,
        response.body,
        response.content_type,
        response.error_header,
        reused,
    )


def _h11_client() -> h11.Connection:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=1 << 40)
    return conn


def _expected(calls: Calls, max_body: int, max_head: int) -> Iterator[Verdict]:
    """h11's verdict for each call, on one connection while it stays reusable."""
    conn: h11.Connection | None = None
    for pieces, eof in calls:
        if conn is None:
            conn = _h11_client()
        else:
            conn.start_next_cycle()
        conn.send(REQUEST)
        conn.send(h11.EndOfMessage())
        verdict = h11_verdict(conn, b"".join(pieces), eof, max_body, max_head)
        yield verdict
        if verdict[0] != "ok" or not verdict[-1]:
            conn = None  # a new connection for the next call


def _check_own_answer(verdicts: list[Verdict]) -> None:
    """No call gets another call's answer: a marker in an answer is that call's."""
    for call, verdict in enumerate(verdicts):
        if verdict[0] == "ok":
            for other, marker in enumerate(MARKERS):
                if other != call:
                    assert marker not in verdict[2]
                    assert verdict[4] != marker.decode()


@settings(max_examples=3000, deadline=None)
@given(st.binary(min_size=300, max_size=600))
def test_reader_agrees_with_h11(tape: bytes) -> None:
    calls, max_body, max_head = connection(tape)
    expected = list(_expected(calls, max_body, max_head))
    got = []
    reader: ResponseReader | None = None
    for pieces, eof in calls:
        reader = reader or ResponseReader(max_body, max_head)
        verdict = reader_verdict(reader, pieces, eof)
        got.append(verdict)
        if verdict[0] != "ok" or not verdict[-1]:
            reader = None  # a new connection for the next call
    assert got == expected
    _check_own_answer(got)


# -- the same through the pool's connection protocol -------------------------------------------


class _Transport:
    def __init__(self) -> None:
        self.aborted = False

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


class _Pool:
    def __init__(self, max_body: int) -> None:
        self.max_body = max_body

    def lost(self, conn: _Conn) -> None:
        pass


def conn_verdict(
    conn: _Conn, transport: _Transport, pieces: list[bytes], eof: bool, loop: Any
) -> Verdict:
    """One call through ``_Conn`` as ``HttpPool.request`` drives it: the answer is taken as
    soon as it resolves the call (later bytes find the connection idle), the connection is
    kept only if ``reusable()`` then."""
    waiter = conn.send(b"POST / HTTP/1.1\r\n\r\n", loop)
    reusable = False

    def settle() -> None:
        nonlocal reusable
        if transport.aborted and not conn.closed:  # the loop reports the loss next
            conn.connection_lost(None)
        if waiter.done() and conn.waiter is waiter:  # the caller resumes with its answer
            conn.waiter = None
            if not waiter.exception():
                conn.used = True
                reusable = conn.reusable()
                if not reusable:
                    conn.close()
            settle()

    for piece in pieces:
        if conn.closed:
            break
        conn.data_received(piece)
        settle()
    if eof and not conn.closed:
        assert conn.eof_received() is False
        conn.connection_lost(None)
        settle()
    if not waiter.done():
        return PENDING
    if waiter.exception() is not None:
        assert isinstance(waiter.exception(), HttpFramingError | ConnectionError)
        assert conn.closed, "a failed call's connection is closed"
        return FAIL
    response = waiter.result()
    reused = reusable and not conn.closed
    ctype, named = response.content_type, response.error_header
    return ("ok", response.status, response.body, ctype, named, reused)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()  # futures only: never run
    yield loop
    loop.close()


@settings(max_examples=1000, deadline=None)
@given(tape=st.binary(min_size=300, max_size=600))
def test_pool_connection_agrees_with_h11(tape: bytes, loop: asyncio.AbstractEventLoop) -> None:
    calls, max_body, max_head = connection(tape)
    expected = list(_expected(calls, max_body, max_head))
    got = []
    conn: _Conn | None = None
    transport = _Transport()
    for pieces, eof in calls:
        if conn is None:
            conn = _Conn(_Pool(max_body))  # type: ignore[arg-type]
            conn.reader = ResponseReader(max_body, max_head)
            transport = _Transport()
            conn.connection_made(transport)  # type: ignore[arg-type]
        verdict = conn_verdict(conn, transport, pieces, eof, loop)
        got.append(verdict)
        if verdict[0] != "ok" or not verdict[-1]:
            conn = None
    assert got == expected
    _check_own_answer(got)
