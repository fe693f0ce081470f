"""``/v1/circuit`` and the ``circuit`` scope, on the real app (FastAPI's TestClient, no
broker needed: these routes only read and write the state dir), with a real state dir.

Worker processes are represented by real heartbeat files (the ``Heartbeat`` format the
workers write) carrying real ``CircuitSnapshot``s of ``Breaker``s; orders are read back with
the workers' own ``CommandReader``. The same routes against a real ``retryd sidecar`` process
and a real worker: tests/integration/test_circuit_operator.py."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from retryd.api.app import create_app
from retryd.api.auth import required_scope
from retryd.api.credentials import load_credentials
from retryd.api.readiness import ReadinessReport, circuit_summary, worker_states
from retryd.api.routes_health import _render_readiness
from retryd.api.schemas import Readiness
from retryd.config import Settings, load_settings
from retryd.errors import ConfigError
from retryd.policy.circuit import (
    Breaker,
    BreakerPolicy,
    CircuitAction,
    CircuitSnapshot,
)
from retryd.runtime import circuit_control
from retryd.runtime.circuit_control import CommandReader, command_path, read_command
from retryd.runtime.heartbeat import Heartbeat, heartbeat_path
from retryd.runtime.paths import heartbeat_dir

CIRCUIT_TOKEN = "c" * 40
READ_TOKEN = "r" * 40
REPLAY_TOKEN = "p" * 40
GROUP = "orders-workers"
MAX_BODY = 4096


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RETRYD_"):
            monkeypatch.delenv(name)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(
        bootstrap_servers="127.0.0.1:1",  # never contacted by these routes
        main_topics="orders",
        group_id=GROUP,
        state_dir=tmp_path / "state",
        heartbeat_stale_s=30,
        sidecar_max_body_bytes=MAX_BODY,
        api_tokens=f"ops:circuit:{CIRCUIT_TOKEN},grafana:read:{READ_TOKEN},"
        f"ci:replay:{REPLAY_TOKEN}",
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    # Not entered as a context manager: the lifespan (lag monitor, Kafka) does not start.
    yield TestClient(create_app(settings))


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def snapshot(*actions: str, error: str | None = None) -> CircuitSnapshot:
    """A real breaker's snapshot after ``actions`` (``open``, ``probe``, ``fail``, ``hold``)."""
    now = 1_000_000
    breaker = Breaker(BreakerPolicy(probe_initial_s=1, probe_max_s=4), now, draw=lambda: 0.5)
    for action in actions:
        now += 2000
        if action == "open":
            breaker.force(CircuitAction.OPEN, now, "ops")
        elif action == "probe":
            assert breaker.probe_due(now)
        elif action == "fail":
            breaker.probe_failed(now, error or "ConnectionError at orders/0/7")
        elif action == "hold":
            breaker.count_held(3)
    return breaker.snapshot()


def beat(
    settings: Settings,
    pid: int,
    snap: CircuitSnapshot | None,
    *,
    age_s: float = 0.0,
    group: str = GROUP,
    state: str = "running",
) -> None:
    """A worker process's heartbeat file, as ``HeartbeatWriter`` writes it."""
    hb = Heartbeat(
        pid,
        "all",
        group,
        time.time() - age_s,
        2,
        0,
        state,
        circuit=snap.as_dict() if snap is not None else {},
    )
    path = heartbeat_path(settings.state_dir, pid)
    heartbeat_dir(settings.state_dir).mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(hb)), encoding="utf-8")


# --- scopes -------------------------------------------------------------------------------------


def test_circuit_scope_includes_read_but_not_replay_and_replay_not_circuit(
    settings: Settings,
) -> None:
    by_id = {t.id: t for t in load_credentials(settings).tokens}
    assert by_id["ops"].scope == "circuit"
    assert by_id["ops"].allows("read") and by_id["ops"].allows("circuit")
    assert not by_id["ops"].allows("replay")
    assert by_id["ci"].allows("replay") and not by_id["ci"].allows("circuit")
    assert by_id["grafana"].allows("read")
    assert not by_id["grafana"].allows("circuit") and not by_id["grafana"].allows("replay")
    assert required_scope("POST", "/v1/circuit") == "circuit"
    assert required_scope("POST", "/v1/circuit/") == "circuit"
    assert required_scope("GET", "/v1/circuit") == "read"
    assert required_scope("POST", "/v1/replays") == "replay"
    assert required_scope("DELETE", "/v1/circuit") == "circuit"  # 405 after auth, not replay


