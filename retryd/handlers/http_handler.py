"""Sidecar mode: POST each message to an HTTP endpoint and classify the response.

Calls run concurrently on the worker's event loop, over a keep-alive connection pool sized to
``max_in_flight``: with latency L the process serves up to max_in_flight / L calls per second
instead of 1 / L. Plain ``http://`` (and ``http+unix://<percent-encoded socket path>/path``,
HTTP over a Unix socket) go through the lean client of ``retryd.handlers.http_pool``: the
whole request is one string and one write, at a third of aiohttp's CPU per call, which is
what bounded a worker's calls per second. ``https://`` and URLs with credentials go through
``aiohttp`` (TLS, Basic auth from the URL).

Request
-------
* Body: the record value byte for byte, ``Content-Type: application/octet-stream``. A null
  value sends an empty body *and* ``X-Retryd-Value-Null: true``, so a tombstone and an empty
  value are told apart.
* ``X-Retryd-Topic``, ``X-Retryd-Partition``, ``X-Retryd-Offset``: where this copy was consumed.
* ``X-Retryd-Key``: the record key, standard base64 (empty string for an empty key; the
  header is absent when the key is null).
* ``X-Retryd-Retry-Number``: retries scheduled so far (0 on a main topic).
* ``X-Retryd-Original-Topic``: where the message first entered retryd.
* ``traceparent`` (and ``tracestate`` when there is one): the call's span, when tracing is on
  (``retryd.tracing``); the record's own trace headers still travel as ``X-Kafka-*``.

Every HTTP header value retryd sends is printable ASCII, whatever the record carries: values
that are not (a hostile ``retryd_original_topic``, say) are percent-encoded, so no record can
make the request itself fail.

Kafka headers
-------------
HTTP cannot carry every Kafka header as-is (Kafka names are case-sensitive, may repeat, may
hold any character; values are arbitrary bytes or null). So each Kafka header travels one of
two ways:

* ``X-Kafka-<name>: <value>`` when the name matches ``[A-Za-z0-9][A-Za-z0-9-]*`` (no ``_``:
  common proxies drop such headers and CGI/WSGI folds ``_`` and ``-`` together), the value is
  printable ASCII (0x20-0x7E) without leading/trailing spaces, and no other header of the record
  has the same name ignoring case. Note HTTP frameworks usually fold the name's letter case.
* Otherwise in one header ``X-Retryd-Headers-B64``: a JSON object (ASCII-only) mapping the
  exact Kafka name to its standard-base64 value, ``null`` for a null value, or - for a name that
  occurs several times in the record - a list of those in record order.

Order between different names is not preserved. ``decode_kafka_headers`` reverses this.

Response
--------
``classify_http``: 2xx success; 408, 429, 5xx retry; other 4xx dead; 3xx retry (redirects are
not followed); a JSON body ``{"status": "SUCCESS|RETRY|DROP|DEAD"}`` overrides the code. At most
``MAX_RESPONSE_BYTES`` of the body are read. A failure may name its error class in an
``X-Retryd-Error`` response header, for the error routes (``retryd.policy.error_routes``): a
value that is not a short token is ignored. A timeout is ``timeout``; any other transport
failure is a retryable ``connection_error``. Nothing raises: the adapter turns every failure,
its own included, into a result (an answer that is not HTTP/1.1 is a ``connection_error``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from typing import NamedTuple
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aiohttp

from retryd.handlers.base import Message
from retryd.handlers.http_headers import (
    HEADERS_B64,
    KAFKA_HEADER_PREFIX,
    decode_kafka_headers,
    encode_kafka_headers,
)
from retryd.handlers.http_pool import HttpFramingError, HttpPool
from retryd.policy.classify import HandlerResult, Outcome, classify_http, timeout_result
from retryd.policy.error_routes import error_name

logger = logging.getLogger(__name__)

# The Kafka-header mapping lives in http_headers; its names stay importable from here.
__all__ = [
    "ERROR_HEADER",
    "HEADERS_B64",
    "KAFKA_HEADER_PREFIX",
    "MAX_RESPONSE_BYTES",
    "VALUE_NULL",
    "HttpHandler",
    "decode_kafka_headers",
    "encode_kafka_headers",
    "redact_url",
    "request_bytes",
    "request_headers",
]

MAX_RESPONSE_BYTES = 64 * 1024
VALUE_NULL = "X-Retryd-Value-Null"
ERROR_HEADER = "X-Retryd-Error"  # in a response: the error class the service names
CONNECTION_ERROR_CLASS = "connection_error"  # also an answer that is not HTTP (HttpFramingError)
REQUEST_ERROR_CLASS = "http_request_error"


def redact_url(url: str) -> str:
    """The URL without credentials or query string, fit for logs and error messages."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        netloc = f"***@{host}" if "@" in parts.netloc else parts.netloc
        query = "***" if parts.query else ""
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        return "<unparsable URL>"


