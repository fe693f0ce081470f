"""An operator steers the outage circuit breaker of a real worker through a real sidecar.

A real broker, a real ``retryd worker`` process and a real ``retryd sidecar`` process sharing
a state dir, as in one pod:

- ``GET /v1/circuit`` shows the worker's circuit (closed) from its heartbeat;
- ``POST /v1/circuit {"action": "open"}`` with a ``circuit`` token (a ``replay`` token gets
  403) is applied by the worker: the API, ``/metrics`` (``retryd_circuit_state`` 2, one
  transition to open) and the ``/readyz`` details say open, and the pod stays ready;
- records produced while the circuit is open are not handled; ``probe`` lets one call
  through, its answer closes the circuit, and then every record is handled, none before the
  probe order;
- ``open`` then ``close`` by order; the counters add up; one audit line per order names the
  token's id, and no token reaches a log.

The same metric on a real Prometheus, with the alert firing: test_prometheus_live.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.sidecar_support import REPO, TOKEN, Env, SidecarProcess
from tests.integration.worker_support import stop_process
from tests.support import create_topics, json_lines, produce, wait_for

CIRCUIT_TOKEN = "ops-circuit-token-0123456789abcdef-xyz"
HANDLER = "python:tests.integration.handlers:behave"
N = 20


def circuit_series(url: str) -> dict[str, float]:
    """The retryd_circuit_* samples the sidecar serves, by name and labels."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("retryd_circuit"):
            for s in fam.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_operator_opens_probes_and_closes_a_real_workers_circuit(
    bootstrap: str, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.jsonl"
    env = Env(
        bootstrap,
        tmp_path / "state",
        extra={
            "RETRYD_API_TOKENS": f"ops:circuit:{CIRCUIT_TOKEN}",
            "RETRYD_HANDLER": HANDLER,
            "RETRYD_HEARTBEAT_STALE_S": "10",
            "RETRYD_TEST_LOG": str(calls),
        },
    )
    env.create(failed_partitions=1, main_partitions=1)
    create_topics(bootstrap, [f"{env.group}.retry_1s", f"{env.group}.retry_2s"], 1)
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    worker: subprocess.Popen[bytes] | None = None
    group = env.group
    try:
        sidecar.start()
        with open(tmp_path / "worker.log", "wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "retryd", "worker"],
                env=env.env(sidecar.port),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        with sidecar.client(CIRCUIT_TOKEN) as ops, sidecar.client(TOKEN) as replayer:

            def view(state: str, reason: str | None = None) -> Any:
                def check() -> Any:
                    assert worker is not None and worker.poll() is None, "the worker exited"
                    body = ops.get("/v1/circuit").json()
                    procs = body["processes"]
                    ok = body["state"] == state and len(procs) == 1
                    if ok and reason is not None:
                        ok = procs[0]["reason"] == reason
                    return body if ok else None

                return wait_for(check, 60, 0.2, f"the worker's circuit {state} ({reason})")

            closed = view("closed")
            assert closed["processes"][0]["pid"] == worker.pid
            assert closed["group"] == group and closed["last_order"] is None
            wait_for(lambda: ops.get("/readyz").status_code == 200, 60, 0.2, "the pod is ready")
            assert circuit_series(sidecar.url)[f"retryd_circuit_state{{group={group}}}"] == 0

            # A replay token cannot stop the group; a circuit token can.
            r = replayer.post("/v1/circuit", json={"action": "open"})
            assert r.status_code == 403 and "needs scope circuit" in r.json()["detail"]
            r = ops.post("/v1/circuit", json={"action": "open"})
            assert r.status_code == 202, r.text
            opened_order = r.json()
            assert opened_order["seq"] == 1 and opened_order["by"] == "ops"
            opened = view("open", "opened by ops")
            assert opened["last_order"] == opened_order
            assert opened["processes"][0]["transitions"] == {"open": 1}
            wait_for(
                lambda: circuit_series(sidecar.url)[f"retryd_circuit_state{{group={group}}}"] == 2,
                30,
                0.2,
                "retryd_circuit_state 2 on /metrics",
            )
            ready = ops.get("/readyz")
            assert ready.status_code == 200, ready.text  # an open circuit is not unready
            assert ready.json()["circuit"]["state"] == "open"
            assert [w["circuit_state"] for w in ready.json()["workers"]] == ["open"]

            # Records produced while open wait; a probe's answer closes the circuit.
            produce(
                bootstrap,
                env.main,
                [(f"k{i}".encode(), json.dumps({"id": i}).encode()) for i in range(N)],
            )
            r = ops.post("/v1/circuit", json={"action": "probe"})
            assert r.status_code == 202 and r.json()["seq"] == 2
            probe_ms = r.json()["at_ms"]
            probed = view("closed", "a call was answered")
            assert probed["processes"][0]["probes"] == 1
            handled = wait_for(
                lambda: len({c["id"] for c in json_lines(calls)}) == N and json_lines(calls),
                60,
                0.2,
                f"all {N} records handled once the circuit closed",
            )
            assert min(c["called_ms"] for c in handled) >= probe_ms, "a call ran while open"

            # Open and close by order.
            assert ops.post("/v1/circuit", json={"action": "open"}).json()["seq"] == 3
            view("open", "opened by ops")
            r = ops.post("/v1/circuit", json={"action": "close"})
            assert r.status_code == 202 and r.json()["seq"] == 4
            final = view("closed", "closed by ops")
            assert final["processes"][0]["transitions"] == {"open": 2, "half_open": 1, "closed": 2}
            assert final["last_order"]["action"] == "close"

            def counted() -> bool:
                s = circuit_series(sidecar.url)
                return s == {
                    f"retryd_circuit_state{{group={group}}}": 0,
                    f"retryd_circuit_transitions_total{{group={group},to=open}}": 2,
                    f"retryd_circuit_transitions_total{{group={group},to=half_open}}": 1,
                    f"retryd_circuit_transitions_total{{group={group},to=closed}}": 2,
                    f"retryd_circuit_held_total{{group={group}}}": 0,
                    f"retryd_circuit_probes_total{{group={group}}}": 1,
                }

            wait_for(counted, 30, 0.2, "the circuit counters on /metrics")
    finally:
        if worker is not None:
            stop_process(worker)
        sidecar.stop()
    log = (tmp_path / "sidecar.log").read_text()
    audit = [line for line in log.splitlines() if "circuit_order" in line]
    for seq, action in enumerate(["open", "probe", "open", "close"], 1):
        wanted = f"circuit_order actor=ops group={group} action={action} seq={seq}"
        assert sum(wanted in line for line in audit) == 1, (wanted, audit)
    assert len(audit) == 4, audit
    everything = log + (tmp_path / "worker.log").read_text()
    assert CIRCUIT_TOKEN not in everything and TOKEN not in everything
