"""Sidecar mode: POST each message to an HTTP endpoint and classify the response.

Request
-------
* Body: the record value byte for byte (empty body when the value is null),
  ``Content-Type: application/octet-stream``.
* ``X-Retryd-Topic``, ``X-Retryd-Partition``, ``X-Retryd-Offset``: where this copy was consumed.
* ``X-Retryd-Key``: the record key, standard base64 (empty string for an empty key; the
  header is absent when the key is null).
* ``X-Retryd-Retry-Number``: retries scheduled so far (0 on a main topic).
* ``X-Retryd-Original-Topic``: where the message first entered retryd.

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
``MAX_RESPONSE_BYTES`` of the body are read. A timeout (connect, write, read, pool, or the whole
response not read within ``timeout_s``) is ``timeout``; any other transport failure is a
retryable ``connection_error``. Business failures never raise.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from retryd.handlers.base import Message, call_sequentially
from retryd.handlers.python_handler import where
from retryd.policy.classify import HandlerResult, Outcome, classify_http, timeout_result

logger = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 64 * 1024
KAFKA_HEADER_PREFIX = "X-Kafka-"
HEADERS_B64 = "X-Retryd-Headers-B64"
CONNECTION_ERROR_CLASS = "connection_error"

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")


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


def _plain_text(value: bytes | None) -> str | None:
    if not value:
        return None if value is None else ""
    if not value.isascii():
        return None
    text = value.decode("ascii")
    if not text.isprintable() or text[0] == " " or text[-1] == " ":
        return None
    return text


def encode_kafka_headers(
    headers: Iterable[tuple[str, bytes | None]],
) -> list[tuple[str, str]]:
    """HTTP headers (``X-Kafka-*`` plus at most one ``X-Retryd-Headers-B64``) for Kafka headers."""
    headers = list(headers)
    if not headers:
        return []
    folded = Counter(name.lower() for name, _ in headers)
    exact = Counter(name for name, _ in headers)
    out: list[tuple[str, str]] = []
    packed: dict[str, Any] = {}
    for name, value in headers:
        text = _plain_text(value)
        if text is not None and folded[name.lower()] == 1 and _SAFE_NAME.fullmatch(name):
            out.append((KAFKA_HEADER_PREFIX + name, text))
            continue
        encoded = None if value is None else base64.b64encode(value).decode("ascii")
        if exact[name] > 1:
            packed.setdefault(name, []).append(encoded)
        else:
            packed[name] = encoded
    if packed:
        out.append((HEADERS_B64, json.dumps(packed, ensure_ascii=True, separators=(",", ":"))))
    return out


def decode_kafka_headers(http_headers: Mapping[str, str]) -> list[tuple[str, bytes | None]]:
    """Kafka headers back from a request's HTTP headers (for Python sidecars and tests).

    Names from ``X-Kafka-*`` come back in whatever case the HTTP layer delivered them.
    Raises ``ValueError`` on a malformed ``X-Retryd-Headers-B64``.
    """
    out: list[tuple[str, bytes | None]] = []
    packed_raw = None
    prefix = KAFKA_HEADER_PREFIX.lower()
    for name, value in http_headers.items():
        if name.lower().startswith(prefix):
            out.append((name[len(prefix) :], value.encode("ascii")))
        elif name.lower() == HEADERS_B64.lower():
            packed_raw = value
    if packed_raw is not None:
        try:
            packed = json.loads(packed_raw)
            if not isinstance(packed, dict):
                raise ValueError("not a JSON object")
            for name, encoded in packed.items():
                values = encoded if isinstance(encoded, list) else [encoded]
                for item in values:
                    out.append(
                        (name, None if item is None else base64.b64decode(item, validate=True))
                    )
        except (ValueError, TypeError, binascii.Error) as exc:
            raise ValueError(f"malformed {HEADERS_B64}: {exc}") from exc
    return out


def request_headers(message: Message) -> list[tuple[str, str]]:
    """All HTTP headers for one message (see the module docstring)."""
    headers = [
        ("Content-Type", "application/octet-stream"),
        ("X-Retryd-Topic", message.topic),
        ("X-Retryd-Partition", str(message.partition)),
        ("X-Retryd-Offset", str(message.offset)),
        ("X-Retryd-Retry-Number", str(message.retry_number)),
        ("X-Retryd-Original-Topic", message.original_topic or message.topic),
    ]
    if message.key is not None:
        headers.append(("X-Retryd-Key", base64.b64encode(message.key).decode("ascii")))
    headers.extend(encode_kafka_headers(message.headers))
    return headers


class HttpHandler:
    """Handler for ``http(s)://`` specs: one pooled ``httpx.Client``, thread-safe."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._url = url
        self._shown_url = redact_url(url)
        self._timeout_s = float(timeout_s)
        self._client = httpx.Client(timeout=httpx.Timeout(self._timeout_s), follow_redirects=False)

    @property
    def abandoned(self) -> int:
        return 0  # httpx enforces the timeouts itself; nothing is ever left running

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @property
    def url(self) -> str:
        """The endpoint with credentials and query redacted."""
        return self._shown_url

    def __call__(self, message: Message) -> HandlerResult:
        deadline = time.monotonic() + self._timeout_s
        try:
            with self._client.stream(
                "POST",
                self._url,
                content=message.value or b"",
                headers=request_headers(message),
            ) as response:
                body = self._read_capped(response, deadline)
                if body is None:
                    return self._timed_out(message)
                status = response.status_code
                content_type = response.headers.get("content-type")
        except httpx.TimeoutException:
            return self._timed_out(message)
        except httpx.HTTPError as exc:
            logger.debug("%s: POST %s failed: %r", where(message), self._shown_url, exc)
            return HandlerResult(
                Outcome.RETRY, CONNECTION_ERROR_CLASS, f"{type(exc).__name__}: {exc}"
            )
        result = classify_http(status, body, content_type)
        if result.outcome is not Outcome.SUCCESS:
            logger.debug(
                "%s: POST %s answered %d -> %s",
                where(message),
                self._shown_url,
                status,
                result.outcome.value,
            )
        return result

    @staticmethod
    def _read_capped(response: httpx.Response, deadline: float) -> bytes | None:
        """Up to MAX_RESPONSE_BYTES of the body; None if the deadline passed while reading."""
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            if time.monotonic() > deadline:
                return None
            chunks.append(chunk)
            size += len(chunk)
            if size >= MAX_RESPONSE_BYTES:
                break
        return b"".join(chunks)[:MAX_RESPONSE_BYTES]

    def _timed_out(self, message: Message) -> HandlerResult:
        logger.debug(
            "%s: POST %s timed out after %gs", where(message), self._shown_url, self._timeout_s
        )
        return timeout_result(self._timeout_s)

    def call_many(
        self, messages: Sequence[Message], cancel: Callable[[], bool] = lambda: False
    ) -> Iterator[tuple[HandlerResult, float]]:
        return call_sequentially(self, messages, cancel)

    def close(self) -> None:
        self._client.close()