def _ascii(value: str) -> str:
    """A header value that is printable ASCII whatever ``value`` holds (percent-encoded)."""
    if value.isascii() and value.isprintable():
        return value
    return quote(value, safe="", errors="replace")


def request_headers(message: Message) -> list[tuple[str, str]]:
    """All HTTP headers for one message (see the module docstring); every value printable
    ASCII."""
    topic = message.topic
    headers = [
        ("Content-Type", "application/octet-stream"),
        ("X-Retryd-Topic", _ascii(topic)),
        ("X-Retryd-Partition", str(message.partition)),
        ("X-Retryd-Offset", str(message.offset)),
        ("X-Retryd-Retry-Number", str(message.retry_number)),
        ("X-Retryd-Original-Topic", _ascii(message.original_topic or topic)),
    ]
    key = message.key
    if key is not None:
        headers.append(("X-Retryd-Key", base64.b64encode(key).decode("ascii")))
    if message.value is None:
        headers.append((VALUE_NULL, "true"))
    headers.extend(encode_kafka_headers(message.headers))
    attempt = getattr(message, "_trace", None)  # set only when tracing is on
    if attempt is not None:
        headers.append(("traceparent", attempt.traceparent))
        if attempt.tracestate:
            headers.append(("tracestate", attempt.tracestate))
    return headers


_ASCII_CACHE: dict[str, str] = {}


def _ascii_cached(value: str) -> str:
    """``_ascii`` for topic names: a handful per process, so kept (bounded)."""
    got = _ASCII_CACHE.get(value)
    if got is None:
        got = _ascii(value)
        if len(_ASCII_CACHE) < 4096:
            _ASCII_CACHE[value] = got
    return got


def request_bytes(message: Message, start: str) -> bytes:
    """The whole HTTP/1.1 request for ``message`` (``start``: request line and Host), the
    same headers as ``request_headers`` built as one string: the fast path's one write."""
    topic = message.topic
    value = message.value
    body = value or b""
    head = (
        f"{start}Content-Length: {len(body)}\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"X-Retryd-Topic: {_ascii_cached(topic)}\r\n"
        f"X-Retryd-Partition: {message.partition}\r\n"
        f"X-Retryd-Offset: {message.offset}\r\n"
        f"X-Retryd-Retry-Number: {message.retry_number}\r\n"
        f"X-Retryd-Original-Topic: {_ascii_cached(message.original_topic or topic)}\r\n"
    )
    key = message.key
    if key is not None:
        head += f"X-Retryd-Key: {base64.b64encode(key).decode('ascii')}\r\n"
    if value is None:
        head += f"{VALUE_NULL}: true\r\n"
    kafka_headers = message.headers
    if kafka_headers:
        head += "".join(f"{n}: {v}\r\n" for n, v in encode_kafka_headers(kafka_headers))
    attempt = getattr(message, "_trace", None)  # set only when tracing is on
    if attempt is not None:
        head += f"traceparent: {attempt.traceparent}\r\n"
        if attempt.tracestate:
            head += f"tracestate: {attempt.tracestate}\r\n"
    return (head + "\r\n").encode("ascii") + body


UNIX_SCHEME = "http+unix"


class _Target(NamedTuple):
    host: str
    port: int
    start: str  # request line and Host header
    unix_path: str | None


