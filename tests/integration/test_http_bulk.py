"""HttpBulkHandler against the real Go business service (bench/peers/goservice): per-record
outcomes, and every whole-request failure turned into a result for each record."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator, Sequence

import pytest

from bench import goservice
from retryd.handlers.base import AsyncBatchHandler, Message
from retryd.handlers.http_bulk import (
    BAD_ANSWER_CLASS,
    MISSING_CLASS,
    TOO_LARGE_CLASS,
    HttpBulkHandler,
)
from retryd.policy.classify import HandlerResult, Outcome


@pytest.fixture(scope="module")
def service() -> Iterator[goservice.Service]:
    with goservice.start(fail_match="BOOM") as svc:
        yield svc


def _msgs(*values: bytes | None, key: bytes | None = b"k") -> list[Message]:
    return [
        Message(key=key, value=v, topic="orders", partition=1, offset=i)
        for i, v in enumerate(values)
    ]


def call(
    url: str, messages: Sequence[Message], timeout_s: float = 5.0, max_batch: int = 100
) -> list[HandlerResult]:
    async def go() -> list[HandlerResult]:
        handler = HttpBulkHandler(url, timeout_s=timeout_s, max_batch=max_batch, max_connections=4)
        try:
            return list(await handler.acall_batch(messages))
        finally:
            await handler.aclose()

    return asyncio.run(go())


def test_is_an_async_batch_handler() -> None:
    handler = HttpBulkHandler(
        "http://127.0.0.1:9/bulk", timeout_s=1, max_batch=10, max_connections=1
    )
    assert isinstance(handler, AsyncBatchHandler)


def test_mixed_statuses(service: goservice.Service) -> None:
    messages = _msgs(
        b"fine",
        b"status:DEAD",
        b"status:DROP",
        b"status:RETRY",
        b"has BOOM inside",
        b"status:success",
        b"status:WHATEVER",
        None,
        b"\xff\x00 binary",
    )
    got = call(service.bulk_url, messages)
    assert [r.outcome for r in got] == [
        Outcome.SUCCESS,
        Outcome.DEAD,
        Outcome.DROP,
        Outcome.RETRY,
        Outcome.RETRY,
        Outcome.SUCCESS,  # status words are case-insensitive, as in the single-record mode
        Outcome.RETRY,
        Outcome.SUCCESS,
        Outcome.SUCCESS,
    ]
    assert (got[1].error_class, got[1].error_message) == ("http_200", "asked DEAD")
    assert (got[4].error_class, got[4].error_message) == ("http_200", "matched")
    assert got[6].error_class == "bulk_bad_status"


def test_key_match_fails_only_that_record(service: goservice.Service) -> None:
    messages = [*_msgs(b"a", b"b"), *_msgs(b"c", key=b"BOOM-key")]
    got = call(service.bulk_url, messages)
    assert [r.outcome for r in got] == [Outcome.SUCCESS, Outcome.SUCCESS, Outcome.RETRY]


def test_missing_and_unknown_ids(service: goservice.Service) -> None:
    got = call(service.bulk_url + "?mode=unknown", _msgs(b"ok", b"omit", b"ok", b"omit"))
    assert [r.outcome for r in got] == [Outcome.SUCCESS, Outcome.RETRY] * 2
    assert {got[1].error_class, got[3].error_class} == {MISSING_CLASS}


@pytest.mark.parametrize(
    ("mode", "error_class"),
    [("badjson", BAD_ANSWER_CLASS), ("5xx", "http_503"), ("big", TOO_LARGE_CLASS)],
)
def test_whole_request_failures_retry_every_record(
    service: goservice.Service, mode: str, error_class: str
) -> None:
    got = call(service.bulk_url + f"?mode={mode}", _msgs(b"a", b"b", b"c"))
    assert [(r.outcome, r.error_class) for r in got] == [(Outcome.RETRY, error_class)] * 3


def test_bad_request_is_a_retry_not_a_dead_letter(service: goservice.Service) -> None:
    # The service refuses the request as a whole (here 404): no record was judged.
    got = call(service.base + "/handle-does-not-exist", _msgs(b"a", b"b"))
    assert [r.outcome for r in got] == [Outcome.RETRY] * 2
    assert got[0].error_class == "http_404"


def test_timeout_then_usable(service: goservice.Service) -> None:
    started = time.monotonic()
    got = call(service.bulk_url + "?mode=hang", _msgs(b"a", b"b"), timeout_s=0.5)
    assert 0.45 <= time.monotonic() - started < 10
    assert [(r.outcome, r.error_class) for r in got] == [(Outcome.RETRY, "timeout")] * 2
    assert [r.outcome for r in call(service.bulk_url, _msgs(b"a"))] == [Outcome.SUCCESS]


def test_connection_refused() -> None:
    with socket.socket() as sock:  # bound, not listening: refused, and no one else has it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        got = call(f"http://127.0.0.1:{port}/bulk", _msgs(b"a", b"b"))
    assert [(r.outcome, r.error_class) for r in got] == [(Outcome.RETRY, "connection_error")] * 2


def test_more_than_max_batch_is_split(service: goservice.Service) -> None:
    before = service.stats()["requests"]
    got = call(service.bulk_url, _msgs(*[b"x"] * 25), max_batch=10)
    assert [r.outcome for r in got] == [Outcome.SUCCESS] * 25
    assert service.stats()["requests"] - before == 3


def test_many_concurrent_batches_share_the_pool(service: goservice.Service) -> None:
    async def go() -> list[Sequence[HandlerResult]]:
        handler = HttpBulkHandler(service.bulk_url, timeout_s=10, max_batch=200, max_connections=4)
        try:
            return await asyncio.gather(
                *(handler.acall_batch(_msgs(*[b"v%d" % i] * 200)) for i in range(20))
            )
        finally:
            await handler.aclose()

    before = service.stats()["records"]
    batches = asyncio.run(go())
    assert all(r.outcome is Outcome.SUCCESS for batch in batches for r in batch)
    assert service.stats()["records"] - before == 4000


def test_compact_answers_name_only_the_exceptions(service: goservice.Service) -> None:
    messages = _msgs(b"fine", b"status:DEAD", b"BOOM", b"fine", b"status:DROP")
    got = call(service.bulk_url + "?compact=1", messages)
    assert [r.outcome for r in got] == [
        Outcome.SUCCESS,
        Outcome.DEAD,
        Outcome.RETRY,
        Outcome.SUCCESS,
        Outcome.DROP,
    ]
