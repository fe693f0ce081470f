"""The single-record HttpHandler (its lean keep-alive client) against the Go business
service, and the lean client's edge cases against scripted asyncio servers."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from bench import goservice
from retryd.handlers.base import Message
from retryd.handlers.http_handler import HttpHandler
from retryd.policy.classify import HandlerResult, Outcome


@pytest.fixture(scope="module")
def service() -> Iterator[goservice.Service]:
    with goservice.start(fail_match="BOOM") as svc:
        yield svc


def run_calls(url: str, messages: list[Message], in_flight: int = 4) -> list[HandlerResult]:
    async def go() -> list[HandlerResult]:
        handler = HttpHandler(url, timeout_s=5, max_connections=in_flight)
        sem = asyncio.Semaphore(in_flight)

        async def one(m: Message) -> HandlerResult:
            async with sem:
                return await handler.acall(m)

        try:
            return await asyncio.gather(*(one(m) for m in messages))
        finally:
            await handler.aclose()

    return asyncio.run(go())


def test_launcher_stops_by_pid() -> None:
    svc = goservice.start()
    assert svc.stats() == {"requests": 0, "records": 0}
    assert svc.stop() is not None
    with pytest.raises(ProcessLookupError):
        os.kill(svc.pid, 0)


def test_outcomes_and_error_name(service: goservice.Service) -> None:
    got = run_calls(
        service.url,
        [
            Message(key=b"k", value=b"fine", topic="orders"),
            Message(key=b"k", value=b"a BOOM", topic="orders"),
            Message(key=b"BOOM", value=None, topic="orders"),
            Message(key=None, value=b"", topic="orders"),
        ],
    )
    assert [r.outcome for r in got] == [
        Outcome.SUCCESS,
        Outcome.RETRY,
        Outcome.RETRY,
        Outcome.SUCCESS,
    ]
    assert (got[1].error_class, got[1].error_name) == ("http_503", "matched")


def test_many_calls_over_a_bounded_pool(service: goservice.Service) -> None:
    before = service.stats()["requests"]
    messages = [Message(key=b"k%d" % i, value=b"v", topic="t", offset=i) for i in range(2000)]
    got = run_calls(service.url, messages, in_flight=64)
    assert all(r.outcome is Outcome.SUCCESS for r in got)
    assert service.stats()["requests"] - before == 2000


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return await reader.readexactly(length)


def _with_server(serve: Serve, calls: int) -> tuple[list[HandlerResult], int]:
    """``calls`` sequential acalls against a scripted server: (results, connections made)."""

    async def go() -> tuple[list[HandlerResult], int]:
        connections = 0

        async def counted(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            try:
                await serve(r, w)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                w.close()

        server = await asyncio.start_server(counted, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        handler = HttpHandler(f"http://127.0.0.1:{port}/x", timeout_s=5, max_connections=2)
        try:
            out = []
            for i in range(calls):
                out.append(await handler.acall(Message(value=b"v%d" % i, topic="t")))
                await asyncio.sleep(0.05)  # lets the server's close arrive before the next call
            return out, connections
        finally:
            await handler.aclose()
            server.close()
            await server.wait_closed()

    return asyncio.run(go())


def test_server_closing_idle_connections_is_not_an_error() -> None:
    async def one_answer_then_close(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()  # then closes, without saying "Connection: close"

    got, connections = _with_server(one_answer_then_close, 4)
    assert [r.outcome for r in got] == [Outcome.SUCCESS] * 4
    assert connections == 4


def test_answer_delimited_by_close_and_chunked_answers() -> None:
    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (b'{"sta', b'tus": "DEAD"}', b""))
        w.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json"
            b"\r\n\r\n" + chunks
        )
        await _read_request(r)
        w.write(b"HTTP/1.0 503 Busy\r\n\r\nno length, ends at close")
        await w.drain()

    got, connections = _with_server(serve, 2)
    assert [(r.outcome, r.error_class) for r in got] == [
        (Outcome.DEAD, "http_200"),
        (Outcome.RETRY, "http_503"),
    ]
    assert got[1].error_message == "no length, ends at close"
    assert connections == 1


def test_garbage_answer_is_a_connection_error() -> None:
    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b"SMTP ready\r\n\r\n")
        await w.drain()
        await r.read()

    got, _ = _with_server(serve, 1)
    assert (got[0].outcome, got[0].error_class) == (Outcome.RETRY, "connection_error")


@pytest.mark.parametrize(
    "message",
    [
        Message(key=b"k", value=b"v", topic="orders", partition=2, offset=9),
        Message(
            key=None,
            value=None,
            headers=[("trace", b"x"), ("bin", b"\x00"), ("dup", b"a"), ("dup", None)],
            topic="tópico",
            retry_number=4,
            original_topic="line\r\nX-Injected: 1",
        ),
    ],
)
def test_lean_request_has_the_contract_headers(message: Message) -> None:
    # The lean client's one-string request carries exactly request_headers(), the contract.
    from retryd.handlers.http_handler import request_bytes, request_headers

    data = request_bytes(message, "POST /x HTTP/1.1\r\nHost: h\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    assert lines[:2] == ["POST /x HTTP/1.1", "Host: h"]
    sent = sorted(tuple(line.split(": ", 1)) for line in lines[2:])
    expected = [*request_headers(message), ("Content-Length", str(len(message.value or b"")))]
    assert sent == sorted(expected)
    assert body == (message.value or b"")


def test_http_over_a_unix_socket(tmp_path: Path) -> None:
    from retryd.handlers.loader import load_handler

    sock = tmp_path / "svc.sock"
    with goservice.start(unix=str(sock), fail_match="BOOM") as svc:
        assert svc.url.startswith("http+unix://%2F")
        handler = load_handler(svc.url, timeout_s=5, max_in_flight=4)
        assert isinstance(handler, HttpHandler)
        got = run_calls(
            svc.url,
            [
                Message(key=b"k", value=b"ok", topic="t"),
                Message(key=b"k", value=b"BOOM", topic="t"),
            ],
        )
        assert [r.outcome for r in got] == [Outcome.SUCCESS, Outcome.RETRY]
        assert svc.stats()["requests"] == 2


def test_endless_response_head_is_a_connection_error() -> None:
    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(20_000):  # headers that never end
            w.write(b"X-Filler-%d: %s\r\n" % (i, b"y" * 64))
            if i % 100 == 0:
                await w.drain()
        await r.read()

    got, _ = _with_server(serve, 1)
    assert (got[0].outcome, got[0].error_class) == (Outcome.RETRY, "connection_error")
    assert "bytes of head" in (got[0].error_message or "")
