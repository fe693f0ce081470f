"""Readiness follows the broker and the worker heartbeats; liveness does not.

Uses its own embedded broker on a fixed port (stopped and restarted on that port), never the
session broker (also when the suite runs against an external cluster).
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from retryd.kafka.embedded import EmbeddedBroker, free_port
from retryd.runtime.heartbeat import HeartbeatWriter
from tests.integration.sidecar_support import Env, SidecarProcess
from tests.support import wait_for


def _ready(url: str) -> httpx.Response:
    return httpx.get(url + "/readyz", timeout=10)


def test_readiness_follows_broker_and_workers(tmp_path: Path) -> None:
    port = free_port()
    broker = EmbeddedBroker(port=port, log_file=tmp_path / "tansu.log").start()
    env = Env(broker.bootstrap, tmp_path / "state", extra={"RETRYD_HEARTBEAT_STALE_S": "3"})
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    heartbeat = HeartbeatWriter(env.state_dir, "all", env.group, interval_s=0.2)
    try:
        sidecar.start()
        r = _ready(sidecar.url)
        assert r.status_code == 503
        body = r.json()
        assert body["broker"]["ok"] is True
        assert any("no live worker" in reason for reason in body["reasons"]), body

        heartbeat.beat(assigned=2, paused=0, force=True)
        r = _ready(sidecar.url)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "ready" and r.json()["reasons"] == []
        assert r.json()["workers"][0]["pid"] == os.getpid()

        # A live process whose heartbeat stopped (hung worker) makes the sidecar unready.
        stale = wait_for(
            lambda: (resp := _ready(sidecar.url)).status_code == 503 and resp.json(),
            15,
            what="stale heartbeat -> 503",
        )
        assert any("heartbeat is" in reason for reason in stale["reasons"]), stale

        def beating_ready(expect: int) -> dict | None:
            heartbeat.beat(assigned=2, paused=0, force=True)
            resp = _ready(sidecar.url)
            return resp.json() if resp.status_code == expect else None

        wait_for(lambda: beating_ready(200), 15, what="ready again")

        broker.stop()
        down = wait_for(lambda: beating_ready(503), 30, what="503 with the broker stopped")
        assert down["broker"]["ok"] is False
        assert any(f"broker {broker.bootstrap}" in reason for reason in down["reasons"]), down
        assert httpx.get(sidecar.url + "/healthz", timeout=5).status_code == 200

        broker = EmbeddedBroker(port=port, log_file=tmp_path / "tansu.log").start()
        up = wait_for(lambda: beating_ready(200), 30, what="200 after the broker returned")
        assert up["broker"]["ok"] is True
        assert httpx.get(sidecar.url + "/healthz", timeout=5).status_code == 200
    finally:
        heartbeat.remove()
        sidecar.stop()
        broker.stop()
