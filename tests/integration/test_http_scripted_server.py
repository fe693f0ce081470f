"""HttpHandler and HttpBulkHandler end to end against a scripted server on 127.0.0.1: an
asyncio server that answers each request with bytes a test chose (interim 1xx answers, endless
trailers, answers no HTTP library would write), to check what the lean client makes of them
over a real socket (issue 31)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import pytest

from retryd.handlers.base import Message
from retryd.handlers.http_bulk import BAD_ANSWER_CLASS, HttpBulkHandler
from retryd.handlers.http_handler import CONNECTION_ERROR_CLASS, HttpHandler
from retryd.policy.classify import HandlerResult, Outcome


@dataclass
class Seen:
    conn: int  # which connection the request came on (in accept order)
    body: bytes


@dataclass
class Server:
    """What the scripted server saw: the requests, in arrival order."""

    requests: list[Seen] = field(default_factory=list)
    url: str = ""
    connections: list[asyncio.Task[None]] = field(default_factory=list)

    async def close(self, listener: asyncio.Server) -> None:
        """Stop listening and let every connection's task end (each ends once the client has
        closed its side), so none is cancelled mid-write at the loop's end."""
        listener.close()
        await listener.wait_closed()
        if self.connections:
            await asyncio.wait(self.connections, timeout=10)


class Conn:
    """One accepted connection, as a script sees it."""

    def __init__(
        self, ident: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server
    ) -> None:
        self.ident = ident
        self.reader = reader
        self.writer = writer
        self.server = server
        self.next_request: asyncio.Task[Seen | None] | None = None

    async def write(self, *parts: bytes) -> None:
        """Each part as its own write (so the client may read them separately)."""
        for part in parts:
            self.writer.write(part)
            await self.writer.drain()

    async def read_request(self) -> Seen | None:
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        seen = Seen(self.ident, await self.reader.readexactly(length))
        self.server.requests.append(seen)
        return seen

    async def hold(self, seconds: float) -> None:
        """Wait for this connection's next request, at most ``seconds``: a service that sends
        its final answer late, after a client that took an interim answer for the answer has
        already sent its next request on the connection."""
        self.next_request = asyncio.ensure_future(self.read_request())
        await asyncio.wait([self.next_request], timeout=seconds)


Script = Callable[[Conn], Awaitable[bool]]  # answers one request; False: close the connection


def answer(*parts: bytes, hold_s: float = 0.0, then: Sequence[bytes] = ()) -> Script:
    """Write ``parts``; with ``hold_s``, wait that long for the next request (see
    ``Conn.hold``), then write ``then``."""

    async def script(conn: Conn) -> bool:
        await conn.write(*parts)
        if hold_s:
            await conn.hold(hold_s)
            await conn.write(*then)
        return True

    return script


def endless(prefix: bytes, filler: bytes) -> Script:
    """Write ``prefix``, then ``filler`` again and again until the client closes."""

    async def script(conn: Conn) -> bool:
        try:
            await conn.write(prefix)
            while True:
                await conn.write(filler)
        except ConnectionError:
            return False

    return script


async def _serve(scripts: list[Script], server: Server) -> asyncio.Server:
    idents = itertools.count()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(next(idents), reader, writer, server)
        task = asyncio.current_task()
        assert task is not None
        server.connections.append(task)
        try:
            while True:
                pending, conn.next_request = conn.next_request, None
                seen = await pending if pending is not None else await conn.read_request()
                if seen is None:
                    return
                index = len(server.requests) - 1
                if not await scripts[index](conn):
                    return
        except ConnectionError:
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}/handle"
    return listener


def _message(i: int) -> Message:
    return Message(key=b"k", value=b"record %d" % i, topic="orders", partition=0, offset=i)


def single(
    scripts: list[Script], calls: int, timeout_s: float = 5.0
) -> tuple[list[HandlerResult], Server]:
    """``calls`` calls one after the other (one connection at most) through ``HttpHandler``."""

    async def go() -> tuple[list[HandlerResult], Server]:
        server = Server()
        listener = await _serve(scripts, server)
        handler = HttpHandler(server.url, timeout_s=timeout_s, max_connections=1)
        try:
            results = [await handler.acall(_message(i)) for i in range(calls)]
        finally:
            await handler.aclose()
            await server.close(listener)
        return results, server

    return asyncio.run(go())


def bulk(
    scripts: list[Script], batches: int, size: int = 2, timeout_s: float = 5.0
) -> tuple[list[list[HandlerResult]], Server]:
    async def go() -> tuple[list[list[HandlerResult]], Server]:
        server = Server()
        listener = await _serve(scripts, server)
        handler = HttpBulkHandler(
            server.url, timeout_s=timeout_s, max_batch=size, max_connections=1
        )
        try:
            results = []
            for b in range(batches):
                batch = [_message(b * size + i) for i in range(size)]
                results.append(list(await handler.acall_batch(batch)))
        finally:
            await handler.aclose()
            await server.close(listener)
        return results, server

    return asyncio.run(go())


def _head(status: str, *headers: str) -> bytes:
    return ("".join(f"{line}\r\n" for line in (f"HTTP/1.1 {status}", *headers)) + "\r\n").encode()


