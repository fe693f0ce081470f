"""SIGKILL the Kafka node that matters most to the workers, on a three-node cluster
(replication factor 3, min.insync.replicas 2, acks=all), while messages flow; start it again.

- partition leaders: the node leading most of the main topic's partitions, then the node
  leading most of the tiers' and ``failed_topic``'s (the topics the workers write); the
  controller fences a killed node after ``broker.session.timeout.ms`` (9 s) and moves its
  leaderships, writes wait meanwhile. The one replicated scenario CI runs.
- the group coordinator: the group has no coordinator until the offsets partition it lives
  on has a new leader, longer than the 2 s session, so every member loses its partitions and
  the uncommitted work is redone (duplicates, nothing lost).

Nothing may be lost, nothing may end in two places, no worker may exit, and the test's own
acks=all producer must see every message acknowledged.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.chaos.cluster import Nodes
from tests.chaos.ledger import make_plan
from tests.chaos.replicated import (
    SESSION_TIMEOUT_MS,
    Run,
    report_and_check,
    sigkill_and_restart,
    start_replicated,
)
from tests.chaos.report import ChaosReport
from tests.chaos.scale import MAX_RETRIES, Sizes, every_cluster_scenario

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

ONE_AT_CI = pytest.mark.skipif(
    not every_cluster_scenario(),
    reason="ci scale runs one cluster scenario (RETRYD_CHAOS_CLUSTER=all runs this one too)",
)


@pytest.mark.parametrize(
    ("session_timeout_ms", "name"),
    [
        pytest.param(SESSION_TIMEOUT_MS, "cluster_leader_sigkill", id="session-2s"),
        # retryd's default session (45 s) outlasts the broker's fencing (9 s): the same kills
        # without the group losing its partitions
        pytest.param(
            None, "cluster_leader_sigkill_default_session", id="session-45s", marks=ONE_AT_CI
        ),
    ],
)
def test_sigkill_partition_leaders(
    session_timeout_ms: int | None,
    name: str,
    cluster: Nodes,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes.cluster
    plan = make_plan(size.leader_messages, chaos_rng, "lead-", MAX_RETRIES)
    sc = start_replicated(name, cluster, tmp_path, plan, session_timeout_ms=session_timeout_ms)
    written = [*sc.dep.settings.plan.tier_topics, sc.dep.failed]
    kills: list[dict[str, object]] = []
    try:
        run = Run(sc, shares=1 + 2 * 2 * size.leader_rounds)
        for _ in range(size.leader_rounds):
            for role, topics in (("main", [sc.dep.main]), ("tiers", written)):
                run.gap(chaos_rng.uniform(*size.gap_s))
                victim = cluster.busiest_leader(topics)
                kills.append(sigkill_and_restart(cluster, run, victim, size.down_s, led_of=role))
        end = run.end()
    finally:
        sc.close()
    report_and_check(
        chaos_report,
        sc,
        end,
        cluster,
        fault=f"SIGKILL the node leading most main-topic partitions, then the one leading "
        f"most tier and failed_topic partitions ({size.leader_rounds}x each); down "
        f"{size.down_s:g}s, restarted, back in sync before the next",
        faults=len(kills),
        kills=len(kills),
        at_kills=kills,
    )
    assert len(kills) == 2 * size.leader_rounds
    assert all(k["led"] and k["in_flight"] > 0 for k in kills), kills


@ONE_AT_CI
def test_sigkill_group_coordinator(
    cluster: Nodes,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes.cluster
    plan = make_plan(size.coordinator_messages, chaos_rng, "coord-", MAX_RETRIES)
    sc = start_replicated("cluster_coordinator_sigkill", cluster, tmp_path, plan)
    group = sc.dep.settings.group_id
    kills: list[dict[str, object]] = []
    try:
        run = Run(sc, shares=1 + 2 * size.coordinator_kills)
        for _ in range(size.coordinator_kills):
            run.gap(chaos_rng.uniform(*size.gap_s))
            victim = cluster.coordinator(group)
            kills.append(sigkill_and_restart(cluster, run, victim, size.down_s, group=group))
        end = run.end()
    finally:
        sc.close()
    report_and_check(
        chaos_report,
        sc,
        end,
        cluster,
        fault=f"SIGKILL the node coordinating the consumer group ({size.coordinator_kills}x)"
        f"; down {size.down_s:g}s, restarted, back in sync before the next",
        faults=len(kills),
        kills=len(kills),
        at_kills=kills,
    )
    assert len(kills) == size.coordinator_kills
    assert all(k["in_flight"] > 0 for k in kills), kills
    assert all(k["new_coordinator"] != k["node"] for k in kills), kills
