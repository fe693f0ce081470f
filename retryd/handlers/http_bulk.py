"""Bulk HTTP mode: one POST carries many records, the answer says what became of each one
(as Dapr's bulk subscribe does). The protocol is in docs/http-bulk.md; in short:

Request (``Content-Type: application/json``)::

    {"records": [{"id": 0, "topic": "orders", "partition": 3, "offset": 17,
                  "retry_number": 0, "original_topic": "orders",
                  "key": "<base64>" | null,
                  "value": "<text>" | null,        # the value when it is valid UTF-8
                  "value_b64": "<base64>",         # instead of "value" otherwise
                  "headers": {"X-Kafka-<name>": "...", "X-Retryd-Headers-B64": "{...}"}}]}

``headers`` holds the record's Kafka headers exactly as the single-record mode sends them as
HTTP headers (``http_handler.encode_kafka_headers``; ``decode_kafka_headers`` reverses it) and
is absent when the record has none.

Answer (2xx, JSON)::

    {"results": [{"id": 0, "status": "SUCCESS|RETRY|DROP|DEAD",
                  "error": "why (optional)", "error_name": "class for error routes (optional)"}],
     "default_status": "SUCCESS"}     # optional: for every record the results do not name

``default_status`` keeps the common answer small: a service that handled everything answers
``{"results": [], "default_status": "SUCCESS"}`` and names only the exceptions. Without it a
record the results do not name is retried. (A "results" list is required either way, so a
single-record service answering ``{"status": "SUCCESS"}`` to a bulk request by mistake is a
bad answer, retried, not every record's success.)

Why a per-record answer and not a status code: one request is many records, and each goes
its own way (success, its own retry tier, its own dead letter). Nothing here raises: a failure
of the whole request (timeout, connection error, a non-2xx status, an answer that is not the
JSON above or is larger than ``max_answer_bytes``) is a retry result for every record, and a
record the answer does not name (or names with an unknown status) is retried alone.

Why JSON and not a binary framing: any service can speak it with its standard library, and
at hundreds of records a request, encoding is a few microseconds a record next to the one
request it saves. Transport is the lean keep-alive client of the single-record mode
(``retryd.handlers.http_pool``), so plain ``http://`` endpoints (or ``http+unix://``) only.
"""

from __future__ import annotations

import asyncio
import binascii
import json
import logging
import re
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from retryd.handlers.base import Message
from retryd.handlers.http_handler import (
    CONNECTION_ERROR_CLASS,
    REQUEST_ERROR_CLASS,
    _fast_target,
    encode_kafka_headers,
    redact_url,
)
from retryd.handlers.http_pool import HttpFramingError, HttpPool
from retryd.policy.classify import HandlerResult, Outcome, timeout_result
from retryd.policy.error_routes import error_name

logger = logging.getLogger(__name__)

# The answer may carry an error text per record: room for that, bounded.
ANSWER_BASE_BYTES = 64 * 1024
ANSWER_BYTES_PER_RECORD = 4 * 1024
ERROR_CHARS = 512

MISSING_CLASS = "bulk_missing_result"  # the answer named no result for this record
BAD_ANSWER_CLASS = "bulk_bad_answer"  # not JSON, or not {"results": [...]}
TOO_LARGE_CLASS = "bulk_answer_too_large"
BAD_STATUS_CLASS = "bulk_bad_status"  # a status word other than the four

# An id sent as a string: ASCII digits only (str.isdigit takes "²", which int() refuses) and
# few enough for int() to be cheap
_ID_TEXT = re.compile(r"[0-9]{1,18}")

_SUCCESS = HandlerResult.success()
_DROP = HandlerResult(Outcome.DROP)
_OUTCOMES = {"RETRY": Outcome.RETRY, "DEAD": Outcome.DEAD}


_b2a = binascii.b2a_base64
_json_str = encode_basestring_ascii  # str -> a JSON string literal, quotes included (C)


def _b64(data: bytes) -> str:
    return _b2a(data, newline=False).decode("ascii")  # base64.b64encode's core, 2.5x cheaper


_QUOTED: dict[str, str] = {}


def _quoted(text: str) -> str:
    """A JSON string literal for a topic name: a handful per process, so kept (bounded)."""
    got = _QUOTED.get(text)
    if got is None:
        got = _json_str(text)
        if len(_QUOTED) < 4096:
            _QUOTED[text] = got
    return got


