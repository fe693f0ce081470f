"""A lean HTTP/1.1 keep-alive client for the HTTP handler's hot path: plain ``http://``, one
request per connection at a time, responses parsed by ``httptools`` (uvicorn's C parser).

Why not aiohttp here: profiled against a Go service answering at once, aiohttp spent ~3/4 of
each call in its own machinery (request and response objects, a payload registry, a writer
task per request, connector bookkeeping) around the one ``send`` and one ``recv`` a call
needs; a worker at 256 calls in flight was CPU-bound at half the calls its latency allowed.
This client does per call: take an idle connection, one ``write`` of head and body, one
future resolved by the parser callbacks, one timer for the deadline.

Semantics kept from the aiohttp path: at most ``limit`` connections, reused while the server
keeps them alive; redirects are not followed; at most ``max_body`` bytes of a response body
are kept (a connection whose body was cut short is closed, not reused); the deadline covers
waiting for a connection, connecting, sending and the whole response. A connection the
server closed while idle is noticed by ``connection_lost`` and dropped; a request that finds
a reused connection closed before any answer byte is sent once more on a new connection (the
stale keep-alive race, as browsers and urllib3 do).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

import httptools

logger = logging.getLogger(__name__)

# A response's status line and headers past this size fail the call (aiohttp's limit is 8 KiB
# a line; this bounds what a broken or hostile service can make the worker buffer).
MAX_HEAD_BYTES = 64 * 1024


class StaleConnection(ConnectionError):
    """A reused connection closed before the first byte of the answer."""


class Response:
    """What the handler needs of an answer: status, two headers, the (capped) body."""

    __slots__ = ("body", "content_type", "error_header", "status")

    def __init__(self) -> None:
        self.status = 0
        self.content_type: str | None = None
        self.error_header: str | None = None
        self.body = b""


class _Conn(asyncio.Protocol):
    """One keep-alive connection: parser callbacks fill ``Response`` and resolve ``waiter``."""

    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Response] | None = None
        self.response = Response()
        self.chunks: list[bytes] = []
        self.size = 0
        self.cut = False  # the body went past max_body: the connection cannot be reused
        self.closed = False
        self.used = False  # served an earlier request (a loss before any byte is stale)
        self.got_bytes = False
        # Whether its slot in the pool is free again (or was never taken: a connection made
        # after its caller gave up never counted, so its loss frees nothing)
        self.counted_out = True
        self.headers_done = False
        self.head_bytes = 0
        self.keep_alive = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes on an idle connection: nothing can trust it now
            self.close()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed HTTP response: {exc}"))
            self.close()
            return
        if not self.headers_done:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:  # a status line and headers without end
                self._fail(ConnectionError(f"response head over {MAX_HEAD_BYTES} bytes"))
                self.close()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.lost(self)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if self.headers_done:
                # An answer delimited by the end of the connection is complete now (and one
                # cut short is judged by its status, as the aiohttp path does)
                self._complete()
            if not waiter.done():
                if self.used and not self.got_bytes:
                    self._fail(StaleConnection("connection closed before an answer"))
                else:
                    self._fail(
                        exc or ConnectionResetError("server closed the connection mid-answer")
                    )

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 12 and name.lower() == b"content-type":
            self.response.content_type = value.decode("latin-1")
        elif len(name) == 14 and name.lower() == b"x-retryd-error":
            self.response.error_header = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # read here: once the message is complete the parser no longer tells
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        room = self.pool.max_body - self.size
        if len(body) >= room:
            self.chunks.append(body[:room])
            self.size += room
            self.cut = True
            self._complete()  # the rest is never read
        else:
            self.chunks.append(body)
            self.size += len(body)

    def on_message_complete(self) -> None:
        if not self.cut:
            self._complete()

    # -- the client side
    def _complete(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        response = self.response
        response.status = self.parser.get_status_code()
        if self.chunks:
            response.body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        waiter.set_result(response)

    def _fail(self, exc: BaseException) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def send(self, data: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Response]:
        self.response = Response()
        self.chunks = []
        self.size = 0
        self.got_bytes = False
        self.headers_done = False
        self.head_bytes = 0
        self.keep_alive = False
        waiter = self.waiter = loop.create_future()
        assert self.transport is not None
        self.transport.write(data)
        return waiter

    def reusable(self) -> bool:
        return self.keep_alive and not (self.closed or self.cut)

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
        ``TimeoutError`` past ``timeout_s``, ``OSError`` on transport failures."""
        loop = self._loop
        deadline = loop.time() + self.timeout_s
        for _ in range(2):
            conn = await self._acquire(deadline)
            waiter = conn.send(data, loop)
            timer = loop.call_at(deadline, _expire, waiter)
            try:
                response = await waiter
            except StaleConnection:
                self._discard(conn)
                continue
            except BaseException:  # timeout, cancellation, transport failure: state unknown
                self._discard(conn)
                raise
            finally:
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
