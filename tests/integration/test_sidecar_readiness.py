"""Readiness follows the broker and the worker heartbeats; liveness does not. Without a
token, /readyz tells only the status and reason codes (no hosts, paths, PIDs, group ids).

Uses its own broker of the suite's kind (``tests.support.dedicated_broker``: Apache Kafka by
default) on a fixed port, stopped and restarted on that port; never the session broker (also
when the suite runs against an external cluster).
"""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import httpx

from retryd.kafka.embedded import free_port
from retryd.runtime.heartbeat import HeartbeatWriter
from tests.integration.sidecar_support import TOKEN, Env, SidecarProcess
from tests.support import dedicated_broker, wait_for

# A PID that does not exist here (above the kernel's pid_max limit of 2^22).
FOREIGN_PID = 2**22 + 17


def _ready(url: str, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(url + "/readyz", timeout=10, headers=headers)


def _assert_public(resp: httpx.Response, env: Env, status: int, reasons: list[str]) -> None:
    """The anonymous answer: status and codes, nothing that locates the deployment."""
    assert resp.status_code == status, resp.text
    assert resp.json() == {"status": "ready" if status == 200 else "not_ready", "reasons": reasons}
    for secret in ("127.0.0.1", str(os.getpid()), env.group, str(env.state_dir)):
        assert secret not in resp.text, secret


def test_readiness_follows_broker_and_workers(tmp_path: Path) -> None:
    port = free_port()
    broker = dedicated_broker(tmp_path / "broker.log", port=port).start()
    env = Env(broker.bootstrap, tmp_path / "state", extra={"RETRYD_HEARTBEAT_STALE_S": "3"})
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    heartbeat = HeartbeatWriter(env.state_dir, "all", env.group, interval_s=0.2)
    try:
        sidecar.start()
        r = _ready(sidecar.url)
        assert r.status_code == 503
        body = r.json()
        assert body["broker"]["ok"] is True and body["reasons"] == ["no_live_worker"]
        assert any("no live worker" in line for line in body["details"]), body
        _assert_public(_ready(sidecar.url, None), env, 503, ["no_live_worker"])
        _assert_public(_ready(sidecar.url, "x" * 40), env, 503, ["no_live_worker"])

        heartbeat.beat(assigned=2, paused=0, force=True)
        r = _ready(sidecar.url)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "ready" and r.json()["reasons"] == []
        assert r.json()["workers"][0]["pid"] == os.getpid()
        _assert_public(_ready(sidecar.url, None), env, 200, [])

        # A live process whose heartbeat stopped (hung worker) makes the sidecar unready.
        stale = wait_for(
            lambda: (resp := _ready(sidecar.url)).status_code == 503 and resp.json(),
            15,
            what="stale heartbeat -> 503",
        )
        assert stale["reasons"] == ["worker_heartbeat_stale", "no_live_worker"] or stale[
            "reasons"
        ] == ["no_live_worker", "worker_heartbeat_stale"], stale
        assert any("stopped beating" in line for line in stale["details"]), stale

        # No shared PID namespace: a worker in another container of the pod has a PID this
        # sidecar cannot see. Its fresh heartbeat is what counts; "stopping" does not count.
        foreign = HeartbeatWriter(env.state_dir, "all", env.group, interval_s=0)
        foreign.path = foreign.dir / f"{FOREIGN_PID}.json"
        heartbeat.remove()
        with mock.patch("os.getpid", return_value=FOREIGN_PID):
            foreign.beat(assigned=1, paused=0, force=True)
        seen = wait_for(
            lambda: (resp := _ready(sidecar.url)).status_code == 200 and resp.json(),
            15,
            what="ready on a heartbeat whose PID is not in this namespace",
        )
        assert [w["pid"] for w in seen["workers"]] == [FOREIGN_PID], seen
        with mock.patch("os.getpid", return_value=FOREIGN_PID):
            foreign.beat(assigned=1, paused=0, state="stopping", force=True)
        _assert_public(_ready(sidecar.url, None), env, 503, ["no_live_worker"])
        foreign.remove()

        def beating_ready(expect: int) -> dict | None:
            heartbeat.beat(assigned=2, paused=0, force=True)
            resp = _ready(sidecar.url)
            return resp.json() if resp.status_code == expect else None

        wait_for(lambda: beating_ready(200), 15, what="ready again")

        broker.stop()
        down = wait_for(lambda: beating_ready(503), 30, what="503 with the broker stopped")
        assert down["broker"]["ok"] is False and down["reasons"] == ["broker_unreachable"]
        assert any(f"broker {broker.bootstrap}" in line for line in down["details"]), down
        heartbeat.beat(assigned=2, paused=0, force=True)
        _assert_public(_ready(sidecar.url, None), env, 503, ["broker_unreachable"])
        assert httpx.get(sidecar.url + "/healthz", timeout=5).status_code == 200

        broker = dedicated_broker(tmp_path / "broker.log", port=port).start()
        up = wait_for(lambda: beating_ready(200), 30, what="200 after the broker returned")
        assert up["broker"]["ok"] is True
        assert httpx.get(sidecar.url + "/healthz", timeout=5).status_code == 200
    finally:
        heartbeat.remove()
        sidecar.stop()
        broker.stop()
