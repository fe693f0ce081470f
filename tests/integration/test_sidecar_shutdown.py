"""Issue 9, item 6: shutdown never leaves a replayed copy without its ledger entry.

A bulk job is replaying when the broker stops answering (its process is stopped with SIGSTOP:
produce requests already sent stay in its socket, unanswered) and the sidecar gets SIGTERM.
The code as found cancelled jobs for 10 s, closed the ledger and exited; the broker, resumed,
then wrote the copies it had received, and no ledger entry named them: the next run replays
them again. Now shutdown waits for every copy's delivery report and ledger write (bounded by
the producers' delivery timeout) before it closes anything, so after the broker resumes every
copy in the target topic has its ledger entry.

Uses its own broker of the suite's kind (``tests.support.dedicated_broker``: Apache Kafka by
default), stopped and resumed, also when the suite runs against an external cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

from tests.integration.sidecar_support import Env, SidecarProcess, failed_headers, seed
from tests.support import dedicated_broker, read_topic, wait_for

RECORDS = 4000
STALL_S = 14  # longer than the 10 s the code as found waited for its jobs


def test_shutdown_waits_for_copies_and_their_ledger_entries(tmp_path: Path) -> None:
    broker = dedicated_broker(tmp_path / "broker.log").start()
    stopped = False
    sidecar: SidecarProcess | None = None
    try:
        env = Env(broker.bootstrap, tmp_path / "state").create(failed_partitions=1)
        # Copies may wait up to 60 s for their report: the stall below stays well inside it.
        env.extra = {"RETRYD_KAFKA": json.dumps({"message.timeout.ms": "60000"})}
        seed(broker.bootstrap, env.failed, [(b"k", b"v", failed_headers(env.main))] * RECORDS)
        sidecar = SidecarProcess(env, tmp_path / "sidecar.log").start()
        with sidecar.client() as client:
            job_id = client.post("/v1/replays", json={"max_per_second": 2000}).json()["id"]
            wait_for(
                lambda: client.get(f"/v1/replays/{job_id}").json()["replayed"] >= 300,
                30,
                what="the job to be replaying",
            )
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGSTOP)
        stopped = True
        proc = sidecar.proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STALL_S)  # the broker stays stopped this long, or until the exit
        exited_during_stall = proc.poll() is not None
        os.kill(broker.pid, signal.SIGCONT)
        stopped = False
        proc.wait(150)
        copies = read_topic(broker.bootstrap, env.main, timeout=30)
        ledger = {
            (r.key or b"").decode(): json.loads(r.value or b"{}")
            for r in read_topic(broker.bootstrap, env.ledger, timeout=30)
        }
    finally:
        if stopped and broker.pid is not None:
            os.kill(broker.pid, signal.SIGCONT)
        if sidecar is not None:
            sidecar.stop()
        broker.stop()
    log = (tmp_path / "sidecar.log").read_text()
    print(
        f"{len(copies)} copies, {len(ledger)} ledger entries; exited during stall: "
        f"{exited_during_stall}"
    )
    assert not exited_during_stall, "shutdown gave up on copies still in flight"
    assert copies, "nothing was replayed"
    missing = [
        c.header("retryd_replayed_from")
        for c in copies
        if (c.header("retryd_replayed_from") or b"").decode() not in ledger
    ]
    assert not missing, f"{len(missing)} copies without a ledger entry, e.g. {missing[:3]}"
    for copy in copies:
        entry = ledger[(copy.header("retryd_replayed_from") or b"").decode()]
        assert entry["replay_id"] == job_id and entry["target_offset"] == copy.offset
    assert "Traceback" not in log, log[-3000:]
