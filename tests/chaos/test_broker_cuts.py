"""Cut every broker connection (workers, their producers, the test's own producer) for a while,
more than once, through a TCP proxy that the broker advertises as its address; then restore.
The workers run under the supervisor (``--processes 2``), which restarts a child that gives up
on an unreachable cluster (exit status 5). Every id still ends in exactly one terminal place."""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from retryd.kafka.embedded import free_port
from tests.chaos.fleet import Proc
from tests.chaos.ledger import make_plan
from tests.chaos.load import PacedProducer
from tests.chaos.proxy import TcpProxy
from tests.chaos.report import ChaosReport
from tests.chaos.scale import MAX_RETRIES, Sizes, settle_budget
from tests.chaos.scenario import start
from tests.support import dedicated_broker, wait_for

# a child restarted with backoff after a long cut may wait up to a minute
SETTLE_S = settle_budget(900.0)
JOIN_S = 5.0
PARTITIONS = 4


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[TcpProxy]:
    """A dedicated broker whose advertised address is a proxy in front of it: every client
    connection, after bootstrap too, goes through the proxy."""
    port = free_port()
    proxy = TcpProxy(port).start()
    broker = dedicated_broker(tmp_path / "broker.log", port=port, advertised=proxy.address)
    try:
        broker.start()
        yield proxy
    finally:
        broker.stop()
        proxy.stop()


def _children(supervisor: Proc) -> tuple[list[int], list[int], list[str]]:
    """(children started, children that exited, their exit statuses) from the supervisor's log."""
    out = supervisor.output()
    started = [int(p) for p in re.findall(r"started worker process pid=(\d+)", out)]
    exited = re.findall(
        r"worker process pid=(\d+) (?:failed at runtime \(status (-?\d+)\)|exited)", out
    )
    return started, [int(pid) for pid, _ in exited], [status for _, status in exited]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.chaos
def test_cut_every_broker_connection_then_restore(
    proxied: TcpProxy,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes
    bootstrap = proxied.address
    plan = make_plan(size.cut_messages, chaos_rng, "cut-", MAX_RETRIES)
    sc = start("broker_cuts", bootstrap, tmp_path, plan, partitions=PARTITIONS)
    cuts: list[dict[str, object]] = []
    try:
        supervisor = sc.fleet.worker("sup", "--processes", "2")
        load = PacedProducer(bootstrap, sc.dep.main, sc.records())
        shares = 2 * size.cuts + 1  # while joining; then before and during each cut
        load.allow_share(1, shares, JOIN_S)
        wait_for(
            lambda: sc.observer.refresh().calls > 0, 120, what="the workers to handle messages"
        )
        for i in range(size.cuts):
            load.allow_share(2 * i + 2, shares, size.cut_gap_s)
            time.sleep(size.cut_gap_s)  # connected time between cuts
            assert supervisor.alive(), supervisor.output()[-3000:]
            at = time.monotonic()
            closed = proxied.cut()
            load.allow_share(2 * i + 3, shares, size.cut_s)  # the producer keeps trying
            time.sleep(size.cut_s)  # the cut's length
            refused = proxied.stats.refused
            proxied.restore()
            cuts.append(
                {
                    "at_s": round(at - sc.began, 1),
                    "seconds": size.cut_s,
                    "connections_cut": closed,
                    "refused_during_cut": refused - sum(c["refused"] for c in cuts),  # type: ignore[misc]
                    "refused": refused,
                }
            )
        load.finish()
        load.join(600)
        rec, behind = sc.observer.settle(SETTLE_S)
        started, exited, statuses = _children(supervisor)
        running = [pid for pid in started if pid not in exited and _alive(pid)]
        supervisor_alive = supervisor.alive()
        code = sc.fleet.terminate(supervisor, 120)
        rec = sc.observer.final()
    finally:
        sc.close()
    chaos_report.add(
        sc.row(
            rec,
            behind,
            len(cuts),
            fault=f"cut every broker connection for {size.cut_s:g}s (new ones refused), "
            f"{size.cuts}x, {size.cut_gap_s:g}s apart; workers under --processes 2",
            cuts=len(cuts),
            cut_seconds=size.cut_s,
            connections_cut=sum(c["connections_cut"] for c in cuts),  # type: ignore[misc]
            connections_refused=proxied.stats.refused,
            worker_restarts=len(exited),
            worker_exit_statuses=statuses,
        )
    )
    sc.assert_settled(rec, behind)
    assert len(cuts) == size.cuts
    assert all(c["connections_cut"] and c["refused_during_cut"] for c in cuts), cuts
    assert supervisor_alive, "the supervisor exited"
    assert len(running) == 2, f"two worker processes running at the end: {started=} {exited=}"
    assert code == 0, f"SIGTERM at the end: supervisor exit status {code}"
    print(f"\n{rec.describe()} cuts={cuts} restarts={len(exited)} statuses={statuses}")
