"""Tracing switched on: each handler call is a CONSUMER span, each routed copy carries it.

The trace model (one trace per message, across every hop):

* A handler call is a span ``<topic> process`` (kind CONSUMER, messaging attributes, the
  outcome; status ERROR when the call failed). It is the current span while business code
  runs, so spans the handler makes (or its HTTP client's instrumentation) nest under it.
* Its parent is the record's ``traceparent`` when it carries exactly one valid one
  (``retryd.tracing.context.trace_headers``); otherwise the call starts a new trace.
* A routed copy (tier or dead letter) carries a fresh ``traceparent`` naming the call span
  that routed it, *replacing* whatever trace headers the record had. The next attempt's span
  is therefore a child of the previous attempt's span, and links to it as well (a copy of
  retryd's: ``retry_number`` > 0 or a replay), as the messaging conventions link a consumer
  to the context its message was created in.
* A replayed copy gets a ``<target> replay`` span (kind PRODUCER), a child of the dead
  letter's ``traceparent`` and linked to it, and carries that span's ``traceparent``: the
  replayed attempt continues the dead letter's trace.

OpenTelemetry is imported only here, and this module only when tracing is switched on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from retryd import __version__
from retryd.handlers.base import AsyncHandler, Handler, Message, SyncHandler, is_async_handler
from retryd.policy.classify import HandlerResult, Outcome, timeout_result
from retryd.policy.headers import REPLAY_ID, REPLAYED_FROM, Headers
from retryd.policy.routing import Route
from retryd.tracing.base import Tracing
from retryd.tracing.context import (
    AttemptTrace,
    TraceParent,
    format_traceparent,
    replace_trace_headers,
    trace_headers,
)

log = logging.getLogger(__name__)

_OK = frozenset({Outcome.SUCCESS, Outcome.DROP})


def _remote(parent: TraceParent, state: str | None) -> SpanContext:
    trace_state = None
    if state:
        try:
            trace_state = TraceState.from_header([state])
        except Exception:  # a tracestate the SDK cannot read is dropped, never an error
            trace_state = None
    return SpanContext(
        parent.trace_id,
        parent.span_id,
        is_remote=True,
        trace_flags=TraceFlags(parent.flags & 0xFF),
        trace_state=trace_state,
    )


def _headers_of(span: Span) -> tuple[str, str | None]:
    ctx = span.get_span_context()
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    return format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags)), state or None


def _is_replay(headers: Headers) -> bool:
    return any(name == REPLAY_ID for name, _ in headers)


class SpanTracing(Tracing):
    """Tracing through an OpenTelemetry ``TracerProvider`` (built from the environment by
    ``tracing_from_env``, or given by a test with an in-memory exporter)."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("retryd", __version__)

    # ---------------------------------------------------------------- handler calls
    def wrap(self, handler: Handler, group: str) -> Handler:
        if is_async_handler(handler):
            assert isinstance(handler, AsyncHandler)
            return TracedAsyncHandler(handler, self, group)
        assert isinstance(handler, SyncHandler)
        return TracedSyncHandler(handler, self, group)

    def begin(self, message: Message, group: str) -> tuple[Span, object]:
        """Start the call's span, make it current, and leave its trace on ``message``."""
        headers = message.headers
        parent, state = trace_headers(headers)
        retry_number = message.retry_number
        links: list[Link] = []
        if parent is not None:
            remote = _remote(parent, state)
            ctx = trace.set_span_in_context(NonRecordingSpan(remote), Context())
            if retry_number > 0 or _is_replay(headers):
                links.append(Link(remote, {"retryd.link": "previous_attempt"}))
        else:
            ctx = Context()
        topic = message.topic
        span = self._tracer.start_span(
            f"{topic} process",
            context=ctx,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": topic,
                "messaging.destination.partition.id": str(message.partition),
                "messaging.kafka.message.offset": message.offset,
                "messaging.consumer.group.name": group,
                "retryd.retry_number": retry_number,
                "retryd.original_topic": message.original_topic,
            },
            links=links,
        )
        traceparent, tracestate = _headers_of(span)
        message._trace = AttemptTrace(span, traceparent, tracestate)
        token = otel_context.attach(trace.set_span_in_context(span, ctx))
        return span, token

    def end(self, span: Span, token: object, result: HandlerResult) -> None:
        """Leave the call's context and end its span with the outcome."""
        otel_context.detach(token)  # type: ignore[arg-type]
        span.set_attribute("retryd.outcome", result.outcome.value)
        if result.outcome not in _OK:
            error = result.error_class or "unknown"
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    # ---------------------------------------------------------------- routed copies
    def stamp(self, message: Message, route: Route) -> None:
        attempt: AttemptTrace | None = getattr(message, "_trace", None)
        if attempt is None:
            return  # no call of this process routed it: its headers stay as they are
        state = attempt.tracestate.encode("ascii") if attempt.tracestate else None
        route.headers = replace_trace_headers(
            route.headers, attempt.traceparent.encode("ascii"), state
        )

    def replay_headers(self, headers: Headers, target: str) -> Headers:
        parent, state = trace_headers(headers)
        links: list[Link] = []
        if parent is not None:
            remote = _remote(parent, state)
            ctx = trace.set_span_in_context(NonRecordingSpan(remote), Context())
            links.append(Link(remote, {"retryd.link": "dead_letter"}))
        else:
            ctx = Context()
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.operation.name": "replay",
            "messaging.destination.name": target,
        }
        for name, value in headers:
            if name in (REPLAY_ID, REPLAYED_FROM) and value is not None:
                attributes[f"retryd.{name.removeprefix('retryd_')}"] = value.decode(
                    "utf-8", errors="replace"
                )[:256]
        span = self._tracer.start_span(
            f"{target} replay",
            context=ctx,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            links=links,
        )
        span.end()
        traceparent, tracestate = _headers_of(span)
        return replace_trace_headers(
            headers,
            traceparent.encode("ascii"),
            tracestate.encode("ascii") if tracestate else None,
        )

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self._provider.force_flush(int(timeout_s * 1000))
        self._provider.shutdown()


