"""The lean client's pool never leaks a connection (or the slot it holds), wherever a call's
deadline or a failure lands: against a local asyncio server that counts the connections it
accepted and the ones the client closed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from retryd.handlers import http_pool
from retryd.handlers.http_pool import HttpPool

REQUEST = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Counting:
    """A server that answers (or not: ``silent``) and counts accepted and ended connections."""

    def __init__(self, silent: bool) -> None:
        self.silent = silent
        self.accepted = 0
        self.ended = 0
        self.changed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                if not self.silent:
                    writer.write(ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.ended += 1
            self.changed.set()

    async def all_ended(self, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while self.ended < self.accepted:
                self.changed.clear()
                await self.changed.wait()


async def _serve(counting: Counting) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(counting.handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_deadlines_anywhere_around_connect_leak_nothing() -> None:
    """Deadlines from 0 to past a loopback connect: each lands somewhere in waiting for a slot,
    connecting, or waiting for an answer that never comes; every connection the server
    accepted is closed by the client, and the pool's slots are all free again."""

    async def go() -> None:
        counting = Counting(silent=True)
        server, port = await _serve(counting)
        outcomes = set()
        try:
            for i in range(120):
                timeout = i * 10e-6  # 0 .. 1.2 ms
                pool = HttpPool("127.0.0.1", port, limit=2, timeout_s=timeout, max_body=64)
                calls = [pool.request(REQUEST) for _ in range(3)]  # one waits for a slot
                for got in await asyncio.gather(*calls, return_exceptions=True):
                    outcomes.add(type(got).__name__)
                assert pool._open == 0
                await pool.close()
            await counting.all_ended(timeout=10)
        finally:
            server.close()
        assert outcomes == {"TimeoutError"}
        assert counting.ended == counting.accepted

    asyncio.run(go())


def test_a_failed_send_returns_the_connection_and_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing the request raised (a transport that refuses the write): that connection is
    closed and its slot freed; the next call on a pool of one works."""
    send = http_pool._Conn.send
    failures = [RuntimeError("unable to perform operation on a closed transport")]

    def failing_send(self: Any, data: bytes, loop: asyncio.AbstractEventLoop) -> Any:
        if failures:
            raise failures.pop()
        return send(self, data, loop)

    monkeypatch.setattr(http_pool._Conn, "send", failing_send)

    async def go() -> None:
        counting = Counting(silent=False)
        server, port = await _serve(counting)
        pool = HttpPool("127.0.0.1", port, limit=1, timeout_s=5, max_body=64)
        try:
            with pytest.raises(RuntimeError):
                await pool.request(REQUEST)
            assert pool._open == 0
            answer = await pool.request(REQUEST)
            assert (answer.status, answer.body) == (200, b"ok")
            await pool.close()
            await counting.all_ended(timeout=10)
        finally:
            server.close()
        assert counting.accepted == 2  # the failed call's connection was not reused

    asyncio.run(go())
