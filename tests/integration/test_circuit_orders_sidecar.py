"""Circuit orders through a real ``retryd sidecar`` process (and a real worker process) sharing
a state dir, on a real broker:

- a hostile order file (``seq`` 1e999, deep nesting) stops neither process: the worker keeps
  beating with the same PID, ``GET /v1/circuit`` answers 200 with no last order, and the next
  ``POST`` is applied by the worker;
- 100 concurrent ``POST /v1/circuit`` while this test process writes orders into the same file
  get distinct ``seq``s, all of them, and each is audited once; none fails (the sidecar's
  bulkhead answers busy beyond two at a time, and those are sent again).

The file format's own edge cases: tests/unit/test_circuit_orders_file.py."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from retryd.policy.circuit import CircuitAction
from retryd.runtime.circuit_control import CommandReader, command_path, write_command
from retryd.runtime.heartbeat import read_heartbeats
from tests.integration.sidecar_support import REPO, Env, SidecarProcess
from tests.integration.worker_support import stop_process
from tests.support import create_topics, wait_for

CIRCUIT_TOKEN = "ops-circuit-token-0123456789abcdef-xyz"
HOSTILE = {
    "seq 1e999": b'{"seq": 1e999, "action": "open", "by": "x", "at_ms": 1, "group": "g"}',
    "deep nesting": b"[" * 2000 + b"]" * 2000,
}


def deployment(bootstrap: str, tmp_path: Path) -> Env:
    env = Env(
        bootstrap,
        tmp_path / "state",
        extra={
            "RETRYD_API_TOKENS": f"ops:circuit:{CIRCUIT_TOKEN}",
            "RETRYD_HANDLER": "python:tests.integration.handlers:behave",
            "RETRYD_HEARTBEAT_STALE_S": "10",
            "RETRYD_TEST_LOG": str(tmp_path / "calls.jsonl"),
        },
    )
    env.create(failed_partitions=1, main_partitions=1)
    create_topics(bootstrap, [f"{env.group}.retry_1s", f"{env.group}.retry_2s"], 1)
    return env


def two_beats_after(state_dir: Path, pid: int, after: float) -> None:
    """Wait for two heartbeats of ``pid`` after ``after``: the second one's poll of the order
    file began after ``after`` (the worker polls it just before each beat)."""

    def beat_after(t: float) -> float | None:
        beats = [b for b in read_heartbeats(state_dir) if b.pid == pid and b.ts > t]
        return beats[0].ts if beats else None

    first = wait_for(lambda: beat_after(after), 20, 0.1, "a heartbeat")
    wait_for(lambda: beat_after(first), 20, 0.1, "another heartbeat")


def test_hostile_order_files_stop_neither_the_worker_nor_the_sidecar(
    bootstrap: str, tmp_path: Path
) -> None:
    env = deployment(bootstrap, tmp_path)
    state_dir = env.state_dir
    path = command_path(state_dir, env.group)
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
        with sidecar.client(CIRCUIT_TOKEN) as ops:

            def view(state: str) -> Any:
                def check() -> Any:
                    assert worker is not None and worker.poll() is None, "the worker exited"
                    body = ops.get("/v1/circuit").json()
                    ok = body["state"] == state and [p["pid"] for p in body["processes"]] == [pid]
                    return body if ok else None

                return wait_for(check, 60, 0.2, f"the worker's circuit {state}")

            view("closed")
            path.parent.mkdir(parents=True, exist_ok=True)
            for name, data in HOSTILE.items():
                (path.parent / "hostile.tmp").write_bytes(data)
                (path.parent / "hostile.tmp").replace(path)
                two_beats_after(state_dir, pid, time.time())
                assert worker.poll() is None, f"the worker exited on {name}"
                r = ops.get("/v1/circuit")
                assert r.status_code == 200, r.text
                assert r.json()["last_order"] is None and r.json()["state"] == "closed"
            r = ops.post("/v1/circuit", json={"action": "open"})
            assert r.status_code == 202, r.text
            assert view("open")["last_order"] == r.json()
    finally:
        if worker is not None:
            stop_process(worker)
        sidecar.stop()
    worker_log = (tmp_path / "worker.log").read_text()
    assert "Traceback" not in worker_log
    refusals = [line for line in worker_log.splitlines() if "circuit order file" in line]
    assert len(refusals) == len(HOSTILE), refusals  # once per bad file, not per heartbeat


POSTS = 100
DIRECT = 30  # orders written meanwhile by this test process, as another writer


def test_concurrent_orders_get_distinct_seqs(bootstrap: str, tmp_path: Path) -> None:
    env = deployment(bootstrap, tmp_path)
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    reader = CommandReader(env.state_dir, env.group)  # a worker's view, polling all along
    applied: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            cmd = reader.poll()
            if cmd is not None:
                applied.append(cmd.seq)
            stop.wait(0.002)

    busy: list[int] = []

    def post(i: int) -> httpx.Response:
        """One operator's order; sent again while the sidecar's circuit bulkhead (two at a
        time, retryd.api.limits) answers busy, after a short pause as a client would."""
        order = {"action": ("open", "close", "probe")[i % 3]}
        deadline = time.monotonic() + 60
        with sidecar.client(CIRCUIT_TOKEN) as ops:
            while True:
                r = ops.post("/v1/circuit", json=order)
                if r.status_code != 503 or r.json()["error"] != "busy":
                    return r
                busy.append(i)
                assert time.monotonic() < deadline, "busy for a minute"
                stop.wait(random.uniform(0.005, 0.05))

    def direct(i: int) -> int:
        return write_command(env.state_dir, env.group, CircuitAction.PROBE, "direct").seq

    polling = threading.Thread(target=poll)
    try:
        sidecar.start()
        polling.start()
        with ThreadPoolExecutor(24) as pool:
            posted = pool.map(post, range(POSTS))
            written = pool.map(direct, range(DIRECT))
            answers = list(posted)
            direct_seqs = list(written)
        bad = [(r.status_code, r.text) for r in answers if r.status_code != 202]
        assert not bad
        post_seqs = [r.json()["seq"] for r in answers]
        assert sorted(post_seqs + direct_seqs) == list(range(1, POSTS + DIRECT + 1))
        with sidecar.client(CIRCUIT_TOKEN) as ops:
            last = ops.get("/v1/circuit").json()["last_order"]
        assert last["seq"] == POSTS + DIRECT
        wait_for(lambda: applied and applied[-1] == POSTS + DIRECT, 10, what="the last order")
    finally:
        stop.set()
        if polling.is_alive():
            polling.join(10)
        sidecar.stop()
    assert applied == sorted(set(applied))  # each order applied at most once, in seq order
    log = (tmp_path / "sidecar.log").read_text()
    audited = re.findall(r"circuit_order actor=ops group=\S+ action=\w+ seq=(\d+)", log)
    assert sorted(map(int, audited)) == sorted(post_seqs)  # each POST audited once
