"""Tracing through the whole worker on the in-memory stub broker, spans caught by the SDK's
in-memory exporter: one trace per message across main topic, tiers, dead letter and replay;
exactly one ``traceparent`` on every routed copy; user spans nest under the call's span; off,
nothing changes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from retryd.config import load_settings
from retryd.handlers.base import Message
from retryd.handlers.http_handler import request_headers
from retryd.handlers.python_handler import PythonHandler, SyncPythonHandler
from retryd.policy import headers as h
from retryd.replay.copies import replay_copy_kwargs
from retryd.replay.records import FailedRecord
from retryd.tracing import NO_TRACING, Tracing
from retryd.tracing.context import format_traceparent, parse_traceparent
from retryd.tracing.spans import SpanTracing
from retryd.worker.assembly import build_worker
from retryd.worker.engine import Worker
from tests.stub_kafka import StubBroker

MAIN = "orders"
GROUP = "g"
TIER = "retry_50ms"
FAILED = "failed_topic"
PRODUCER_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def broker() -> StubBroker:
    return StubBroker()


@pytest.fixture
def traced() -> Iterator[Callable[[], tuple[SpanTracing, InMemorySpanExporter]]]:
    """A fresh ``SpanTracing`` per worker run (a run shuts its tracing down)."""
    made: list[InMemorySpanExporter] = []

    def make() -> tuple[SpanTracing, InMemorySpanExporter]:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        made.append(exporter)
        return SpanTracing(provider), exporter

    yield make


def worker(
    broker: StubBroker,
    tmp_path: Path,
    func: Callable[[Message], Any],
    tracing: Tracing,
    sequence: str = "50ms,50ms",
) -> Worker:
    settings = load_settings(
        bootstrap_servers="stub:9092",
        main_topics=MAIN,
        retry_sequence=sequence,
        group_id=GROUP,
        state_dir=tmp_path / "state",
        handler=f"python:{__name__}:unused",
        handler_timeout_s=2.0,
        max_poll_interval_ms=30_000,
        session_timeout_ms=6_000,
        poll_timeout_s=0.05,
        circuit_breaker=False,
    )
    for topic in (MAIN, TIER, FAILED):
        broker.create(topic, 1)
    return build_worker(
        settings,
        PythonHandler(func, timeout_s=2.0),
        drain_grace_s=0.1,
        consumer_factory=broker.consumer,
        producer_factory=broker.producer,
        tracing=tracing,
    )


def calls(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    """The CONSUMER spans, in call order."""
    found = [s for s in spans if s.kind is SpanKind.CONSUMER]
    return sorted(found, key=lambda s: s.start_time or 0)


def traceparent_of(span: ReadableSpan) -> bytes:
    ctx = span.get_span_context()
    assert ctx is not None
    return format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags)).encode()


def only_traceparent(headers: list[tuple[str, bytes | None]]) -> bytes:
    found = [v for k, v in headers if k.lower() == "traceparent"]
    assert len(found) == 1, headers
    assert found[0] is not None
    return found[0]


def test_failing_twice_then_succeeding_is_one_trace_with_links(
    broker: StubBroker, tmp_path: Path, traced: Callable[[], tuple[SpanTracing, Any]]
) -> None:
    tracing, exporter = traced()

    def handler(m: Message) -> None:
        if m.retry_number < 2:
            raise ValueError("not yet")

    w = worker(broker, tmp_path, handler, tracing)
    broker.create(MAIN, 1)
    broker.append(MAIN, b"a", b"no trace", partition=0)
    broker.append(MAIN, b"b", b"traced", [("traceparent", PRODUCER_PARENT.encode())], 0)
    # hostile: two traceparents and a garbled tracestate; the call starts a new trace
    broker.append(
        MAIN, b"c", b"two", [("traceparent", PRODUCER_PARENT.encode()), ("Traceparent", b"x")], 0
    )
    w.run(until_drained=True)
    spans = list(exporter.get_finished_spans())
    consumer = calls(spans)
    assert len(consumer) == 9  # 3 records x 3 calls
    tier = broker.records(TIER)
    assert len(tier) == 6
    producer_trace = parse_traceparent(PRODUCER_PARENT)
    assert producer_trace is not None
    for key in (b"a", b"b", b"c"):
        copies = [r for r in tier if r.key == key]
        assert len(copies) == 2
        tps = [parse_traceparent(only_traceparent(r.headers)) for r in copies]
        assert all(tp is not None for tp in tps)
        trace_ids = {tp.trace_id for tp in tps if tp is not None}
        assert len(trace_ids) == 1  # both copies in one trace
        trace_id = trace_ids.pop()
        mine = [s for s in consumer if s.context is not None and s.context.trace_id == trace_id]
        assert len(mine) == 3, key  # the three calls of this record, one trace
        first, second, third = mine
        # each copy names the call that routed it; the next call is its child and links to it
        assert only_traceparent(copies[0].headers) == traceparent_of(first)
        assert only_traceparent(copies[1].headers) == traceparent_of(second)
        for before, after in ((first, second), (second, third)):
            assert after.parent is not None and before.context is not None
            assert after.parent.span_id == before.context.span_id
            assert [link.context.span_id for link in after.links] == [before.context.span_id]
        assert not first.links
        assert first.status.status_code is StatusCode.ERROR
        assert second.status.status_code is StatusCode.ERROR
        assert third.status.status_code is not StatusCode.ERROR
        assert (first.attributes or {})["retryd.outcome"] == "retry"
        assert (third.attributes or {})["retryd.outcome"] == "success"
        assert (third.attributes or {})["retryd.retry_number"] == 2
        if key == b"b":  # the producer's trace continues; its span is the first call's parent
            assert trace_id == producer_trace.trace_id
            assert first.parent is not None and first.parent.span_id == producer_trace.span_id
        else:  # none, or an ambiguous one: a new trace
            assert trace_id != producer_trace.trace_id and first.parent is None
    attrs = consumer[0].attributes or {}
    assert consumer[0].name == f"{MAIN} process"
    assert attrs["messaging.system"] == "kafka"
    assert attrs["messaging.consumer.group.name"] == GROUP
    assert attrs["messaging.destination.partition.id"] == "0"


def test_dead_letter_and_its_replay_continue_the_trace(
    broker: StubBroker, tmp_path: Path, traced: Callable[[], tuple[SpanTracing, Any]]
) -> None:
    def handler(m: Message) -> None:
        if m.header(h.REPLAY_ID) is None:
            raise ValueError("until replayed")

    tracing, first_run = traced()
    broker.create(MAIN, 1)
    broker.append(MAIN, b"k", b"v", partition=0)
    worker(broker, tmp_path, handler, tracing, sequence="50ms").run(until_drained=True)
    dead = broker.records(FAILED)
    assert len(dead) == 1
    dead_tp = parse_traceparent(only_traceparent(dead[0].headers))
    spans = calls(list(first_run.get_finished_spans()))
    assert len(spans) == 2 and spans[-1].context is not None
    assert only_traceparent(dead[0].headers) == traceparent_of(spans[-1])  # in the trace
    assert dead_tp is not None

    # the replay (as retryd.replay.copies builds it): a replay span in the dead letter's trace
    replay_tracing, replay_spans = traced()
    headers = h.replay_headers(dead[0].headers, replay_id="r-1", replayed_from="failed_topic[0]@0")
    copy = replay_tracing.replay_headers(headers, MAIN)
    replay_tracing.shutdown()
    (replay,) = replay_spans.get_finished_spans()
    assert replay.kind is SpanKind.PRODUCER and replay.name == f"{MAIN} replay"
    assert replay.context is not None and replay.parent is not None
    assert replay.context.trace_id == dead_tp.trace_id
    assert replay.parent.span_id == dead_tp.span_id
    assert [link.context.span_id for link in replay.links] == [dead_tp.span_id]
    assert (replay.attributes or {})["retryd.replay_id"] == "r-1"
    assert only_traceparent(copy) == traceparent_of(replay)

    tracing2, second_run = traced()
    broker.append(MAIN, b"k", b"v", copy, 0)
    worker(broker, tmp_path, handler, tracing2, sequence="50ms").run(until_drained=True)
    (replayed,) = calls(list(second_run.get_finished_spans()))
    assert replayed.context is not None and replayed.parent is not None
    assert replayed.context.trace_id == dead_tp.trace_id  # main → tier → dead → replay: one
    assert replayed.parent.span_id == replay.context.span_id
    assert (replayed.attributes or {})["retryd.outcome"] == "success"


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_spans_a_handler_makes_are_children_of_its_call(
    broker: StubBroker,
    tmp_path: Path,
    traced: Callable[[], tuple[SpanTracing, Any]],
    kind: str,
) -> None:
    tracing, exporter = traced()
    user = tracing._provider.get_tracer("business")

    def sync_handler(m: Message) -> None:
        with user.start_as_current_span("business work"):
            pass

    async def async_handler(m: Message) -> None:
        await asyncio.sleep(0)
        with user.start_as_current_span("business work"):
            await asyncio.sleep(0)

    func = sync_handler if kind == "def" else async_handler
    broker.create(MAIN, 1)
    broker.append(MAIN, b"k", b"v", partition=0)
    worker(broker, tmp_path, func, tracing).run(until_drained=True)
    spans = list(exporter.get_finished_spans())
    (call,) = calls(spans)
    (mine,) = [s for s in spans if s.name == "business work"]
    assert call.context is not None and mine.parent is not None
    assert mine.parent.span_id == call.context.span_id
    assert mine.context is not None and mine.context.trace_id == call.context.trace_id


def test_a_replayed_copy_carries_one_traceparent_of_its_replay_span(
    traced: Callable[[], tuple[SpanTracing, Any]],
) -> None:
    """The copy the sidecar, the CLI and Spark tasks produce (``replay_copy_kwargs``)."""
    tracing, exporter = traced()
    dead = FailedRecord(
        FAILED,
        0,
        7,
        0,
        b"k",
        b"v",
        [
            ("traceparent", PRODUCER_PARENT.encode()),
            ("traceparent", PRODUCER_PARENT.encode()),
            (h.RETRY_NUMBER, b"2"),
            (h.ORIGINAL_TOPIC, MAIN.encode()),
        ],
    )
    off = replay_copy_kwargs(dead, MAIN, 1, "r-2")
    assert [v for k, v in off["headers"] if k == "traceparent"] == [PRODUCER_PARENT.encode()] * 2
    on = replay_copy_kwargs(dead, MAIN, 1, "r-2", tracing)
    (replay,) = exporter.get_finished_spans()
    assert only_traceparent(on["headers"]) == traceparent_of(replay)
    assert replay.parent is None and not replay.links  # two traceparents: no parent to follow
    assert on["key"] == b"k" and on["value"] == b"v"


def test_quick_retries_in_place_are_one_span_of_one_trace(
    broker: StubBroker, tmp_path: Path, traced: Callable[[], tuple[SpanTracing, Any]]
) -> None:
    tracing, exporter = traced()
    attempts: list[int] = []

    def handler(m: Message) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise ValueError("a blip")

    broker.create(MAIN, 1)
    broker.append(MAIN, b"k", b"v", partition=0)
    worker(broker, tmp_path, handler, tracing, sequence="50ms, quick=1@10ms").run(
        until_drained=True
    )
    assert len(attempts) == 2 and not broker.records(TIER)
    (call,) = calls(list(exporter.get_finished_spans()))
    assert (call.attributes or {})["retryd.outcome"] == "success"


def test_an_http_request_carries_the_calls_traceparent() -> None:
    tracing = SpanTracing(TracerProvider())
    incoming = [("traceparent", PRODUCER_PARENT.encode()), ("tracestate", b"congo=t61rcWkgMzE")]
    message = Message(b"k", b"v", incoming, topic=MAIN)
    assert not [v for k, v in request_headers(message) if k == "traceparent"]  # off: none
    span, token = tracing.begin(message, GROUP)
    try:
        sent = dict(request_headers(message))
    finally:
        tracing.end(span, token, PythonHandler(lambda m: None, timeout_s=1).call(message))  # type: ignore[union-attr]
    assert sent["traceparent"] == traceparent_of(span).decode()  # type: ignore[arg-type]
    assert sent["tracestate"] == "congo=t61rcWkgMzE"  # the parent's, carried on
    assert sent["X-Kafka-traceparent"] == PRODUCER_PARENT  # the record's own, as a header


def test_tracing_off_makes_no_spans_and_leaves_headers_alone(
    broker: StubBroker, tmp_path: Path
) -> None:
    seen: list[Message] = []

    def handler(m: Message) -> None:
        seen.append(m)
        if m.retry_number == 0:
            raise ValueError("once")

    hostile = [("traceparent", PRODUCER_PARENT.encode()), ("traceparent", b"junk")]
    broker.create(MAIN, 1)
    broker.append(MAIN, b"k", b"v", list(hostile), 0)
    w = worker(broker, tmp_path, handler, NO_TRACING)
    pool: Any = w.pool
    assert isinstance(pool.handler, SyncPythonHandler)  # not wrapped: calls run as before
    w.run(until_drained=True)
    (copy,) = broker.records(TIER)
    assert [(k, v) for k, v in copy.headers if k == "traceparent"] == hostile  # as they were
    assert len(seen) == 2
    assert all(getattr(m, "_trace", None) is None for m in seen)
