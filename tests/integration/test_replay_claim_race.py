"""A bulk job and a single replay of the same record at once: replayed exactly once.

The job used to check the ledger and claim the record after: a single replay (the sidecar's
``POST /v1/failed/{partition}/{offset}/replay``, same ledger, same process) that claimed,
replayed and wrote its entry in between left the job holding a stale "not replayed" answer,
and the record was replayed twice. The window is widened here by a slow decision in the job
(a test-side wrapper; no sleep in product code)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from retryd.replay.errors import AlreadyReplayed
from retryd.replay.jobs import JobSpec, ReplayJob
from retryd.replay.ledger import ReplayLedger
from retryd.replay.records import RecordFilter
from retryd.replay.replayer import Replayer, TargetPolicy
from retryd.replay.scan import TopicScanner, to_record
from tests.integration.sidecar_support import Env, failed_headers, seed
from tests.support import read_topic


@pytest.mark.parametrize("iteration", range(3))
def test_a_job_and_a_single_replay_of_one_record_replay_it_once(
    bootstrap: str, tmp_path: Path, monkeypatch: Any, iteration: int
) -> None:
    env = Env(bootstrap, tmp_path / "state").create(failed_partitions=1, main_partitions=1)
    seed(bootstrap, env.failed, [(b"k", b"v", failed_headers(env.main))], partition=0)
    common = {"bootstrap.servers": bootstrap}
    ledger = ReplayLedger(common, env.ledger)
    ledger.ensure_topic()
    policy = TargetPolicy(common, [env.main])
    replayer = Replayer(common, ledger, policy, timeout_s=10)
    scanner = TopicScanner(common, env.failed)
    rec = to_record(scanner.read_one(0, 0))
    scanner.close()

    deciding = threading.Event()
    single_done = threading.Event()
    original = ReplayJob._decide

    calls: list[int] = []

    def slow_decide(self: ReplayJob, r: Any) -> Any:
        decided = original(self, r)  # the ledger says: not replayed yet
        calls.append(1)
        if len(calls) == 1:
            return decided  # the counting pass; the race is in the replay pass
        deciding.set()
        single_done.wait(3)  # the single replay runs now (or waits for the job's claim)
        return decided

    monkeypatch.setattr(ReplayJob, "_decide", slow_decide)
    outcomes: list[str] = []

    def single() -> None:
        deciding.wait(30)
        try:
            replayer.replay(rec, actor="test")
            outcomes.append("replayed")
        except AlreadyReplayed:
            outcomes.append("already_replayed")
        finally:
            single_done.set()

    t = threading.Thread(target=single, daemon=True)
    t.start()
    job = ReplayJob(
        JobSpec(filter=RecordFilter(original_topic=env.main), max_per_second=1000),
        common=common,
        failed_topic=env.failed,
        ledger=ledger,
        policy=policy,
    ).start()
    try:
        assert job.wait(60), "the job did not finish"
        t.join(30)
        snap = job.snapshot()
    finally:
        replayer.close()
        policy.close()
        ledger.close()
    copies = read_topic(bootstrap, env.main)
    sources = Counter((c.header("retryd_replayed_from") or b"").decode() for c in copies)
    assert sum(sources.values()) == 1, f"replayed {sum(sources.values())} times: {snap} {outcomes}"
    assert snap["replayed"] + outcomes.count("replayed") == 1, (snap, outcomes)
