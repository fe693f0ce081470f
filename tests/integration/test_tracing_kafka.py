"""One trace per message on a real broker: the ``retryd worker`` CLI with tracing switched on
by the standard OTEL_* variables, exporting over OTLP/HTTP to a real receiver in this test
(decoding the protobuf ``ExportTraceServiceRequest``), calling a real HTTP business service
that records the ``traceparent`` it receives. A record fails on the main topic, fails again in
the tier, is dead-lettered, is replayed with ``retryd replay``, and succeeds: every span of
its journey (worker calls and the replay) shares one trace id, and every request the service
got carries a ``traceparent`` of that trace naming the call's own span."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from retryd.tracing.context import parse_traceparent
from tests.integration.worker_support import REPO, deployment, stop_process
from tests.support import http_service, produce, read_topic, wait_for

LIMIT = 1 << 20  # bytes of one export the receiver reads


class _Receiver(BaseHTTPRequestHandler):
    """OTLP/HTTP traces endpoint: decodes each export and keeps its spans."""

    lock = threading.Lock()
    spans: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(min(size, LIMIT))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    found.append(
                        {
                            "service": service.get("service.name"),
                            "name": span.name,
                            "kind": span.kind,
                            "trace": span.trace_id.hex(),
                            "span": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "links": [link.span_id.hex() for link in span.links],
                            "attrs": {a.key: a.value for a in span.attributes},
                        }
                    )
        with self.lock:
            self.spans.extend(found)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


class _Business(BaseHTTPRequestHandler):
    """Fails the first two calls (main topic, tier), then succeeds; records traceparents."""

    lock = threading.Lock()
    seen: list[tuple[str, str | None]] = []  # (retry number header, traceparent)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.lock:
            self.seen.append(
                (self.headers.get("X-Retryd-Retry-Number", ""), self.headers.get("traceparent"))
            )
            status = 503 if len(self.seen) <= 2 else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    _Receiver.spans = []
    with http_service(_Receiver) as url:
        yield url.removesuffix("/handle")


@pytest.fixture
def business() -> Iterator[str]:
    _Business.seen = []
    with http_service(_Business) as url:
        yield url


def _spans() -> list[dict[str, Any]]:
    with _Receiver.lock:
        return list(_Receiver.spans)


def test_main_tier_dead_letter_replay_is_one_trace(
    bootstrap: str, tmp_path: Path, collector: str, business: str
) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s", handler=business)
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
        "OTEL_SERVICE_NAME": "retryd-test",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    env = {**dep.env(), **otel, "RETRYD_LEDGER_TOPIC": f"{dep.settings.group_id}.ledger"}
    produce(bootstrap, dep.main, [(b"order-1", b"{}")])
    worker = dep.spawn_worker(tmp_path / "worker.log", env=env)
    try:
        (dead,) = read_topic(bootstrap, dep.failed, expect=1, timeout=60)
        dead_tp = [v for k, v in dead.headers if k == "traceparent"]
        assert len(dead_tp) == 1  # exactly one, replaced at each hop
        replay = subprocess.run(
            [sys.executable, "-m", "retryd", "replay", "--yes", "--json"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replay.returncode == 0, replay.stderr[-2000:]
        wait_for(lambda: len(_Business.seen) >= 3, 60, what="the replayed call")
    finally:
        assert stop_process(worker) == 0  # a clean exit flushes the worker's spans

    def journey() -> list[dict[str, Any]] | None:
        spans = _spans()
        calls = [s for s in spans if s["kind"] == Span.SPAN_KIND_CONSUMER]
        replays = [s for s in spans if s["name"].endswith(" replay")]
        return spans if len(calls) >= 3 and replays else None

    exported = wait_for(journey, 30, what="the exported spans")
    assert exported is not None
    spans = exported
    assert {s["trace"] for s in spans} == {spans[0]["trace"]}, spans  # one trace
    trace_id = spans[0]["trace"]
    assert {s["service"] for s in spans} == {"retryd-test"}
    calls = [s for s in spans if s["kind"] == Span.SPAN_KIND_CONSUMER]
    (replay_span,) = [s for s in spans if s["name"].endswith(" replay")]
    assert len(calls) == 3
    (main,) = [s for s in calls if s["parent"] == ""]  # the producer sent no traceparent
    (tier,) = [s for s in calls if s["parent"] == main["span"]]
    (replayed,) = [s for s in calls if s["parent"] == replay_span["span"]]
    assert main["parent"] == "" and main["name"] == f"{dep.main} process"
    assert tier["parent"] == main["span"] and tier["links"] == [main["span"]]
    assert replay_span["parent"] == tier["span"]  # the dead letter named the tier call
    assert replayed["parent"] == replay_span["span"] and replayed["links"] == [replay_span["span"]]
    dead_parent = parse_traceparent(dead_tp[0])
    assert dead_parent is not None and f"{dead_parent.span_id:016x}" == tier["span"]
    # the service saw the traceparent of each call's own span
    received = [parse_traceparent(tp) for _, tp in _Business.seen]
    assert all(tp is not None and f"{tp.trace_id:032x}" == trace_id for tp in received)
    assert {f"{tp.span_id:016x}" for tp in received if tp is not None} == {s["span"] for s in calls}
