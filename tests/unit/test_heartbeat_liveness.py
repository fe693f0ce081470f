"""Worker liveness from heartbeat files alone (no PID lookups), and their pruning."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from retryd.runtime.heartbeat import (
    ALIVE,
    STALE,
    STOPPING,
    Heartbeat,
    HeartbeatWriter,
    liveness,
    prune_stale,
    read_heartbeats,
)
from retryd.runtime.paths import heartbeat_dir


def _beat(state: str = "running", age: float = 0.0, pid: int = 4242) -> Heartbeat:
    return Heartbeat(pid, "all", "g", time.time() - age, 1, 0, state)


def test_liveness_is_freshness_and_state() -> None:
    now = time.time()
    assert liveness(_beat(), now, 15) == ALIVE
    assert liveness(_beat("starting"), now, 15) == ALIVE
    assert liveness(_beat("stopping"), now, 15) == STOPPING
    assert liveness(_beat(age=16), now, 15) == STALE
    assert liveness(_beat("stopping", age=16), now, 15) == STALE


def _write(state_dir: Path, hb: Heartbeat) -> None:
    path = heartbeat_dir(state_dir)
    path.mkdir(parents=True, exist_ok=True)
    from dataclasses import asdict

    (path / f"{hb.pid}.json").write_text(json.dumps(asdict(hb)))


def test_prune_removes_only_stale_files(tmp_path: Path) -> None:
    _write(tmp_path, _beat(pid=1, age=100))  # a killed container's worker (same PID reused)
    _write(tmp_path, _beat(pid=2, age=1))
    mine = HeartbeatWriter(tmp_path, "all", "g")
    mine.beat(0, 0, force=True)
    assert prune_stale(tmp_path, 15) == 1
    assert sorted(hb.pid for hb in read_heartbeats(tmp_path)) == sorted([2, mine_pid(mine)])


def mine_pid(writer: HeartbeatWriter) -> int:
    return int(writer.path.stem)


def test_a_heartbeat_that_cannot_be_written_degrades_instead_of_raising(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk or a read-only volume used to end the worker (exit 1) at its next beat.
    Here the state directory is a file (root ignores permission bits): every write fails."""
    from retryd.runtime.heartbeat import HeartbeatWriter

    state = tmp_path / "state"
    state.write_text("not a directory")
    writer = HeartbeatWriter(state, "main", "g")  # cannot even create its directory
    for _ in range(3):
        writer.beat(1, 0, force=True)
    assert writer.failing is not None and writer.write_failures == 4
    errors = [r for r in caplog.records if "cannot write the heartbeat" in r.getMessage()]
    assert len(errors) == 1, "logged once when it starts failing, not at every beat"
    writer.remove()  # never raises either

    ok = tmp_path / "ok"
    writer = HeartbeatWriter(ok, "main", "g")
    writer.path.parent.rmdir()  # the volume goes away...
    writer.beat(1, 0, force=True)
    assert writer.failing is not None
    writer.path.parent.mkdir(parents=True)  # ...and comes back
    writer.beat(1, 0, force=True)
    assert writer.failing is None and writer.path.exists()