class TracedSyncHandler:
    """A ``SyncHandler`` whose every call is a span (current while the call runs)."""

    def __init__(self, inner: SyncHandler, tracing: SpanTracing, group: str) -> None:
        self._inner = inner
        self._tracing = tracing
        self._group = group
        self.timeout_s = inner.timeout_s

    def call(self, message: Message) -> HandlerResult:
        try:
            span, token = self._tracing.begin(message, self._group)
        except Exception:  # tracing must never cost a record its call
            log.debug("%s: could not start the call's span", message.where, exc_info=True)
            return self._inner.call(message)
        try:
            result = self._inner.call(message)
        except BaseException as exc:  # adapters never raise; the pool treats it as a retry
            self._tracing.end(span, token, HandlerResult(Outcome.RETRY, type(exc).__name__))
            raise
        self._tracing.end(span, token, result)
        return result

    def close(self) -> None:
        self._inner.close()


class TracedAsyncHandler:
    """An ``AsyncHandler`` whose every call is a span (current in the call's task)."""

    def __init__(self, inner: AsyncHandler, tracing: SpanTracing, group: str) -> None:
        self._inner = inner
        self._tracing = tracing
        self._group = group
        self.timeout_s = inner.timeout_s

    async def acall(self, message: Message) -> HandlerResult:
        try:
            span, token = self._tracing.begin(message, self._group)
        except Exception:  # tracing must never cost a record its call
            log.debug("%s: could not start the call's span", message.where, exc_info=True)
            return await self._inner.acall(message)
        try:
            result = await self._inner.acall(message)
        except asyncio.CancelledError:  # the call's timeout (or shutdown) cut it off
            self._tracing.end(span, token, timeout_result(self.timeout_s))
            raise
        except BaseException as exc:
            self._tracing.end(span, token, HandlerResult(Outcome.RETRY, type(exc).__name__))
            raise
        self._tracing.end(span, token, result)
        return result

    async def aclose(self) -> None:
        await self._inner.aclose()