def record_json(index: int, message: Message) -> str:
    """One record of the request as JSON text (see the module docstring). Built as a string:
    three times cheaper than a dict through ``json.dumps``, and this runs once per record."""
    topic = message.topic
    key = message.key
    value = message.value
    if value is None:
        value_part = '"value":null'
    else:
        try:
            value_part = '"value":' + _json_str(value.decode("utf-8"))
        except UnicodeDecodeError:
            value_part = f'"value_b64":"{_b64(value)}"'
    text = (
        f'{{"id":{index},"topic":{_quoted(topic)},"partition":{message.partition},'
        f'"offset":{message.offset},"retry_number":{message.retry_number},'
        f'"original_topic":{_quoted(message.original_topic or topic)},'
        f'"key":{"null" if key is None else chr(34) + _b64(key) + chr(34)},{value_part}'
    )
    headers = message.headers
    if headers:
        pairs = ",".join(f"{_json_str(n)}:{_json_str(v)}" for n, v in encode_kafka_headers(headers))
        text += f',"headers":{{{pairs}}}'
    attempt = getattr(message, "_trace", None)  # set only when tracing is on
    if attempt is not None:
        text += f',"traceparent":{_json_str(attempt.traceparent)}'
    return text + "}"


def request_body(messages: Sequence[Message]) -> bytes:
    """The request's JSON (ASCII: every string is escaped as ``json.dumps`` would)."""
    records = ",".join([record_json(i, m) for i, m in enumerate(messages)])
    return f'{{"records":[{records}]}}'.encode("ascii")


def _shown(value: object) -> str:
    """A JSON value of the answer, short, for an error message: never a container's repr
    (which recurses as deep as the answer nests)."""
    if isinstance(value, str):
        return repr(value[:64])
    if isinstance(value, int | float) or value is None:  # (bool is an int)
        return repr(value)[:64]
    return f"<a JSON {'object' if isinstance(value, dict) else 'array'}>"


def _entry_result(entry: dict[str, Any], status_code: int) -> HandlerResult:
    word = entry.get("status")
    word = word.upper() if isinstance(word, str) else word
    if word == "SUCCESS":
        return _SUCCESS
    if word == "DROP":
        return _DROP
    error = entry.get("error")
    message = error[:ERROR_CHARS] if isinstance(error, str) and error else None
    outcome = _OUTCOMES.get(word) if isinstance(word, str) else None
    if outcome is None:
        return HandlerResult(
            Outcome.RETRY, BAD_STATUS_CLASS, f"unknown status {_shown(word)} for this record"
        )
    named = entry.get("error_name")
    return HandlerResult(
        outcome,
        f"http_{status_code}",
        message or f"handler answered status={word}",
        None,
        error_name(named) if isinstance(named, str) else None,
    )


def results_from_answer(
    n: int, status_code: int, body: bytes, error_header: str | None
) -> list[HandlerResult]:
    """One result per record from a complete answer (never raises)."""
    if not 200 <= status_code < 300:
        snippet = body[:ERROR_CHARS].decode("utf-8", errors="replace")
        failed = HandlerResult(
            Outcome.RETRY,
            f"http_{status_code}",
            snippet or f"HTTP {status_code}",
            None,
            error_name(error_header),
        )
        return [failed] * n
    try:
        doc = json.loads(body)
        if not isinstance(doc, dict):
            raise TypeError("not an object")
        entries = doc["results"]
        if not isinstance(entries, list):
            raise TypeError("results is not a list")
    except (ValueError, TypeError, KeyError, RecursionError) as exc:  # RecursionError: nesting
        bad = HandlerResult(
            Outcome.RETRY, BAD_ANSWER_CLASS, f"answer is not {{'results': [...]}}: {exc}"[:512]
        )
        return [bad] * n
    default = doc.get("default_status")
    rest: HandlerResult | None = None
    if default is not None:  # for the records the results do not name
        rest = _entry_result({"status": default}, status_code)
        if not isinstance(default, str) or rest.error_class == BAD_STATUS_CLASS:
            rest = HandlerResult(
                Outcome.RETRY, BAD_ANSWER_CLASS, f"unknown default_status {_shown(default)}"
            )
        if not entries:
            return [rest] * n
    out: list[HandlerResult | None] = [None] * n
    unknown = 0
    for entry in entries:
        ident = entry.get("id") if isinstance(entry, dict) else None
        if isinstance(ident, str) and _ID_TEXT.fullmatch(ident):
            ident = int(ident)
        if type(ident) is not int or not 0 <= ident < n or out[ident] is not None:
            unknown += 1  # an id never sent, or named twice (the first one counts)
            continue
        out[ident] = _entry_result(entry, status_code)
    missing = rest or HandlerResult(
        Outcome.RETRY, MISSING_CLASS, "the bulk answer had no result for this record"
    )
    if unknown:
        logger.debug("bulk answer: %d results with unknown or repeated ids ignored", unknown)
    return [missing if r is None else r for r in out]


