"""The demo services of compose and the Kubernetes example: ``retryd demo business`` answers
the HTTP handler contract (and ``retryd health --http`` probes it), ``retryd demo traffic``
produces orders at a rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from retryd.dev.business import Behaviour, decide
from retryd.kafka.embedded import free_port
from tests.integration.worker_support import REPO, stop_process
from tests.support import create_topics, read_topic, unique, wait_for

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def retryd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "retryd", *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_business_service_and_its_health_check(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "retryd", "demo", "business", "--port", str(port)],
        cwd=REPO,
        env={**ENV, "FAIL_SHARE": "1", "NOT_FOUND_SHARE": "0"},  # read from the environment
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: retryd("health", "--http", url + "/healthz").returncode == 0, 30, 0.2)
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.post("/handle", content=b"plain order").status_code == 503
            order = json.dumps({"order": 1, "fail_times": 1}).encode()
            first = client.post("/handle", content=order, headers={"X-Retryd-Retry-Number": "0"})
            retry = client.post("/handle", content=order, headers={"X-Retryd-Retry-Number": "1"})
            assert (first.status_code, retry.status_code) == (503, 200)
            poison = client.post("/handle", content=b'{"order": 2, "poison": true}')
            assert poison.status_code == 404
        down = retryd("health", "--http", f"http://127.0.0.1:{free_port()}/healthz")
        assert down.returncode == 1 and "FAIL http" in down.stderr
    finally:
        stop_process(proc)  # type: ignore[arg-type]


def test_business_shares() -> None:
    shares = Behaviour(fail_share=0.25, not_found_share=0.125)
    codes = [decide(b"x", 0, shares, (i + 0.5) / 200) for i in range(200)]
    assert (codes.count(404), codes.count(503), codes.count(200)) == (25, 50, 125)


def test_traffic_producer(bootstrap: str) -> None:
    topic = unique("orders")
    create_topics(bootstrap, [topic], 2)
    done = retryd(
        "demo", "traffic", "-b", bootstrap, "--topic", topic, "--rate", "500", "--count", "25"
    )
    assert done.returncode == 0, done.stderr
    records = read_topic(bootstrap, topic, expect=25)
    assert len(records) == 25 and all(json.loads(r.value or b"")["order"] >= 0 for r in records)
