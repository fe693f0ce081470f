"""The share worker's handler calls on a real broker: the HTTP handler (the async path) and a
sync Python handler, at most ``max_in_flight`` at a time and more than one at a time on a
single partition (what a consumer group cannot do with key order), and a sync call past its
timeout routed as a retryable ``timeout``.

The worker runs in this process (its ``run`` on a thread, ``stop`` to end it), so the test can
read its counters; ``test_share_mode.py`` runs it through the CLI.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from retryd.handlers.loader import load_handler
from retryd.share.build import build_share_worker
from retryd.share.worker import ShareWorker
from retryd.worker.events import Events
from tests.integration.test_share_mode import pytestmark as share_mark
from tests.integration.test_share_mode import share_deployment
from tests.integration.worker_support import Deployment
from tests.support import http_service, json_lines, read_topic, wait_for

pytestmark = share_mark
ACCEPTED = "retryd_share_acknowledgements_total"


class _Service(BaseHTTPRequestHandler):
    """Answers ``status`` after ``sleep`` seconds; counts the requests in progress."""

    lock = threading.Lock()
    inflight = 0
    peak = 0
    seen: list[str] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        spec = json.loads(body)
        cls = type(self)
        with cls.lock:
            cls.inflight += 1
            cls.peak = max(cls.peak, cls.inflight)
            cls.seen.append(spec["id"])
        try:
            time.sleep(spec.get("sleep", 0))
        finally:
            with cls.lock:
                cls.inflight -= 1
        self.send_response(spec.get("status", 200))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def service() -> Iterator[str]:
    _Service.inflight = _Service.peak = 0
    _Service.seen = []
    with http_service(_Service) as url:
        yield url


class Running:
    def __init__(self, d: Deployment) -> None:
        s = d.settings
        handler = load_handler(
            s.handler,
            timeout_s=s.handler_timeout_s,
            non_retryable=s.non_retryable,
            max_in_flight=s.max_in_flight,
        )
        self.worker: ShareWorker = build_share_worker(s, handler, Events([]), heartbeat=False)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(60)
        assert not self.thread.is_alive()
        assert self.error is None, self.error


def test_http_handler_calls_overlap_on_one_partition_up_to_max_in_flight(
    bootstrap: str, tmp_path: Path, service: str
) -> None:
    d = share_deployment(bootstrap, tmp_path, sequence="1s", handler=service, max_in_flight=4)
    d.send(
        [
            *({"id": f"ok{i}", "sleep": 0.5} for i in range(12)),
            {"id": "busy", "status": 503},
            {"id": "bad", "status": 400},
        ]
    )
    accepted = REGISTRY.get_sample_value(ACCEPTED, {"type": "accept"}) or 0
    run = Running(d)
    try:
        wait_for(lambda: run.worker.handled == 14, 60, what="14 records acknowledged")
    finally:
        run.stop()
    assert sorted(_Service.seen) == sorted(["busy", "bad", *(f"ok{i}" for i in range(12))])
    assert _Service.peak == 4  # one partition, four calls at a time, never more
    (retry,) = read_topic(bootstrap, d.tier("1s"), expect=1)
    assert json.loads(retry.value)["id"] == "busy"
    assert retry.header("retryd_error_class") == b"http_503"
    (dead,) = read_topic(bootstrap, d.failed, expect=1)
    assert json.loads(dead.value)["id"] == "bad"
    assert dead.header("retryd_dead_reason") == b"non_retryable"
    assert REGISTRY.get_sample_value(ACCEPTED, {"type": "accept"}) == accepted + 14


def test_sync_calls_are_bounded_and_a_hung_call_times_out(
    bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("RETRYD_TEST_LOG", str(log))
    d = share_deployment(
        bootstrap,
        tmp_path,
        sequence="1s",
        handler="python:tests.integration.handlers:timed",
        handler_timeout_s=1.0,
        max_in_flight=3,
    )
    d.send(
        [
            *({"id": f"s{i}", "mode": "slow", "seconds": 0.3} for i in range(9)),
            {"id": "hangs", "mode": "hang", "seconds": 3},
        ]
    )
    run = Running(d)
    try:
        wait_for(lambda: run.worker.handled == 10, 60, what="10 records acknowledged")
        (copy,) = read_topic(bootstrap, d.tier("1s"), expect=1)
    finally:
        run.stop()
    assert json.loads(copy.value)["id"] == "hangs"
    assert copy.header("retryd_error_class") == b"timeout"
    # the hung thread ends later and is logged then; the calls that ran meanwhile never
    # exceeded three at a time
    entries = wait_for(lambda: len(json_lines(log)) == 10 and json_lines(log), 10)
    assert max(e["inflight"] for e in entries) == 3


def test_a_record_whose_lock_cannot_hold_a_call_is_released_not_run_late(
    bootstrap: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One call at a time, a 10 s timeout, a 15 s lock: the records polled with a 4 s call
    wait 4 s for it, after which their lock could no longer hold a 10 s call (+ 2 s). They
    are released, come back at once (their next delivery has a fresh lock) and are handled."""
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("RETRYD_TEST_LOG", str(log))
    d = share_deployment(
        bootstrap,
        tmp_path,
        handler="python:tests.integration.handlers:behave",
        handler_timeout_s=10.0,
        max_in_flight=1,
    )
    d.send([{"id": "slow", "mode": "slow", "seconds": 4}, {"id": "b"}, {"id": "c"}])
    released = REGISTRY.get_sample_value(ACCEPTED, {"type": "release"}) or 0
    run = Running(d)
    try:
        wait_for(
            lambda: (
                {c["id"] for c in json_lines(log)} == {"slow", "b", "c"} and run.worker.handled == 5
            ),
            60,
            what="every record handled, two of them after a release",
        )
    finally:
        run.stop()
    assert sorted(c["id"] for c in json_lines(log)) == ["b", "c", "slow"]  # each called once
    assert REGISTRY.get_sample_value(ACCEPTED, {"type": "release"}) == released + 2
    assert "2 of 3 records released unhandled" in caplog.text
