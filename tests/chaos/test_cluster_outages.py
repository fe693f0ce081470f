"""Outages of a three-node Apache Kafka cluster (replication factor 3, min.insync.replicas 2,
acks=all) while messages flow, other than one crashed leader:

- a node frozen (SIGSTOP) for longer than the broker's session, then thawed (SIGCONT): it is
  fenced and its leaderships move; when it runs again it catches up and rejoins the ISR;
- a rolling restart: each node stopped cleanly, started again, and back in every in-sync
  replica set before the next one goes;
- two nodes down at once: every partition below min.insync.replicas, so no write succeeds.
  The workers must wait, not lose or dead-letter anything, and go on once a node returns.

At ``ci`` scale these skip unless ``RETRYD_CHAOS_CLUSTER=all`` (CI runs the leader SIGKILL of
``test_cluster_leaders``); ``RETRYD_CHAOS_SCALE=full`` runs them at full size.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.cluster import OFFSETS_TOPIC, Nodes
from tests.chaos.ledger import make_plan
from tests.chaos.replicated import Run, report_and_check, start_replicated
from tests.chaos.report import ChaosReport
from tests.chaos.scale import MAX_RETRIES, Sizes, every_cluster_scenario
from tests.support import wait_for

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.skipif(
        not every_cluster_scenario(),
        reason="ci scale runs one cluster scenario (RETRYD_CHAOS_CLUSTER=all runs these)",
    ),
]

# After both nodes are down: what was consumed before ends within this long (handler calls
# are instant, tier records come due within the 2 s of the longest retry delay); from then on
# nothing may end until a node returns.
QUIET_AFTER_S = 5.0
SAMPLE_S = 1.0


def test_sigstop_the_coordinator_past_the_session(
    cluster: Nodes,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes.cluster
    plan = make_plan(size.pause_messages, chaos_rng, "stop-", MAX_RETRIES)
    sc = start_replicated("cluster_node_sigstop", cluster, tmp_path, plan)
    group = sc.dep.settings.group_id
    topics = [*sc.topics, sc.dep.failed]
    pauses: list[dict[str, Any]] = []
    try:
        run = Run(sc, shares=1 + 2 * size.pauses)
        for _ in range(size.pauses):
            run.gap(chaos_rng.uniform(*size.gap_s))
            victim = cluster.coordinator(group)
            led = cluster.led_by(victim, topics)
            at = time.monotonic()
            entry = run.entry(at, node=victim, led=len(led), coordinator=True)
            entry["pid"] = cluster.pause(victim)
            run.feed(size.pause_s)
            entry["failover_s"] = cluster.wait_led_elsewhere(led, victim, at) if led else 0.0
            rest = size.pause_s - (time.monotonic() - at)
            if rest > 0:
                time.sleep(rest)  # the fault schedule: the node stays frozen this long
            run.assert_alive()
            cluster.resume(victim)
            entry["paused_s"] = round(time.monotonic() - at, 1)
            entry["in_sync_s"] = cluster.wait_in_sync(cluster.topics())
            pauses.append(entry)
        end = run.end()
    finally:
        sc.close()
    report_and_check(
        chaos_report,
        sc,
        end,
        cluster,
        fault=f"SIGSTOP the node coordinating the group for {size.pause_s:g}s (past the "
        f"broker session: fenced, leaderships moved), then SIGCONT; {size.pauses}x",
        faults=len(pauses),
        pauses=len(pauses),
        at_pauses=pauses,
    )
    assert len(pauses) == size.pauses
    assert all(p["in_flight"] > 0 for p in pauses), pauses


def test_rolling_restart_under_load(
    cluster: Nodes,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes.cluster
    plan = make_plan(size.rolling_messages, chaos_rng, "roll-", MAX_RETRIES)
    sc = start_replicated("cluster_rolling_restart", cluster, tmp_path, plan)
    topics = [*sc.topics, sc.dep.failed]
    restarts: list[dict[str, Any]] = []
    try:
        steps = size.rolling_rounds * len(cluster.ids)
        run = Run(sc, shares=1 + 2 * steps)
        for _ in range(size.rolling_rounds):
            for node_id in cluster.ids:
                run.gap(chaos_rng.uniform(*size.gap_s))
                led = cluster.led_by(node_id, topics)
                at = time.monotonic()
                entry = run.entry(at, node=node_id, led=len(led))
                run.feed(size.gap_s[0])
                entry["pid"] = cluster.stop(node_id)
                entry["stop_s"] = round(time.monotonic() - at, 1)
                entry["start_s"] = cluster.start(node_id)
                entry["in_sync_s"] = cluster.wait_in_sync(cluster.topics())
                restarts.append(entry)
        end = run.end()
    finally:
        sc.close()
    report_and_check(
        chaos_report,
        sc,
        end,
        cluster,
        fault=f"rolling restart: each node stopped (SIGTERM, controlled shutdown), started "
        f"and back in every ISR before the next; {size.rolling_rounds}x all 3 nodes",
        faults=len(restarts),
        restarts=len(restarts),
        at_restarts=restarts,
    )
    assert len(restarts) == 3 * size.rolling_rounds
    assert all(r["in_flight"] > 0 for r in restarts), restarts


def _sample_outage(run: Run, seconds: float) -> list[tuple[float, int, int]]:
    """(seconds into the outage, ids ended, dead letters read) every ``SAMPLE_S``."""
    began = time.monotonic()
    samples = []
    while True:
        ended, dead = run.ended(read_dead=True)
        at = time.monotonic() - began
        samples.append((round(at, 1), ended, dead))
        if at >= seconds:
            return samples
        time.sleep(min(SAMPLE_S, max(0.0, seconds - at)))  # the outage's length, sampled


def test_two_nodes_down_below_min_insync(
    cluster: Nodes,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes.cluster
    plan = make_plan(size.outage_messages, chaos_rng, "down-", MAX_RETRIES)
    sc = start_replicated("cluster_two_nodes_down", cluster, tmp_path, plan)
    topics = [*sc.topics, sc.dep.failed]
    outage: dict[str, Any] = {}
    try:
        run = Run(sc, shares=4)  # joining; before; during the outage; once a node is back
        run.gap(chaos_rng.uniform(*size.gap_s))
        crashed = cluster.busiest_leader(topics)
        stopped, survivor = [n for n in cluster.ids if n != crashed]
        at = time.monotonic()
        outage.update(run.entry(at, crashed=crashed, stopped=stopped, survivor=survivor))
        outage["crashed_pid"] = cluster.kill(crashed)
        run.feed(size.outage_s)
        # The first node is fenced and out of every ISR (writes go on with 2 replicas); the
        # second one's clean stop then takes every ISR down to the survivor alone. Killing
        # both at the same instant would take the controller quorum (2 of 3 voters) with
        # them: no ISR would shrink and writes would time out rather than be refused.
        cluster.wait_out_of_sync(crashed, [*topics, OFFSETS_TOPIC])
        outage["fenced_s"] = round(time.monotonic() - at, 1)
        outage["stopped_pid"] = cluster.stop(stopped)
        down = time.monotonic()
        outage["partitions_below_min_insync"] = cluster.under_min_insync(topics)
        outage["partitions"] = cluster.partitions(topics)
        samples = _sample_outage(run, size.outage_s)
        run.assert_alive()
        outage["both_down_s"] = round(time.monotonic() - down, 1)
        quiet = [s for s in samples if s[0] >= QUIET_AFTER_S]
        outage["samples"] = samples
        outage["ended_while_quiet"] = quiet[-1][1] - quiet[0][1]
        outage["dead_while_down"] = samples[-1][2] - samples[0][2]
        # one node back: 2 replicas in sync again, enough for every write
        back = time.monotonic()
        outage["restart_s"] = cluster.start(stopped)
        stalled_at = samples[-1][1]
        wait_for(
            lambda: run.ended()[0] > stalled_at,
            120,
            0.25,
            what="messages ending again with one node back",
        )
        outage["resumed_s"] = round(time.monotonic() - back, 1)
        run.feed(size.gap_s[1])
        outage["restart_crashed_s"] = cluster.start(crashed)
        outage["in_sync_s"] = cluster.wait_in_sync(cluster.topics())
        end = run.end()
    finally:
        sc.close()
    report_and_check(
        chaos_report,
        sc,
        end,
        cluster,
        fault=f"two of 3 nodes down for {size.outage_s:g}s (one SIGKILLed, one stopped "
        "once the first was fenced): every partition below min.insync.replicas; then one "
        "back, then the other",
        faults=2,
        outage=outage,
    )
    assert outage["in_flight"] > 0, outage
    assert outage["partitions_below_min_insync"] == outage["partitions"] > 0, outage
    assert outage["dead_while_down"] == 0, f"dead letters written while down: {outage}"
    assert outage["ended_while_quiet"] == 0, f"progress with no writable partition: {outage}"