def test_unknown_scope_is_refused_naming_the_three() -> None:
    with pytest.raises(ConfigError) as info:
        load_credentials(load_settings(api_tokens=f"x:admin:{CIRCUIT_TOKEN}"))
    assert info.value.problems == ["api_tokens[0] (x): the scope must be read, replay or circuit"]
    assert CIRCUIT_TOKEN not in str(info.value)


def test_route_scopes(client: TestClient) -> None:
    order = {"action": "open"}
    for token in (READ_TOKEN, REPLAY_TOKEN):
        r = client.post("/v1/circuit", json=order, headers=auth(token))
        assert r.status_code == 403, r.text
        assert r.json()["error"] == "forbidden"
        assert "needs scope circuit" in r.json()["detail"]
        assert 'error="insufficient_scope"' in r.headers["www-authenticate"]
    for token in (READ_TOKEN, REPLAY_TOKEN, CIRCUIT_TOKEN):
        assert client.get("/v1/circuit", headers=auth(token)).status_code == 200
    # a circuit token cannot replay or start jobs
    r = client.post("/v1/replays", json={}, headers=auth(CIRCUIT_TOKEN))
    assert r.status_code == 403 and "needs scope replay" in r.json()["detail"]
    assert client.get("/v1/circuit").status_code == 401
    assert client.post("/v1/circuit", json=order, headers=auth("x" * 40)).status_code == 401
    assert read_command(command_path(client.app.state.sidecar.settings.state_dir, GROUP)) is None


# --- POST /v1/circuit ---------------------------------------------------------------------------


def test_order_is_written_once_per_post_audited_and_read_by_workers(
    client: TestClient, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    reader = CommandReader(settings.state_dir, GROUP)  # a worker started before the orders
    assert reader.poll() is None
    caplog.set_level(logging.INFO)
    before = int(time.time() * 1000)
    r = client.post("/v1/circuit", json={"action": "open"}, headers=auth(CIRCUIT_TOKEN))
    assert r.status_code == 202, r.text
    order = r.json()
    assert set(order) == {"seq", "action", "by", "at_ms"}
    assert order["seq"] == 1 and order["action"] == "open" and order["by"] == "ops"
    assert before <= order["at_ms"] <= int(time.time() * 1000)
    seen = reader.poll()
    assert seen is not None and (seen.seq, seen.action, seen.by) == (1, CircuitAction.OPEN, "ops")
    assert reader.poll() is None  # once
    r = client.post("/v1/circuit/", json={"action": "probe"}, headers=auth(CIRCUIT_TOKEN))
    assert r.status_code == 202 and r.json()["seq"] == 2
    r = client.post("/v1/circuit", json={"action": "close"}, headers=auth(CIRCUIT_TOKEN))
    assert r.status_code == 202 and r.json()["seq"] == 3
    latest = reader.poll()  # a worker that beat once since then sees the newest order
    assert latest is not None and (latest.seq, latest.action) == (3, CircuitAction.CLOSE)
    body = client.get("/v1/circuit", headers=auth(READ_TOKEN)).json()
    assert body["last_order"] == r.json()
    audit = [rec.getMessage() for rec in caplog.records if rec.name == "retryd.audit"]
    assert audit == [
        f"circuit_order actor=ops group={GROUP} action=open seq=1",
        f"circuit_order actor=ops group={GROUP} action=probe seq=2",
        f"circuit_order actor=ops group={GROUP} action=close seq=3",
    ]
    logged = caplog.text + json.dumps(body)
    for secret in (CIRCUIT_TOKEN, READ_TOKEN, REPLAY_TOKEN):
        assert secret not in logged


@pytest.mark.parametrize(
    ("kwargs", "status", "words"),
    [
        ({"json": {"action": "explode"}}, 422, "action: input should be 'open', 'close' or"),
        ({"json": {"action": "OPEN"}}, 422, "action"),
        ({"json": {}}, 422, "action: field required"),
        ({"json": {"action": "open", "force": True}}, 422, "force"),
        ({"json": ["open"]}, 422, "json object"),
        ({}, 422, "body: field required"),
        ({"content": b"action=open"}, 422, "content-type: application/json"),
        (
            {"content": b'{"action": "open"}', "headers": {"content-type": "text/plain"}},
            422,
            "content-type: application/json",
        ),
        (
            {"content": b"{open", "headers": {"content-type": "application/json"}},
            422,
            "invalid json",
        ),
        (
            {"content": b'{"action": "\xff"}', "headers": {"content-type": "application/json"}},
            422,
            "not valid json",
        ),
        (
            {
                "content": b'{"action": "open"}' + b" " * MAX_BODY,
                "headers": {"content-type": "application/json"},
            },
            413,
            f"larger than {MAX_BODY} bytes",
        ),
    ],
)
def test_hostile_orders_get_readable_4xx_and_write_nothing(
    client: TestClient, settings: Settings, kwargs: dict[str, object], status: int, words: str
) -> None:
    headers = {**auth(CIRCUIT_TOKEN), **dict(kwargs.pop("headers", {}))}  # type: ignore[call-overload]
    r = client.post("/v1/circuit", headers=headers, **kwargs)  # type: ignore[arg-type]
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "detail", "problems"}
    assert words in (body["detail"] + " " + " ".join(body["problems"])).lower(), body
    assert read_command(command_path(settings.state_dir, GROUP)) is None


