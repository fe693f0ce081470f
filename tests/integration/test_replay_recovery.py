"""A bulk replay job killed between a copy and its ledger entry: the next job must not replay
that record again (found by the chaos suite: SIGKILL of the sidecar mid-job, then a rerun,
replayed the one or two records whose copies were acknowledged but whose entries were not).

Here the interrupted job is staged exactly: its marker, copies of records 0-4 with entries for
0-2 only. The next job recovers the entries of 3 and 4 and replays 5-9, each once."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from retryd.policy.headers import replay_headers
from retryd.replay import recovery
from retryd.replay.jobs import JobSpec, ReplayJob
from retryd.replay.ledger import LedgerEntry, ReplayLedger
from retryd.replay.records import Coord, RecordFilter
from retryd.replay.replayer import TargetPolicy
from tests.integration.sidecar_support import Env, failed_headers, seed
from tests.support import produce, read_topic

N = 10
CRASHED = "job-crashed-0000000000"


def _stage(
    bootstrap: str, tmp_path: Path, beat_age_s: float
) -> tuple[Env, ReplayLedger, list[str]]:
    env = Env(bootstrap, tmp_path / "state").create(failed_partitions=1, main_partitions=1)
    records = [
        (f"k{i}".encode(), f"v{i}".encode(), failed_headers(env.main, original_offset=i))
        for i in range(N)
    ]
    acks = seed(bootstrap, env.failed, records, partition=0)
    coords = [str(Coord(env.failed, p, o)) for p, o in acks]
    common = {"bootstrap.servers": bootstrap}
    ledger = ReplayLedger(common, env.ledger)
    ledger.ensure_topic()
    marker = recovery.begin(ledger, common, CRASHED, {env.main}, timeout_s=10)
    if beat_age_s:
        marker.beat_ms -= int(beat_age_s * 1000)
        ledger.write_marker(CRASHED, marker.to_json(), wait=True)
    copies = [
        (key, value, replay_headers(headers, replay_id=CRASHED, replayed_from=coords[i]))
        for i, (key, value, headers) in enumerate(records[:5])
    ]
    placed = produce(bootstrap, env.main, copies)
    for i in range(3):  # the crash came before the entries of records 3 and 4
        ledger.record(coords[i], LedgerEntry(CRASHED, env.main, *placed[i]))
    return env, ledger, coords


def _rerun(env: Env, ledger: ReplayLedger) -> dict:
    common = {"bootstrap.servers": env.bootstrap}
    policy = TargetPolicy(common, [env.main])
    job = ReplayJob(
        JobSpec(filter=RecordFilter(original_topic=env.main), max_per_second=1000),
        common=common,
        failed_topic=env.failed,
        ledger=ledger,
        policy=policy,
    ).start()
    try:
        assert job.wait(60), "the job did not finish"
    finally:
        policy.close()
    return job.snapshot()


def test_a_rerun_after_an_interrupted_job_replays_nothing_twice(
    bootstrap: str, tmp_path: Path
) -> None:
    env, ledger, coords = _stage(bootstrap, tmp_path, beat_age_s=0)
    try:
        job = _rerun(env, ledger)
        assert job["state"] == "completed", job
        assert job["replayed"] == 5 and job["skipped_reasons"] == {"already_replayed": 5}, job
        copies = read_topic(bootstrap, env.main)
        sources = Counter((c.header("retryd_replayed_from") or b"").decode() for c in copies)
        assert sources == Counter(coords), "every record replayed exactly once"
        for coord in coords[3:5]:
            entry = ledger.get(coord)
            assert entry is not None and entry.replay_id == CRASHED, entry
            assert entry.by.startswith("recovered")
        # the interrupted job's heartbeat is fresh (it might still be running elsewhere): its
        # marker stays, advanced past what was read; the finished job's own marker is gone
        markers = ledger.markers()
        assert set(markers) == {CRASHED}
        advanced = recovery.JobMarker.from_json(markers[CRASHED])
        assert advanced is not None and advanced.starts[env.main][0] >= 5
    finally:
        ledger.close()


def test_a_stale_marker_is_recovered_then_deleted(bootstrap: str, tmp_path: Path) -> None:
    env, ledger, coords = _stage(bootstrap, tmp_path, beat_age_s=recovery.STALE_S + 5)
    try:
        t0 = time.monotonic()
        job = _rerun(env, ledger)
        assert job["state"] == "completed" and job["replayed"] == 5, job
        assert ledger.markers() == {}, "a marker whose job is gone is deleted once recovered"
        fresh = ReplayLedger({"bootstrap.servers": bootstrap}, env.ledger)
        try:
            fresh.refresh()
            assert fresh.markers() == {} and all(fresh.is_replayed(c) for c in coords)
        finally:
            fresh.close()
        print(f"\nrecovery and rerun took {time.monotonic() - t0:.1f}s")
    finally:
        ledger.close()
