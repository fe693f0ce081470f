"""SIGKILL a random one of two independent worker processes every few seconds while messages
flow, restarting it each time: nothing is lost, nothing ends in two places."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.chaos.ledger import make_plan
from tests.chaos.load import PacedProducer
from tests.chaos.report import ChaosReport
from tests.chaos.scale import MAX_RETRIES, Sizes, settle_budget
from tests.chaos.scenario import start
from tests.support import wait_for

SETTLE_S = settle_budget(600.0)
JOIN_S = 5.0


@pytest.mark.chaos
def test_sigkill_workers_again_and_again(
    bootstrap: str,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes
    plan = make_plan(size.kill_messages, chaos_rng, "kill-", MAX_RETRIES)
    sc = start("sigkill_workers", bootstrap, tmp_path, plan, partitions=4)
    kills: list[dict[str, object]] = []
    try:
        workers = [sc.fleet.worker("w0"), sc.fleet.worker("w1")]
        load = PacedProducer(bootstrap, sc.dep.main, sc.records())
        shares = size.kills + 1  # one while the group joins, one before each kill
        load.allow_share(1, shares, JOIN_S)
        wait_for(
            lambda: sc.observer.refresh().calls > 0, 120, what="the workers to handle messages"
        )
        for i in range(size.kills):
            pause = chaos_rng.uniform(*size.kill_every_s)
            load.allow_share(i + 2, shares, pause)
            time.sleep(pause)  # the fault schedule's pace
            victim = chaos_rng.randrange(len(workers))
            proc = workers[victim]
            assert proc.alive(), f"{proc.name} exited on its own: {proc.output()[-2000:]}"
            at = time.monotonic()
            code = sc.fleet.kill(proc)
            kills.append(sc.fault_entry(load, at, pid=proc.pid, status=code))
            workers[victim] = sc.fleet.worker(proc.name)
        load.finish()
        load.join(300)
        rec, behind = sc.observer.settle(SETTLE_S)
        survivors = [(w.name, w.alive()) for w in workers]
        codes = [sc.fleet.terminate(w) for w in workers]
        rec = sc.observer.final()  # anything redone before the clean stop is counted
    finally:
        sc.close()
    chaos_report.add(
        sc.row(
            rec,
            behind,
            len(kills),
            fault=f"SIGKILL a random one of 2 worker processes every "
            f"{size.kill_every_s[0]:g}-{size.kill_every_s[1]:g}s, restarted at once",
            kills=len(kills),
            restarts=len(kills),
            at_kills=kills,
        )
    )
    sc.assert_settled(rec, behind)
    assert len(kills) == size.kills and all(k["status"] == -9 for k in kills), kills
    # The faults hit a system under load: messages were on their way at every kill.
    assert all(k["in_flight"] > 0 for k in kills), kills
    assert all(alive for _, alive in survivors), f"a worker exited on its own: {survivors}"
    assert codes == [0, 0], f"SIGTERM at the end: exit statuses {codes}"
    print(f"\n{rec.describe()} kills={len(kills)}")
