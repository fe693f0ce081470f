"""SIGTERM during load, as a rolling restart does it: a random one of two worker processes is
stopped every few seconds and started again, each stop once the previous replacement owns its
partitions (see ``Fleet.group_settled`` for why). A clean stop finishes what it consumed,
commits and exits 0, so nothing is lost *and* nothing is redone."""

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
PARTITIONS = 4
STOP_S = 60.0  # shutdown_timeout_s (20 s) plus flush and commit, on a busy machine


@pytest.mark.chaos
def test_sigterm_workers_during_load(
    bootstrap: str,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes
    plan = make_plan(size.term_messages, chaos_rng, "term-", MAX_RETRIES)
    sc = start("sigterm_workers", bootstrap, tmp_path, plan, partitions=PARTITIONS)
    stops: list[dict[str, object]] = []
    try:
        workers = [sc.fleet.worker("w0"), sc.fleet.worker("w1")]
        load = PacedProducer(bootstrap, sc.dep.main, sc.records())
        shares = size.terms + 1  # one while the group joins, one before each stop
        load.allow_share(1, shares, JOIN_S)
        partitions = len(sc.topics) * PARTITIONS
        for i in range(size.terms):
            wait_for(
                lambda: sc.fleet.group_settled(workers, partitions),
                180,
                what="both workers to own partitions (the restarted one ready)",
            )
            pause = chaos_rng.uniform(*size.term_every_s)
            load.allow_share(i + 2, shares, pause)
            time.sleep(pause)  # the fault schedule's pace
            victim = chaos_rng.randrange(len(workers))
            proc = workers[victim]
            assert proc.alive(), f"{proc.name} exited on its own: {proc.output()[-2000:]}"
            at = time.monotonic()
            code = sc.fleet.terminate(proc, STOP_S)
            stops.append(
                sc.fault_entry(
                    load, at, pid=proc.pid, status=code, stop_s=round(time.monotonic() - at, 2)
                )
            )
            workers[victim] = sc.fleet.worker(proc.name)
        load.finish()
        load.join(300)
        rec, behind = sc.observer.settle(SETTLE_S)
        survivors = [(w.name, w.alive()) for w in workers]
        # The end of a rolling restart: the last replacement is ready before both are stopped
        # (a stop during a start also ends with 0 since issue 32, tested on its own in
        # tests/integration/test_start_signals.py; here the stops hit working workers).
        if all(alive for _, alive in survivors):  # else reported below
            wait_for(
                lambda: sc.fleet.group_settled(workers, partitions),
                180,
                what="both workers to own partitions before the final SIGTERM",
            )
        codes = [sc.fleet.terminate(w, STOP_S) for w in workers]
        rec = sc.observer.final()
    finally:
        sc.close()
    chaos_report.add(
        sc.row(
            rec,
            behind,
            len(stops),
            fault=f"SIGTERM a random one of 2 worker processes every "
            f"{size.term_every_s[0]:g}-{size.term_every_s[1]:g}s, restarted at once",
            sigterms=len(stops),
            restarts=len(stops),
            at_sigterms=stops,
        )
    )
    sc.assert_settled(rec, behind)
    assert [s["status"] for s in stops] == [0] * size.terms, stops
    assert all(s["in_flight"] > 0 for s in stops), stops
    assert all(alive for _, alive in survivors), f"a worker exited on its own: {survivors}"
    assert codes == [0, 0], f"SIGTERM at the end: exit statuses {codes}"
    # A clean stop commits exactly what it finished: nothing is handled or dead-lettered twice.
    assert rec.handled_twice == 0 and rec.dead_twice == 0, rec.describe()
    print(f"\n{rec.describe()} sigterms={len(stops)}")
