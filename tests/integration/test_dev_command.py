"""README command 1: ``retryd dev`` runs on its own embedded broker and checks its own summary,
with the operator's view: the sidecar's /metrics, /readyz and /v1 URLs and a token for the run
are printed and answer (``--hold`` keeps them up after the summary until Ctrl-C)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.integration.worker_support import REPO
from tests.support import wait_for


def _dev(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "retryd", "dev", "--sequence", "1s,1s", "--partitions", "2", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: a test that must kill it kills all
    )


def _kill_all(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``retryd dev`` and every process it started (broker, workers, sidecar), by its
    process group: killing the command alone left its sidecar running after a failed test."""
    with contextlib.suppress(ProcessLookupError):  # nothing left of the group
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _read_until(proc: subprocess.Popen[bytes], marker: str, timeout: float) -> str:
    """Read the output until ``marker`` (or the end), within ``timeout`` seconds."""
    assert proc.stdout is not None
    seen: list[str] = []
    found = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            seen.append(raw.decode(errors="replace"))
            if marker in seen[-1]:
                found.set()
                return

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    reader.join(timeout)
    return "".join(seen)


def test_retryd_dev_prints_and_serves_the_operators_view() -> None:
    proc = _dev("--messages", "300", "--processes", "2", "--hold")
    try:
        text = _read_until(proc, "holding the broker", 180)
        assert "summary" in text and "drained in" in text, text[-3000:]
        assert "MISSING" not in text, text[-3000:]
        metrics = re.search(r"sidecar metrics\s+(\S+/metrics)", text)
        ready = re.search(r"sidecar ready\s+(\S+/readyz)", text)
        api = re.search(r"sidecar API\s+(\S+/v1/failed)", text)
        token = re.search(r"API token\s+([0-9a-f]{64})", text)
        assert metrics and ready and api and token, text[-3000:]
        body = httpx.get(metrics.group(1), timeout=10).text
        assert "retryd_messages_total" in body and "retryd_workers_alive" in body
        assert httpx.get(ready.group(1), timeout=10).json()["status"] in ("ready", "not_ready")
        auth = {"Authorization": f"Bearer {token.group(1)}"}
        assert httpx.get(api.group(1), timeout=30).status_code == 401
        failed = httpx.get(api.group(1), headers=auth, timeout=30)
        assert failed.status_code == 200 and failed.json()["items"], failed.text[:500]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        _kill_all(proc)  # whatever it left behind, too


@pytest.mark.parametrize("handler", ["http"])
def test_retryd_dev_through_a_business_service_over_http(handler: str) -> None:
    started = time.monotonic()
    proc = _dev("--messages", "150", "--processes", "1", "--handler", handler, "--no-sidecar")
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        _kill_all(proc)  # whatever it left behind, too
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "business service (HTTP handler contract) at http://127.0.0.1:" in text
    assert "summary" in text and "MISSING" not in text, text[-3000:]
    print(f"retryd dev --handler http: {time.monotonic() - started:.1f}s")


def test_retryd_dev_on_apache_kafka() -> None:
    """``--broker kafka``: the same demo on Apache Kafka (KRaft, provisioned from Maven
    Central), checked by its own summary; the broker is stopped by PID at the end."""
    proc = _dev("--messages", "150", "--processes", "1", "--broker", "kafka", "--no-sidecar")
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        _kill_all(proc)  # whatever it left behind, too
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "Apache Kafka pid=" in text, text[-3000:]
    assert "summary" in text and "MISSING" not in text, text[-3000:]
    pid = int(re.search(r"Apache Kafka pid=(\d+)", text).group(1))  # type: ignore[union-attr]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_retryd_dev_stopped_by_sigterm_leaves_nothing_running() -> None:
    proc = _dev("--messages", "50", "--processes", "1", "--hold")
    try:
        text = _read_until(proc, "holding the broker", 180)
        broker = re.search(r"embedded broker pid=(\d+)", text)
        ready = re.search(r"sidecar ready\s+(\S+/readyz)", text)
        assert broker and ready, text[-3000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        _kill_all(proc)  # whatever it left behind, too

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(lambda: gone(int(broker.group(1))), 30, what="the embedded broker stopped")
    with pytest.raises(httpx.HTTPError):
        httpx.get(ready.group(1), timeout=2)  # the sidecar stopped too