class HttpBulkHandler:
    """``AsyncBatchHandler`` for bulk mode: ``acall_batch`` POSTs up to ``max_batch`` records
    as one request over a keep-alive pool of ``max_connections``."""

    def __init__(self, url: str, *, timeout_s: float, max_batch: int, max_connections: int) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        target = _fast_target(url)
        if target is None:
            raise ValueError(
                "bulk mode needs a plain http:// (or http+unix://) URL without credentials, "
                f"with a printable ASCII path: got {redact_url(url)}"
            )
        self._target = target
        self._start = target.start + "Content-Type: application/json\r\n"
        self._shown_url = redact_url(url)
        self.timeout_s = float(timeout_s)
        self.max_batch = int(max_batch)
        self.max_connections = max(1, int(max_connections))
        self.max_answer_bytes = ANSWER_BASE_BYTES + ANSWER_BYTES_PER_RECORD * self.max_batch
        self._pool: HttpPool | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return self._shown_url

    def _lean(self) -> HttpPool:
        loop = asyncio.get_running_loop()
        pool = self._pool
        if pool is None or self._pool_loop is not loop:  # a pool belongs to one loop
            self._pool_loop = loop
            pool = self._pool = HttpPool(
                self._target.host,
                self._target.port,
                limit=self.max_connections,
                timeout_s=self.timeout_s,
                max_body=self.max_answer_bytes + 1,  # one byte more tells "too large"
                unix_path=self._target.unix_path,
            )
        return pool

    async def acall_batch(self, messages: Sequence[Message]) -> Sequence[HandlerResult]:
        n = len(messages)
        if n == 0:
            return []
        if n > self.max_batch:  # never from the engine; split rather than refuse
            chunks = [messages[i : i + self.max_batch] for i in range(0, n, self.max_batch)]
            parts = await asyncio.gather(*(self.acall_batch(c) for c in chunks))
            return [r for part in parts for r in part]
        try:
            body = request_body(messages)
            head = f"{self._start}X-Retryd-Batch-Size: {n}\r\nContent-Length: {len(body)}\r\n\r\n"
            answer = await self._lean().request(head.encode("ascii") + body)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            logger.debug("bulk POST %s (%d records) timed out", self._shown_url, n)
            return [timeout_result(self.timeout_s)] * n
        except (OSError, HttpFramingError) as exc:  # (a malformed answer: its connection closed)
            logger.debug("bulk POST %s failed: %r", self._shown_url, exc)
            failed = HandlerResult(
                Outcome.RETRY, CONNECTION_ERROR_CLASS, f"{type(exc).__name__}: {exc}"[:512]
            )
            return [failed] * n
        except Exception as exc:  # anything else in building or sending the request
            logger.warning(
                "could not POST %d records to %s: %s: %s",
                n,
                self._shown_url,
                type(exc).__name__,
                exc,
            )
            failed = HandlerResult(
                Outcome.RETRY, REQUEST_ERROR_CLASS, f"{type(exc).__name__}: {exc}"[:512]
            )
            return [failed] * n
        if len(answer.body) > self.max_answer_bytes:
            too_large = HandlerResult(
                Outcome.RETRY,
                TOO_LARGE_CLASS,
                f"the bulk answer is larger than {self.max_answer_bytes} bytes",
            )
            return [too_large] * n
        return results_from_answer(n, answer.status, answer.body, answer.error_header)

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await pool.close()
            except RuntimeError:  # its loop is gone, its transports too
                logger.debug("bulk pool closed after its loop")
