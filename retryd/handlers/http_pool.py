"""A lean HTTP/1.1 keep-alive client for the HTTP handler's hot path: plain ``http://``, one
request per connection at a time, answers framed by ``retryd.handlers.http_framing`` (its
docstring says why not httptools, which this used before, nor h11).

Why not aiohttp here: profiled against a Go service answering at once, aiohttp spent ~3/4 of
each call in its own machinery (request and response objects, a payload registry, a writer
task per request, connector bookkeeping) around the one ``send`` and one ``recv`` a call
needs; a worker at 256 calls in flight was CPU-bound at half the calls its latency allowed.
This client does per call: take an idle connection, one ``write`` of head and body, one
future resolved by the framing, one timer for the deadline.

Semantics kept from the aiohttp path: at most ``limit`` connections, reused while the server
keeps them alive; redirects are not followed; at most ``max_body`` bytes of a response body
are kept (a connection whose body was cut short is closed, not reused); the deadline covers
waiting for a connection, connecting, sending and the whole response. A connection the
server closed while idle is noticed by ``connection_lost`` and dropped; a request that finds
a reused connection closed before any answer byte is sent once more on a new connection (the
stale keep-alive race, as browsers and urllib3 do). Interim ``1xx`` answers are skipped, never
taken for the answer; everything an answer holds besides its body (interim heads, head,
chunk lines, trailers) counts against one bound, ``MAX_HEAD_BYTES``; an answer that is
malformed, over that bound or cut short fails its call with ``HttpFramingError`` and closes
its connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from retryd.handlers.http_framing import (
    MAX_HEAD_BYTES,
    HttpFramingError,
    Response,
    ResponseReader,
)

logger = logging.getLogger(__name__)

__all__ = ["MAX_HEAD_BYTES", "HttpFramingError", "HttpPool", "Response", "StaleConnection"]


class StaleConnection(ConnectionError):
    """A reused connection closed before the first byte of the answer."""


class _Conn(asyncio.Protocol):
    """One keep-alive connection: its ``ResponseReader`` frames the bytes, the answer (or the
    failure) resolves ``waiter``."""

    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.reader = ResponseReader(pool.max_body)
        self.waiter: asyncio.Future[Response] | None = None
        self.closed = False
        self.used = False  # served an earlier request (a loss before any byte is stale)
        # Whether its slot in the pool is free again (or was never taken: a connection made
        # after its caller gave up never counted, so its loss frees nothing)
        self.counted_out = True

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None:  # bytes on an idle connection: nothing can trust it now
            self.close()
            return
        try:
            response = self.reader.feed(data)
        except HttpFramingError as exc:
            if not waiter.done():
                waiter.set_exception(exc)
            self.close()
            return
        if response is not None and not waiter.done():
            waiter.set_result(response)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.lost(self)
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        reader = self.reader
        if not reader.received:
            if self.used:
                waiter.set_exception(StaleConnection("connection closed before an answer"))
            else:
                waiter.set_exception(
                    exc or ConnectionResetError("server closed the connection before an answer")
                )
            return
        if exc is not None:  # a reset: an answer the end of the connection delimits is lost too
            waiter.set_exception(exc)
            return
        try:
            response = reader.feed_eof()  # an answer delimited by the end of the connection
        except HttpFramingError as error:
            waiter.set_exception(error)
            return
        if response is not None:
            waiter.set_result(response)

    # -- the client side
    def send(self, data: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Response]:
        self.reader.begin()
        waiter = self.waiter = loop.create_future()
        assert self.transport is not None
        self.transport.write(data)
        return waiter

    def reusable(self) -> bool:
        return self.reader.reusable and not self.closed

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class HttpPool:
    """Up to ``limit`` keep-alive connections to one ``host:port`` (or, with ``unix_path``, to
    a Unix socket) on the running loop."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        limit: int,
        timeout_s: float,
        max_body: int,
        unix_path: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.unix_path = unix_path
        self.limit = max(1, limit)
        self.timeout_s = timeout_s
        self.max_body = max_body
        self._idle: list[_Conn] = []
        self._open = 0  # connections open or being opened
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._loop = asyncio.get_running_loop()
        self._closing = False

    async def request(self, data: bytes) -> Response:
        """Send one complete request (head and body) and return the answer. Raises
        ``TimeoutError`` past ``timeout_s``, ``OSError`` on transport failures,
        ``HttpFramingError`` on an answer that is malformed, too large in its non-body parts
        or cut short (its connection is closed)."""
        loop = self._loop
        deadline = loop.time() + self.timeout_s
        for _ in range(2):
            conn = await self._acquire(deadline)
            # From here on the connection is this call's: whatever happens (a failed write
            # included) it goes back to the pool or is closed, never leaked with its slot
            timer: asyncio.TimerHandle | None = None
            try:
                waiter = conn.send(data, loop)
                timer = loop.call_at(deadline, _expire, waiter)
                response = await waiter
            except StaleConnection:
                self._discard(conn)
                continue
            except BaseException:  # timeout, cancellation, transport failure: state unknown
                self._discard(conn)
                raise
            finally:
                if timer is not None:
                    timer.cancel()
            conn.waiter = None
            conn.used = True
            if conn.reusable():
                self._release(conn)
            else:
                self._discard(conn)
            return response
        raise ConnectionResetError("connection closed before an answer, twice")

    async def _acquire(self, deadline: float) -> _Conn:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        if self._open < self.limit:
            return await self._connect(deadline)
        async with asyncio.timeout_at(deadline):
            while True:
                waiter = self._loop.create_future()
                self._slot_waiters.append(waiter)
                try:
                    await waiter
                except BaseException:
                    if waiter.done() and not waiter.cancelled():
                        self._wake()  # pass on the slot this waiter was given
                    raise
                while idle:
                    conn = idle.pop()
                    if not conn.closed:
                        return conn
                if self._open < self.limit:
                    return await self._connect(deadline)

    async def _connect(self, deadline: float) -> _Conn:
        self._open += 1
        try:
            async with asyncio.timeout_at(deadline):
                if self.unix_path is not None:
                    _, conn = await self._loop.create_unix_connection(
                        lambda: _Conn(self), self.unix_path
                    )
                else:
                    _, conn = await self._loop.create_connection(
                        lambda: _Conn(self), self.host, self.port
                    )
        except BaseException:
            self._open -= 1
            self._wake()
            raise
        conn.counted_out = False
        return conn

    def _release(self, conn: _Conn) -> None:
        if self._closing:
            self._discard(conn)
            return
        self._idle.append(conn)
        self._wake()

    def _discard(self, conn: _Conn) -> None:
        conn.waiter = None
        if not conn.closed:
            conn.close()
        self.lost(conn)

    def lost(self, conn: _Conn) -> None:
        """A connection is gone (closed by either side): its slot is free again, once."""
        if conn.counted_out:
            return
        conn.counted_out = True
        self._open -= 1
        self._wake()

    def _wake(self) -> None:
        waiters = self._slot_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        self._closing = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._discard(conn)
        await asyncio.sleep(0)  # let the transports call connection_lost