def _fast_target(url: str) -> _Target | None:
    """Where the lean client sends requests for ``url``, when it can: plain ``http://`` with
    no credentials (aiohttp turns them into Basic auth) and an ASCII target, or
    ``http+unix://<percent-encoded socket path>/<path>`` (HTTP over a Unix socket)."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = 0 if scheme == UNIX_SCHEME else (parts.port or 80)
    except ValueError:
        return None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not (target.isascii() and target.isprintable()) or " " in target:
        return None
    if scheme == UNIX_SCHEME:
        path = unquote(parts.netloc)
        if not path:
            return None
        return _Target("localhost", 0, f"POST {target} HTTP/1.1\r\nHost: localhost\r\n", path)
    host = parts.hostname
    if scheme != "http" or not host or "@" in parts.netloc or not host.isascii():
        return None
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == 80 else f"{shown}:{port}"
    return _Target(host, port, f"POST {target} HTTP/1.1\r\nHost: {host_header}\r\n", None)


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    """Up to MAX_RESPONSE_BYTES of the body (the rest is never read)."""
    chunks: list[bytes] = []
    size = 0
    while size < MAX_RESPONSE_BYTES:
        chunk = await response.content.read(MAX_RESPONSE_BYTES - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


class HttpHandler:
    """Handler for ``http(s)://`` specs: an ``AsyncHandler`` with one pooled client session
    per event loop."""

    def __init__(self, url: str, *, timeout_s: float, max_connections: int = 16) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._url = url
        self._shown_url = redact_url(url)
        self.timeout_s = float(timeout_s)
        self.max_connections = max(1, int(max_connections))
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fast = _fast_target(url)
        self._pool: HttpPool | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        """The endpoint with credentials and query redacted."""
        return self._shown_url

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            # A new loop (the worker replaced a stuck one): a session belongs to one loop.
            self._loop = loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, limit_per_host=self.max_connections
                ),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                auto_decompress=False,
            )
        return self._session

    def _lean(self) -> HttpPool:
        loop = asyncio.get_running_loop()
        pool = self._pool
        if pool is None or self._pool_loop is not loop:
            # A new loop (the worker replaced a stuck one): a pool belongs to one loop.
            fast = self._fast
            assert fast is not None
            self._pool_loop = loop
            pool = self._pool = HttpPool(
                fast.host,
                fast.port,
                limit=self.max_connections,
                timeout_s=self.timeout_s,
                max_body=MAX_RESPONSE_BYTES,
                unix_path=fast.unix_path,
            )
        return pool

    async def acall(self, message: Message) -> HandlerResult:
        fast = self._fast
        if fast is None:
            return await self._acall_aiohttp(message)
        try:
            data = request_bytes(message, fast.start)
            answer = await self._lean().request(data)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            logger.debug(
                "%s: POST %s timed out after %gs", message.where, self._shown_url, self.timeout_s
            )
            return timeout_result(self.timeout_s)
        except (OSError, HttpFramingError) as exc:  # (a malformed answer: its connection closed)
            logger.debug("%s: POST %s failed: %r", message.where, self._shown_url, exc)
            return HandlerResult(
                Outcome.RETRY, CONNECTION_ERROR_CLASS, f"{type(exc).__name__}: {exc}"[:512]
            )
        except Exception as exc:  # anything else in building or sending the request
            logger.warning(
                "%s: could not POST to %s: %s: %s",
                message.where,
                self._shown_url,
                type(exc).__name__,
                exc,
            )
            return HandlerResult(
                Outcome.RETRY, REQUEST_ERROR_CLASS, f"{type(exc).__name__}: {exc}"[:512]
            )
        status = answer.status
        if 200 <= status < 300 and not answer.body:
            return HandlerResult.success()
        return self._classified(
            message, status, answer.body, answer.content_type, error_name(answer.error_header)
        )

    def _classified(
        self,
        message: Message,
        status: int,
        payload: bytes,
        content_type: str | None,
        named: str | None,
    ) -> HandlerResult:
        result = classify_http(status, payload, content_type, named)
        if result.outcome is not Outcome.SUCCESS:
            logger.debug(
                "%s: POST %s answered %d -> %s",
                message.where,
                self._shown_url,
                status,
                result.outcome.value,
            )
        return result

    async def _acall_aiohttp(self, message: Message) -> HandlerResult:
        """``https://`` and URLs with credentials: aiohttp (TLS, Basic auth from the URL)."""
        try:
            headers = request_headers(message)
            body = message.value or b""
            session = self._client()
            async with session.post(
                self._url, data=body, headers=headers, allow_redirects=False
            ) as response:
                payload = await _read_capped(response)
                status = response.status
                content_type = response.headers.get("Content-Type")
                named = error_name(response.headers.get(ERROR_HEADER))
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            logger.debug(
                "%s: POST %s timed out after %gs", message.where, self._shown_url, self.timeout_s
            )
            return timeout_result(self.timeout_s)
        except aiohttp.ClientError as exc:
            logger.debug("%s: POST %s failed: %r", message.where, self._shown_url, exc)
            return HandlerResult(
                Outcome.RETRY, CONNECTION_ERROR_CLASS, f"{type(exc).__name__}: {exc}"[:512]
            )
        except Exception as exc:  # anything else in building or sending the request
            logger.warning(
                "%s: could not POST to %s: %s: %s",
                message.where,
                self._shown_url,
                type(exc).__name__,
                exc,
            )
            return HandlerResult(
                Outcome.RETRY, REQUEST_ERROR_CLASS, f"{type(exc).__name__}: {exc}"[:512]
            )
        return self._classified(message, status, payload, content_type, named)

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(RuntimeError):  # its loop is gone, its transports too
                await pool.close()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