def _ok(body: bytes = b"", content_type: str = "text/plain") -> bytes:
    return _head("200 OK", f"Content-Type: {content_type}", f"Content-Length: {len(body)}") + body


EARLY_HINTS = _head("103 Early Hints", "Link: </style.css>; rel=preload; as=style")
CONTINUE = _head("100 Continue")
FAILED = _head("500 Internal Server Error", "Content-Length: 4") + b"oops"


# -- fault 1: an interim answer is not the answer --------------------------------------------


def test_interim_answers_are_skipped() -> None:
    results, server = single([answer(CONTINUE, EARLY_HINTS, FAILED), answer(_ok())], calls=2)
    assert results[0].outcome is Outcome.RETRY
    assert (results[0].error_class, results[0].error_message) == ("http_500", "oops")
    assert results[1] == HandlerResult.success()
    assert [r.conn for r in server.requests] == [0, 0]  # the connection was still good


def test_a_late_final_answer_never_goes_to_the_next_call() -> None:
    """The service answered 500 after an Early Hints head: that is the first call's retry,
    never the second call's answer (the second one's own answer is a success)."""
    script = answer(EARLY_HINTS, hold_s=1.0, then=[FAILED])
    results, _ = single([script, answer(_ok())], calls=2)
    assert (results[0].outcome, results[0].error_class) == (Outcome.RETRY, "http_500")
    assert results[1] == HandlerResult.success()


def test_unrequested_switching_protocols_fails_the_call_and_closes() -> None:
    switching = _head("101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade")
    results, server = single([answer(switching, _ok()), answer(_ok())], calls=2)
    assert (results[0].outcome, results[0].error_class) == (Outcome.RETRY, CONNECTION_ERROR_CLASS)
    assert "HttpFramingError" in (results[0].error_message or "")
    assert results[1] == HandlerResult.success()
    assert [r.conn for r in server.requests] == [0, 1]  # not reused after the bad answer


def test_bulk_batches_never_take_each_others_verdicts() -> None:
    dead = json.dumps({"results": [{"id": 0, "status": "DEAD"}, {"id": 1, "status": "DEAD"}]})
    fine = json.dumps({"results": [], "default_status": "SUCCESS"})
    first = answer(
        EARLY_HINTS, hold_s=1.0, then=[_ok(dead.encode(), content_type="application/json")]
    )
    second = answer(_ok(fine.encode(), content_type="application/json"))
    results, _ = bulk([first, second], batches=2)
    assert [r.outcome for r in results[0]] == [Outcome.DEAD, Outcome.DEAD]
    assert results[1] == [HandlerResult.success()] * 2


# -- fault 2: trailers and interim heads count against the head bound ------------------------

ENDLESS_TRAILER = endless(
    _head("200 OK", "Transfer-Encoding: chunked") + b"4\r\nbody\r\n0\r\nX-Pad: ", b"a" * 8192
)


def test_an_endless_trailer_fails_the_call_and_closes() -> None:
    results, server = single([ENDLESS_TRAILER, answer(_ok())], calls=2, timeout_s=5.0)
    assert (results[0].outcome, results[0].error_class) == (Outcome.RETRY, CONNECTION_ERROR_CLASS)
    assert "HttpFramingError" in (results[0].error_message or "")
    assert results[1] == HandlerResult.success()  # on a new connection: the slot was freed
    assert [r.conn for r in server.requests] == [0, 1]


def test_endless_interim_answers_fail_the_call() -> None:
    results, _ = single([endless(b"", EARLY_HINTS), answer(_ok())], calls=2, timeout_s=5.0)
    assert (results[0].outcome, results[0].error_class) == (Outcome.RETRY, CONNECTION_ERROR_CLASS)
    assert results[1] == HandlerResult.success()


def test_bulk_endless_trailer_retries_every_record() -> None:
    results, _ = bulk([ENDLESS_TRAILER], batches=1, timeout_s=5.0)
    assert [(r.outcome, r.error_class) for r in results[0]] == [
        (Outcome.RETRY, CONNECTION_ERROR_CLASS)
    ] * 2


# -- fault 3: no answer makes an adapter raise ---------------------------------------------


@pytest.mark.parametrize("status", ["200 OK", "500 Internal Server Error"])
def test_deeply_nested_json_answer_is_classified_by_its_status(status: str) -> None:
    deep = b"[" * 30_000 + b"]" * 30_000  # (within the 64 KiB read of an answer)
    script = answer(
        _head(status, "Content-Type: application/json", f"Content-Length: {len(deep)}") + deep
    )
    results, _ = single([script], calls=1)
    code = status.split()[0]
    expected = Outcome.SUCCESS if code == "200" else Outcome.RETRY
    assert results[0].outcome is expected
    if code != "200":
        assert results[0].error_class == f"http_{code}"


def test_bulk_deeply_nested_json_answer_is_a_bad_answer() -> None:
    deep = b'{"results": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    results, _ = bulk([answer(_ok(deep, content_type="application/json"))], batches=1)
    assert [(r.outcome, r.error_class) for r in results[0]] == [
        (Outcome.RETRY, BAD_ANSWER_CLASS)
    ] * 2
