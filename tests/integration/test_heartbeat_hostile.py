"""Hostile heartbeat files beside a live worker's, through a real ``retryd sidecar`` process and
a real ``retryd worker`` process sharing a state dir, on a real broker: ``/readyz``,
``/metrics`` and ``GET /v1/circuit`` answer normally and count the live worker (and nothing
else), ``retryd health --worker`` passes, neither process logs a traceback, the sidecar logs
each bad file once (never its content); once the worker stops, nothing keeps the sidecar
ready (a heartbeat with ``ts`` 1e999 used to be alive forever).

Each kind of bad file on its own: tests/unit/test_heartbeat_files.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from retryd.runtime.paths import heartbeat_dir
from tests.integration.sidecar_support import REPO, TOKEN, Env, SidecarProcess
from tests.integration.worker_support import stop_process
from tests.support import create_topics, wait_for

FORGED = "ERROR forged"  # in hostile files: must never reach a log


def _beat(pid: int, ts: str = "1e999", **extra: str) -> bytes:
    fields = {
        "pid": str(pid),
        "role": '"all"',
        "group_id": '"g"',
        "ts": ts,
        "assigned_partitions": "1",
        "paused_partitions": "0",
        "state": '"running"',
        **extra,
    }
    return ("{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}").encode()


HOSTILE_FILES: dict[str, bytes] = {
    "4000001.json": _beat(4000001),  # ts 1e999: inf, "alive forever" before
    "4000002.json": b"[" * 200_000 + b"]" * 200_000,  # RecursionError before
    "4000003.json": b'{"pid":' * 50_000 + b"1" + b"}" * 50_000,
    "4000004.json": _beat(4000004, "1") + b" " * (1 << 20),  # a MiB
    "4000005.json": b"[" + b"7," * 200_000 + b"7]",  # within the bound, parsed once
    "4000006.json": bytes(range(256)) * 64,  # binary
    "4000007.json": _beat(4000007, "[]", role="7", state="{}", drained='"yes"'),  # types
    "4000008.json": _beat(4000008, "1", group_id=f'"\\ud800 {FORGED}"'),  # lone surrogate
    "4000009.json": _beat(4000099, "1"),  # another process's pid
    f"x\n{FORGED}.json": _beat(4000010, "1"),  # a name forging a log line
}


def _make_hostile(directory: Path, tmp: Path) -> int:
    """Every hostile file, FIFO, directory and symlink loop in ``directory``; how many."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in HOSTILE_FILES.items():
        (directory / name).write_bytes(data)
    os.mkfifo(directory / "4000020.json")  # a plain open() waits for a writer for good
    (directory / "4000021.json").mkdir()
    (directory / "4000022.json").symlink_to(directory / "4000022.json")  # a loop
    (tmp / "elsewhere.json").write_bytes(_beat(4000023, "1"))
    (directory / "4000023.json").symlink_to(tmp / "elsewhere.json")  # not followed
    return len(HOSTILE_FILES) + 4


def _alive_gauge(text: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == "retryd_workers_alive":
            return sum(s.value for s in family.samples)
    raise AssertionError("no retryd_workers_alive in /metrics")


def test_hostile_heartbeats_beside_a_live_worker(bootstrap: str, tmp_path: Path) -> None:
    env = Env(
        bootstrap,
        tmp_path / "state",
        extra={
            "RETRYD_HANDLER": "python:tests.integration.handlers:behave",
            "RETRYD_HEARTBEAT_STALE_S": "10",
            "RETRYD_TEST_LOG": str(tmp_path / "calls.jsonl"),
        },
    )
    env.create(failed_partitions=1, main_partitions=1)
    create_topics(bootstrap, [f"{env.group}.retry_1s", f"{env.group}.retry_2s"], 1)
    # already there when the worker (its start-up prune) and the sidecar start
    bad_files = _make_hostile(heartbeat_dir(env.state_dir), tmp_path)
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    worker: subprocess.Popen[bytes] | None = None
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
        pid = worker.pid
        with sidecar.client(TOKEN) as api:

            def ready() -> Any:
                assert worker is not None and worker.poll() is None, "the worker exited"
                r = api.get("/readyz")
                assert r.status_code in (200, 503), r.text
                return r.json() if r.status_code == 200 else None

            body = wait_for(ready, 60, 0.2, "ready with the live worker")
            for _ in range(3):  # the probes, scrapes and views that follow one another
                r = api.get("/readyz")
                assert r.status_code == 200, r.text
                assert [w["pid"] for w in r.json()["workers"]] == [pid], r.json()
                public = httpx.get(sidecar.url + "/readyz", timeout=10)
                assert public.json() == {"status": "ready", "reasons": []}
                metrics = httpx.get(sidecar.url + "/metrics", timeout=10)
                assert metrics.status_code == 200 and _alive_gauge(metrics.text) == 1
                circuit = wait_for(
                    lambda: (
                        (c := api.get("/v1/circuit")).status_code == 200
                        and [p["pid"] for p in c.json()["processes"]] == [pid]
                        and c.json()
                    ),
                    30,
                    0.2,
                    "the live worker's circuit",
                )
                assert circuit["group"] == env.group
            assert body["reasons"] == []
            health = subprocess.run(
                [sys.executable, "-m", "retryd", "health", "--worker"],
                env=env.env(sidecar.port),
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert health.returncode == 0, health.stdout + health.stderr
            assert "1 worker process" in health.stdout

            stop_process(worker)  # removes its heartbeat: the hostile files keep nobody alive
            down = wait_for(
                lambda: (r := api.get("/readyz")).status_code == 503 and r.json(),
                30,
                0.2,
                "not ready without the worker",
            )
            assert down["reasons"] == ["no_live_worker"] and down["workers"] == [], down
            metrics = httpx.get(sidecar.url + "/metrics", timeout=10)
            assert metrics.status_code == 200 and _alive_gauge(metrics.text) == 0
            assert api.get("/v1/circuit").json()["processes"] == []
            assert sidecar.proc is not None and sidecar.proc.poll() is None
    finally:
        if worker is not None:
            stop_process(worker)
        sidecar.stop()
    for name in ("sidecar.log", "worker.log"):  # (the worker reads them once: its prune)
        text = (tmp_path / name).read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]
        # the bad name is logged quoted, its line break escaped: no forged line
        assert FORGED not in text.replace(repr(f"x\n{FORGED}.json")[1:-1], ""), name
        skipped = [line for line in text.splitlines() if "heartbeat file" in line]
        assert len(skipped) == bad_files, skipped  # once per file, not per request
