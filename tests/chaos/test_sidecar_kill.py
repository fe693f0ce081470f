"""SIGKILL the sidecar in the middle of a bulk replay job, start it again and run the same job
again: the rest is replayed, and no failed record is replayed twice (the replay ledger, a
compacted topic that survives the process, is what remembers what the first run did)."""

from __future__ import annotations

import secrets
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.report import ChaosReport
from tests.chaos.scale import Sizes, scale
from tests.integration.sidecar_support import Env, SidecarProcess, failed_headers, seed, wait_job
from tests.support import read_topic, wait_for

KILL_AT = 0.4  # share of the job replayed when the sidecar is killed


@pytest.mark.chaos
def test_sigkill_sidecar_during_bulk_replay_then_rerun(
    bootstrap: str, tmp_path: Path, chaos_sizes: Sizes, chaos_report: ChaosReport
) -> None:
    n = chaos_sizes.replay_records
    rate = chaos_sizes.replay_rate
    token = secrets.token_urlsafe(48)  # a long random token: valid as a replay-scope token
    env = Env(bootstrap, tmp_path / "state", token=token).create()
    records = [
        (
            f"k{i}".encode(),
            f"v{i}".encode(),
            failed_headers(env.main, original_partition=i % 2, original_offset=i),
        )
        for i in range(n)
    ]
    acks = seed(bootstrap, env.failed, records)
    expected = {f"{env.failed}/{p}/{o}" for p, o in acks}
    job_spec = {"filter": {"original_topic": env.main}, "max_per_second": rate}
    began = time.monotonic()

    first = SidecarProcess(env, tmp_path / "sidecar-1.log").start()
    try:
        with first.client(token) as client:
            r = client.post("/v1/replays", json=job_spec)
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            progress: dict[str, Any] = wait_for(
                lambda: (
                    (b := client.get(f"/v1/replays/{job_id}").json())["replayed"] >= n * KILL_AT
                    and b
                ),
                120,
                0.02,
                what=f"{KILL_AT:.0%} of the job replayed",
            )
        assert first.proc is not None
        first.proc.send_signal(signal.SIGKILL)  # by PID, mid-job
        assert first.proc.wait(30) == -signal.SIGKILL
    finally:
        first.stop()
    before_kill = len(read_topic(bootstrap, env.main))
    assert progress["state"] == "running" and before_kill < n, (progress, before_kill)

    second = SidecarProcess(env, tmp_path / "sidecar-2.log").start()
    try:
        with second.client(token) as client:
            r = client.post("/v1/replays", json=job_spec)
            assert r.status_code == 202, r.text
            rerun = wait_job(client, r.json()["id"], timeout=600)
    finally:
        second.stop()

    # copies the killed job left without a ledger entry, recorded by the rerun before deciding
    recovered = (tmp_path / "sidecar-2.log").read_text(errors="replace").count("entry recovered")
    copies = read_topic(bootstrap, env.main)
    sources = Counter((c.header("retryd_replayed_from") or b"").decode() for c in copies)
    missing = expected - set(sources)
    twice = {coord: k for coord, k in sources.items() if k > 1}
    strays = set(sources) - expected
    chaos_report.add(
        {
            "scenario": "sidecar_kill_during_replay",
            "scale": scale(),
            "messages": n,
            "faults": 1,
            "fault": f"SIGKILL the sidecar at {KILL_AT:.0%} of a bulk replay job "
            f"(max_per_second={rate:g}), start it again, rerun the same job",
            "lost": len(missing),
            "two_places": 0,
            "misplaced": len(strays),
            "duplicates": {"replayed_twice": sum(k - 1 for k in twice.values())},
            "seconds": round(time.monotonic() - began, 1),
            "copies_before_kill": before_kill,
            "ledger_entries_recovered": recovered,
            "rerun": {k: rerun[k] for k in ("state", "replayed", "skipped", "failed")},
            "rerun_skipped_reasons": rerun["skipped_reasons"],
        }
    )
    assert rerun["state"] == "completed", rerun
    assert not missing, f"{len(missing)} failed records never replayed: {sorted(missing)[:5]}"
    assert not strays, f"copies of records outside the set: {sorted(strays)[:5]}"
    assert not twice, f"{len(twice)} records replayed twice: {sorted(twice)[:5]}"
    assert rerun["replayed"] + rerun["skipped_reasons"].get("already_replayed", 0) == n, rerun
    print(f"\nsidecar killed after {before_kill}/{n} copies; rerun {rerun['replayed']} replayed")