def test_other_methods_are_405_with_allow(client: TestClient) -> None:
    r = client.put("/v1/circuit", json={"action": "open"}, headers=auth(CIRCUIT_TOKEN))
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    assert r.json()["error"] == "method_not_allowed"


def test_unwritable_state_dir_is_503_and_says_so(client: TestClient, settings: Settings) -> None:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    (settings.state_dir / "circuit").write_text("not a directory")
    r = client.post("/v1/circuit", json={"action": "open"}, headers=auth(CIRCUIT_TOKEN))
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "state_dir_unwritable"
    assert "could not be written" in r.json()["detail"]


def test_an_order_file_locked_too_long_is_503_and_says_so(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer stuck while holding the lock (here: this test, holding a real flock) does not
    hang the sidecar's orders: after ``LOCK_WAIT_S`` the order is refused with the reason."""
    monkeypatch.setattr(circuit_control, "LOCK_WAIT_S", 0.3)
    lock = circuit_control.lock_path(command_path(settings.state_dir, GROUP))
    lock.parent.mkdir(parents=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = client.post("/v1/circuit", json={"action": "open"}, headers=auth(CIRCUIT_TOKEN))
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "state_dir_unwritable"
    assert "locked" in r.json()["detail"]
    r = client.post("/v1/circuit", json={"action": "open"}, headers=auth(CIRCUIT_TOKEN))
    assert r.status_code == 202 and r.json()["seq"] == 1  # released: the next one is written


# --- GET /v1/circuit ----------------------------------------------------------------------------


def test_view_of_the_live_processes_of_this_group(client: TestClient, settings: Settings) -> None:
    empty = client.get("/v1/circuit", headers=auth(READ_TOKEN)).json()
    assert empty == {
        "group": GROUP,
        "state": None,
        "last_error": None,
        "held": 0,
        "processes": [],
        "last_order": None,
    }
    beat(settings, 101, snapshot())  # closed
    beat(settings, 102, snapshot("open", "probe", "fail", "hold", error="Timeout at orders/1/9"))
    beat(settings, 103, snapshot("open", "probe"), state="stopping")  # half-open, finishing
    beat(settings, 104, None)  # before its first report
    beat(settings, 105, snapshot("open"), age_s=3600)  # stale: a dead process's leftover
    beat(settings, 106, snapshot("open"), group="another-group")  # another group's worker
    body = client.get("/v1/circuit", headers=auth(READ_TOKEN)).json()
    assert body["state"] == "open"
    assert body["last_error"] == "Timeout at orders/1/9"
    assert body["held"] == 3
    by_pid = {p["pid"]: p for p in body["processes"]}
    assert set(by_pid) == {101, 102, 103, 104}
    assert by_pid[101]["state"] == "closed" and by_pid[101]["liveness"] == "alive"
    opened = by_pid[102]
    assert opened["state"] == "open" and opened["reason"] == "the probe failed"
    assert opened["transitions"] == {"open": 2, "half_open": 1}
    assert opened["probes"] == 1 and opened["held"] == 3
    assert opened["next_probe_ms"] > opened["since_ms"]
    assert by_pid[103]["state"] == "half_open" and by_pid[103]["liveness"] == "stopping"
    assert by_pid[104]["state"] is None
    # only a half-open process left: the worst is half_open
    heartbeat_path(settings.state_dir, 102).unlink()
    body = client.get("/v1/circuit", headers=auth(CIRCUIT_TOKEN)).json()
    assert body["state"] == "half_open" and body["last_error"] is None


def test_garbled_circuit_in_a_heartbeat_is_shown_as_unknown(
    client: TestClient, settings: Settings
) -> None:
    beat(settings, 201, snapshot())
    path = heartbeat_path(settings.state_dir, 201)
    doc = json.loads(path.read_text())
    doc["circuit"] = {"state": "melted", "held": "many", "transitions": {"open": "x"}}
    path.write_text(json.dumps(doc))
    body = client.get("/v1/circuit", headers=auth(READ_TOKEN)).json()
    (proc,) = body["processes"]
    assert proc["state"] is None and proc["held"] == 0 and proc["transitions"] == {}
    assert body["state"] is None


HOSTILE_ORDER_FILES = {
    "seq 1e999": b'{"seq": 1e999, "action": "open", "by": "x", "at_ms": 1, "group": "%s"}'
    % GROUP.encode(),
    "deep nesting": b"[" * 2000 + b"]" * 2000,
    "a megabyte": b" " * (1 << 20),
    "by a lone surrogate": b'{"seq": 3, "action": "open", "by": "\\ud800", "at_ms": %d, '
    b'"group": "%s"}' % (int(time.time() * 1000), GROUP.encode()),
    "binary": bytes(range(256)),
}


@pytest.mark.parametrize("name", list(HOSTILE_ORDER_FILES))
def test_a_hostile_order_file_is_no_last_order_and_the_next_order_is_written(
    client: TestClient, settings: Settings, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = command_path(settings.state_dir, GROUP)
    path.parent.mkdir(parents=True)
    path.write_bytes(HOSTILE_ORDER_FILES[name])
    caplog.set_level(logging.WARNING, "retryd.runtime.circuit_control")
    for _ in range(3):
        r = client.get("/v1/circuit", headers=auth(READ_TOKEN))
        assert r.status_code == 200, r.text
        assert r.json()["last_order"] is None
    refused = [rec for rec in caplog.records if rec.name == "retryd.runtime.circuit_control"]
    assert len(refused) == 1  # logged once, not at every GET
    r = client.post("/v1/circuit", json={"action": "close"}, headers=auth(CIRCUIT_TOKEN))
    assert r.status_code == 202, r.text
    assert client.get("/v1/circuit", headers=auth(READ_TOKEN)).json()["last_order"] == r.json()


# --- /readyz details ----------------------------------------------------------------------------


def test_readiness_details_name_the_circuit_and_it_is_never_a_reason(settings: Settings) -> None:
    beat(settings, 301, snapshot())
    beat(settings, 302, snapshot("open", "probe", "fail", error="HTTP 503 at orders/0/1"))
    beat(settings, 303, snapshot("open"), age_s=3600)  # stale
    workers = worker_states(settings)
    by_pid = {w["pid"]: w for w in workers}
    assert by_pid[301]["circuit_state"] == "closed"
    assert by_pid[302]["circuit_state"] == "open"
    assert by_pid[302]["circuit_last_error"] == "HTTP 503 at orders/0/1"
    summary = circuit_summary(workers)
    assert summary == {"state": "open", "last_error": "HTTP 503 at orders/0/1"}
    report = ReadinessReport(workers=workers, circuit=summary)
    assert report.status == "ready"  # an open circuit is not a readiness reason
    detailed = json.loads(report.body(True, _render_readiness))
    assert detailed["circuit"] == summary
    assert {w["pid"]: w["circuit_state"] for w in detailed["workers"]} == {
        301: "closed",
        302: "open",
        303: "open",
    }
    public = json.loads(report.body(False, _render_readiness))
    assert public == {"status": "ready", "reasons": []}  # nothing about the circuit
    assert circuit_summary([]) == {"state": None, "last_error": None}
    # Nothing reported yet: the served body (nulls left out) still matches its own schema.
    unknown = ReadinessReport(workers=[], circuit=circuit_summary([]))
    served = json.loads(unknown.body(True, _render_readiness))
    assert served["circuit"] == {}
    Readiness.model_validate(served)
