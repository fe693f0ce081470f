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

from retryd.handlers.http_handler import decode_kafka_headers
from retryd.policy import headers as h
from retryd.tracing.context import parse_traceparent
from tests.integration.sidecar_support import Env, SidecarProcess, failed_headers, seed
from tests.integration.worker_support import REPO, deployment, stop_process
from tests.support import http_service, produce, read_topic, wait_for

LIMIT = 1 << 20  # bytes of one export the receiver reads
PRODUCER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # the producer's span


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
    """Fails every call but a replayed copy's (so main topic and tier fail, whatever a
    rebalance redoes); records the traceparent of each request."""

    lock = threading.Lock()
    seen: list[tuple[bool, str | None]] = []  # (a replayed copy, traceparent)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        kafka = decode_kafka_headers(dict(self.headers.items()))
        replayed = any(name == h.REPLAY_ID for name, _ in kafka)
        with self.lock:
            self.seen.append((replayed, self.headers.get("traceparent")))
        self.send_response(200 if replayed else 503)
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


@pytest.mark.parametrize("exactly_once", [False, True], ids=["default", "exactly_once"])
def test_main_tier_dead_letter_replay_is_one_trace(
    bootstrap: str, tmp_path: Path, collector: str, business: str, exactly_once: bool
) -> None:
    # exactly_once: the copies go out in the worker's transactions (their headers made the
    # same way), and a read_committed reader sees each once
    dep = deployment(
        bootstrap, tmp_path, sequence="1s", handler=business, exactly_once=exactly_once
    )
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
        "OTEL_SERVICE_NAME": "retryd-test",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    env = {**dep.env(), **otel, "RETRYD_LEDGER_TOPIC": f"{dep.settings.group_id}.ledger"}
    # the producer's traceparent: every call of the record, a redo after a rebalance included,
    # belongs to its trace
    produce(bootstrap, dep.main, [(b"order-1", b"{}", [("traceparent", PRODUCER.encode())])])
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
        wait_for(lambda: any(r for r, _ in _Business.seen), 60, what="the replayed call")
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
    trace_id = PRODUCER.split("-")[1]
    assert {s["trace"] for s in spans} == {trace_id}, spans  # one trace: the producer's
    assert {s["service"] for s in spans} == {"retryd-test"}
    calls = [s for s in spans if s["kind"] == Span.SPAN_KIND_CONSUMER]
    (replay_span,) = [s for s in spans if s["name"].endswith(" replay")]
    ids = {s["span"]: s for s in spans}
    # main topic: children of the producer's span, no links (not a copy of retryd's)
    main = [s for s in calls if s["parent"] == PRODUCER.split("-")[2]]
    assert main and all(not s["links"] and s["name"] == f"{dep.main} process" for s in main)
    # the tier call: a child of a main call, linked to it
    tier = [s for s in calls if s["parent"] in {m["span"] for m in main}]
    assert tier and all(s["links"] == [s["parent"]] for s in tier), spans
    # the dead letter names a tier call; the replay span is its child; the replayed call the
    # replay span's
    dead_parent = parse_traceparent(dead_tp[0])
    assert dead_parent is not None
    assert f"{dead_parent.span_id:016x}" in {s["span"] for s in tier}
    assert replay_span["parent"] == f"{dead_parent.span_id:016x}"
    assert replay_span["links"] == [replay_span["parent"]]
    replayed = [s for s in calls if s["parent"] == replay_span["span"]]
    assert replayed and all(s["links"] == [replay_span["span"]] for s in replayed), spans
    assert len(main) + len(tier) + len(replayed) == len(calls), spans
    # the service saw, with every request, the traceparent of that call's own span
    with _Business.lock:
        received = [parse_traceparent(tp) for _, tp in _Business.seen]
    assert len(received) == len(calls)
    assert all(tp is not None and f"{tp.trace_id:032x}" == trace_id for tp in received)
    assert {f"{tp.span_id:016x}" for tp in received if tp is not None} == {s["span"] for s in calls}
    assert all(s["span"] in ids for s in calls)


def test_a_sidecar_replay_continues_the_dead_letters_trace(
    bootstrap: str, tmp_path: Path, collector: str
) -> None:
    """``POST /v1/failed/{partition}/{offset}/replay`` on a sidecar with tracing on: the copy
    carries exactly one traceparent, its replay span's, a child of the dead letter's."""
    env = Env(
        bootstrap,
        tmp_path / "state",
        extra={"OTEL_EXPORTER_OTLP_ENDPOINT": collector, "OTEL_BSP_SCHEDULE_DELAY": "200"},
    ).create(failed_partitions=1, main_partitions=1)
    dead_letter = failed_headers(env.main, user=[("traceparent", PRODUCER.encode())])
    seed(bootstrap, env.failed, [(b"k", b"v", dead_letter)])
    with SidecarProcess(env, tmp_path / "sidecar.log") as sidecar, sidecar.client() as client:
        answer = client.post("/v1/failed/0/0/replay")
        assert answer.status_code == 200, answer.text
        (copy,) = read_topic(bootstrap, env.main, expect=1)
    # stopped: its spans are flushed
    exported = wait_for(_spans, 30, what="the replay span")
    (replay_span,) = exported
    assert replay_span["name"] == f"{env.main} replay"
    assert replay_span["kind"] == Span.SPAN_KIND_PRODUCER
    assert replay_span["trace"] == PRODUCER.split("-")[1]
    assert replay_span["parent"] == replay_span["links"][0] == PRODUCER.split("-")[2]
    assert replay_span["attrs"]["retryd.replay_id"].string_value == answer.json()["replay_id"]
    (traceparent,) = [v for k, v in copy.headers if k == "traceparent"]
    parsed = parse_traceparent(traceparent)
    assert parsed is not None and f"{parsed.span_id:016x}" == replay_span["span"]
