"""``consumer_mode = share`` under chaos (issue 26): a share group's workers SIGKILLed under
load, and the share coordinator's node SIGKILLed on the three-node cluster. The chaos ledger
at the end: nothing lost, nothing in two terminal places, every id in its expected place;
repeats (at-least-once) are counted and reported.

- Worker SIGKILLs (one broker): ``share_workers`` ``retryd worker`` processes (role ``all``:
  the share group reads the main topic, a consumer group the tiers), a random one SIGKILLed
  every few seconds and restarted at once. The records a killed worker held come back when
  their lock expires (the group's ``share.record.lock.duration.ms`` is set to 15 s, the
  broker's minimum) or sooner, when the broker drops the dead member.
- The share coordinator (three nodes, at CI size only with ``RETRYD_CHAOS_CLUSTER=all``, as
  the other cluster scenarios beyond the first): the node that is *share coordinator* of most
  of the main topic's share-partitions, found with ``FindCoordinator`` key type ``share`` (the
  Python admin client cannot ask: ``tests/chaos/share_probe.py`` speaks the protocol), is
  SIGKILLed, kept down ``down_s`` and restarted. That node leads the ``__share_group_state``
  partitions holding those share-partitions' state; the report says whether it also led main
  partitions or was the share group's group coordinator. The same again with the share
  group's *group coordinator* (``FindCoordinator`` key type ``group``: members, heartbeats
  and assignment), a node that is usually not a share coordinator of the group.

Settled means, besides every id ended: the tiers' consumer group committed everything, and
the share group's lag (``DescribeShareGroupOffsets``) is 0 on every main partition.

The delivery limit: the group's ``share.delivery.count.limit`` is set to 10 (the broker's
maximum), so kills every few seconds do not exhaust it. A record that reaches it anyway is
dead-lettered by retryd (reason ``exhausted``, class ``delivery_count_limit``). The ledger
accepts such a dead letter in place of the record's planned place only with the evidence that
the limit was reached by lost deliveries: no successful call of the id, its dead letter(s)
say "delivered 10 times", and every call of it on the main topic was made by a worker process
the test SIGKILLed (a call in a process that lived on ends in an acknowledgement). Anything
else stays a failure of the ledger (misplaced, or in two places).
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import KafkaException

from tests.chaos.cluster import Nodes
from tests.chaos.fleet import Fleet
from tests.chaos.ledger import DEAD, Expect, Reconciliation, Spec, make_plan, reconcile
from tests.chaos.load import PacedProducer
from tests.chaos.observe import CallLog, DeadLetters, Observer, id_from_json, partitions_behind
from tests.chaos.replicated import (
    SESSION_TIMEOUT_MS,
    Run,
    replicated_deployment,
    report_and_check,
    restart_after,
)
from tests.chaos.report import ChaosReport
from tests.chaos.scale import (
    MAX_RETRIES,
    SEQUENCE,
    Sizes,
    every_cluster_scenario,
    settle_budget,
)
from tests.chaos.scenario import CALL_LOG, Scenario
from tests.chaos.share_handler import CALL_S
from tests.chaos.share_probe import ProbeError, ShareProbe
from tests.integration.worker_support import Deployment, deployment
from tests.support import (
    ON_TANSU,
    broker_older_than,
    json_lines,
    read_topic,
    set_group_configs,
    wait_for,
)

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(
        ON_TANSU or broker_older_than(4, 2),
        reason="share groups (KIP-932) need Apache Kafka 4.2 or newer",
    ),
]

ONE_AT_CI = pytest.mark.skipif(
    not every_cluster_scenario(),
    reason="ci scale runs one cluster scenario (RETRYD_CHAOS_CLUSTER=all runs this one too)",
)

# the chaos handler, each call held 50 ms (tests/chaos/share_handler.py says why)
SHARE_HANDLER = "python:tests.chaos.share_handler:handle"
SHARE_ENV = {"RETRYD_CONSUMER_MODE": "share", "RETRYD_HANDLER": SHARE_HANDLER}
PARTITIONS = 4
LOCK_MS = 15_000  # the broker's minimum: a killed worker's records come back soonest
DELIVERY_LIMIT = 10  # the broker's maximum (group.share.max.delivery.count.limit)
LIMIT_CLASS = "delivery_count_limit"  # retryd.share.worker's error class at the limit
SETTLE_S = settle_budget(600.0)
JOIN_S = 5.0
HANDLER_TIMEOUT_S = 10.0  # + 2 s to route and acknowledge, under the 15 s lock

T = TypeVar("T")


def configure_share_group(bootstrap: str, group: str) -> None:
    """The group's lock and delivery limit (above), set before its first member joins."""
    set_group_configs(
        bootstrap,
        group,
        {
            "share.record.lock.duration.ms": str(LOCK_MS),
            "share.delivery.count.limit": str(DELIVERY_LIMIT),
        },
    )


class ShareObserver(Observer):
    """The chaos observer of a share-mode scenario: "nothing left to redo" reads the tiers'
    consumer group (committed offsets) and the share group (its lag on the main topic); the
    final reconciliation applies the delivery-limit rule of the module docstring."""

    def __init__(self, plan: list[Spec], dep: Deployment, call_log: Path) -> None:
        bootstrap = dep.bootstrap
        super().__init__(
            plan,
            [CallLog(call_log)],
            DeadLetters(bootstrap, dep.failed, id_from_json),
            bootstrap,
            dep.settings.group_id,
            list(dep.settings.plan.tier_topics),
        )
        self.dep = dep
        self.call_log = call_log
        self.probe = ShareProbe(bootstrap, dep.settings.share_group_id, dep.main)
        self.killed: set[int] = set()  # PIDs of the worker processes the test SIGKILLed
        self.main_repeats = 0  # main-topic calls beyond one per id
        self.main_repeated_ids = 0
        self.limit_accepted: list[str] = []
        self.limit_refused: list[str] = []

    def settle(self, timeout_s: float, *, interval_s: float = 1.0) -> tuple[Reconciliation, int]:
        deadline = time.monotonic() + timeout_s
        while True:
            rec = self.refresh()
            behind = -1
            if not rec.lost:
                try:
                    tiers = partitions_behind(self.bootstrap, self.group, self.topics)
                    share = self.probe.behind()
                    behind = tiers + len(share)
                    if share:
                        self._note(f"share group {self.probe.group} not settled: {share}")
                except (KafkaException, ProbeError) as exc:
                    self._note(str(exc))  # a failed measurement, not a verdict: again
            if behind == 0 or time.monotonic() > deadline:
                if rec.lost:
                    self.notes.append(self._explain_missing(rec.lost))
                return rec, behind
            time.sleep(interval_s)  # polling interval of a condition wait, not synchronisation

    def _note(self, text: str) -> None:
        if not self.notes or self.notes[-1] != text:
            self.notes.append(text)

    def final(self) -> Reconciliation:
        tally = self._fresh_tally(timeout_s=120)
        calls = json_lines(self.call_log)
        # repeats of the share group itself: a record handed out again after a kill
        per_id = Counter(c["id"] for c in calls if c.get("t") == self.dep.main)
        self.main_repeats = sum(n - 1 for n in per_id.values())
        self.main_repeated_ids = sum(1 for n in per_id.values() if n > 1)
        plan = self._judge_limit(tally.handled, calls)
        return reconcile(plan, tally)

    def _judge_limit(self, handled: Counter[str], calls: list[dict[str, Any]]) -> list[Spec]:
        """The plan, with the delivery-limit dead letters that meet the rule expected dead
        (``exhausted``); the others are listed in ``limit_refused`` with the reason."""
        limited: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for record in read_topic(self.bootstrap, self.dep.failed, timeout=120):
            if record.header("retryd_error_class") == LIMIT_CLASS.encode():
                limited[id_from_json(record.value)].append(
                    (
                        (record.header("retryd_dead_reason") or b"").decode(),
                        (record.header("retryd_error_message") or b"").decode(),
                    )
                )
        if not limited:
            return self.plan
        main_calls: dict[str, set[int]] = defaultdict(set)
        for call in calls:
            if call.get("id") in limited and call.get("t") == self.dep.main:
                main_calls[call["id"]].add(call["pid"])
        accepted, refused = [], []
        for ident, letters in sorted(limited.items()):
            why = []
            if handled.get(ident):
                why.append("also handled")
            if any(reason != "exhausted" for reason, _ in letters):
                why.append(f"reasons {sorted({r for r, _ in letters})}")
            if any(f"delivered {DELIVERY_LIMIT} times" not in m for _, m in letters):
                why.append(f"messages {[m for _, m in letters]}")
            survivors = main_calls[ident] - self.killed
            if survivors:
                why.append(f"called on the main topic by surviving pids {sorted(survivors)}")
            (refused if why else accepted).append(f"{ident}: {'; '.join(why)}" if why else ident)
        self.limit_accepted, self.limit_refused = accepted, refused
        dead = Expect(DEAD, "exhausted")
        ok = set(accepted)
        return [
            Spec(s.id, s.kind, s.k, dead) if s.id in ok else s  # expected at the limit
            for s in self.plan
        ]

    def fields(self) -> dict[str, Any]:
        """The report's share-mode fields."""
        return {
            "consumer_mode": "share",
            "handler_call_s": CALL_S,
            "share_group": self.probe.group,
            "record_lock_ms": LOCK_MS,
            "delivery_count_limit": DELIVERY_LIMIT,
            "main_topic_repeats": {
                "calls": self.main_repeats,
                "records": self.main_repeated_ids,
            },
            "limit_dead_letters_accepted": self.limit_accepted,
            "limit_dead_letters_refused": self.limit_refused,
        }


def share_scenario(name: str, dep: Deployment, tmp_path: Path, plan: list[Spec]) -> Scenario:
    """The observer and worker fleet of a share-mode scenario whose topics exist."""
    configure_share_group(dep.bootstrap, dep.settings.share_group_id)
    call_log = tmp_path / CALL_LOG
    observer = ShareObserver(plan, dep, call_log)
    fleet = Fleet(dep, tmp_path / "procs", call_log, env=SHARE_ENV)
    return Scenario(name, plan, dep, fleet, observer, call_log)


def repeats(rec: Reconciliation) -> int:
    return rec.handled_twice + rec.dead_twice


def test_sigkill_share_workers(
    bootstrap: str,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes
    plan = make_plan(size.share_messages, chaos_rng, "share-", MAX_RETRIES)
    dep = deployment(
        bootstrap,
        tmp_path,
        sequence=SEQUENCE,
        partitions=PARTITIONS,
        handler=SHARE_HANDLER,
        handler_timeout_s=HANDLER_TIMEOUT_S,
        ordering="none",
        consumer_mode="share",
    )
    sc = share_scenario("share_sigkill_workers", dep, tmp_path, plan)
    observer = sc.observer
    assert isinstance(observer, ShareObserver)
    kills: list[dict[str, object]] = []
    try:
        workers = [sc.fleet.worker(f"w{i}") for i in range(size.share_workers)]
        load = PacedProducer(bootstrap, dep.main, sc.records())
        shares = size.share_kills + 1  # one while the group joins, one before each kill
        load.allow_share(1, shares, JOIN_S)
        wait_for(lambda: observer.refresh().calls > 0, 120, what="the workers to handle messages")
        for i in range(size.share_kills):
            pause = chaos_rng.uniform(*size.share_kill_every_s)
            load.allow_share(i + 2, shares, pause)
            time.sleep(pause)  # the fault schedule's pace
            victim = chaos_rng.randrange(len(workers))
            proc = workers[victim]
            assert proc.alive(), f"{proc.name} exited on its own: {proc.output()[-2000:]}"
            at = time.monotonic()
            code = sc.fleet.kill(proc)
            observer.killed.add(proc.pid)
            kills.append(sc.fault_entry(load, at, pid=proc.pid, status=code))
            workers[victim] = sc.fleet.worker(proc.name)
        load.finish()
        load.join(300)
        rec, behind = observer.settle(SETTLE_S)
        survivors = [(w.name, w.alive()) for w in workers]
        codes = [sc.fleet.terminate(w) for w in workers]
        rec = observer.final()  # anything redone before the clean stop is counted
    finally:
        sc.close()
    chaos_report.add(
        sc.row(
            rec,
            behind,
            len(kills),
            fault=f"SIGKILL a random one of {size.share_workers} share-mode worker processes "
            f"every {size.share_kill_every_s[0]:g}-{size.share_kill_every_s[1]:g}s, "
            "restarted at once",
            kills=len(kills),
            restarts=len(kills),
            repeats=repeats(rec),
            at_kills=kills,
            **observer.fields(),
        )
    )
    sc.assert_settled(rec, behind)
    assert not observer.limit_refused, observer.limit_refused
    assert len(kills) == size.share_kills and all(k["status"] == -9 for k in kills), kills
    assert all(k["in_flight"] > 0 for k in kills), kills
    assert all(alive for _, alive in survivors), f"a worker exited on its own: {survivors}"
    assert codes == [0] * size.share_workers, f"SIGTERM at the end: exit statuses {codes}"
    print(f"\n{rec.describe()} kills={len(kills)} repeats={repeats(rec)}")


# -- the share coordinator's node on the three-node cluster ------------------------------------
def _answer(probe: Callable[[], T]) -> T | None:
    """A probe's answer, or None while the cluster has none (a node down, a leader moving)."""
    try:
        return probe()
    except (ProbeError, KafkaException):
        return None


def sigkill_coordinator(
    nodes: Nodes, run: Run, probe: ShareProbe, down_s: float, which: str
) -> dict[str, Any]:
    """SIGKILL a coordinator's node under load, keep it down ``down_s``, start it again and
    wait until every replica is in sync. ``which``: ``share``, the node that is share
    coordinator of most main share-partitions (the lowest id on a tie); ``group``, the share
    group's group coordinator. The entry says which roles the node had, how long until every
    one of them had moved to another node (``coordinator_failover_s``), and how long the
    partitions it led had no leader (``failover_s``)."""
    coordinators = wait_for(
        lambda: _answer(probe.share_coordinators), 60, 0.5, what="the share coordinators"
    )
    group_node = wait_for(
        lambda: _answer(probe.group_coordinator), 60, 0.5, what="the group coordinator"
    )[0]
    if which == "share":
        counts = Counter(coordinators.values())
        victim = min(counts, key=lambda n: (-counts[n], n))
    else:
        victim = group_node
    moved = sorted(p for p, n in coordinators.items() if n == victim)
    sc = run.sc
    topics = [*sc.topics, sc.dep.failed]
    led = nodes.led_by(victim, topics)
    main_led = nodes.led_by(victim, [sc.dep.main])
    at = time.monotonic()
    pid = nodes.kill(victim)
    entry = run.entry(
        at,
        node=victim,
        pid=pid,
        killed_for=f"{which} coordinator",
        share_coordinator_of=[f"{sc.dep.main}[{p}]" for p in moved],
        share_coordinators_before=coordinators,
        group_coordinator_before=group_node,
        main_partitions_led=len(main_led),
        led=len(led),
    )
    run.feed(down_s)

    def elsewhere() -> tuple[dict[int, int], int] | None:
        now = _answer(probe.share_coordinators)
        if not now or any(now[p] == victim for p in moved):
            return None
        group = _answer(probe.group_coordinator)
        return (now, group[0]) if group and group[0] != victim else None

    after, group_after = wait_for(
        elsewhere, 120, 0.25, what=f"coordinators other than node {victim}"
    )
    entry["coordinator_failover_s"] = round(time.monotonic() - at, 1)
    entry["share_coordinators_after"] = after
    entry["group_coordinator_after"] = group_after
    return restart_after(nodes, run, victim, at, led, down_s, entry)


ROLE = {
    "share": "share coordinator of most main-topic share-partitions",
    "group": "group coordinator of the share group",
}
FOUND = {
    "share": "FindCoordinator key type share (2), key <group>:<topic id>:<partition>",
    "group": "FindCoordinator key type group (0), key <group>",
}


@pytest.mark.slow
@ONE_AT_CI
@pytest.mark.parametrize("which", ["share", "group"])
def test_sigkill_share_coordinator(
    which: str,
    cluster: Nodes,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes.cluster
    plan = make_plan(size.share_messages, chaos_rng, "sharec-", MAX_RETRIES)
    dep = replicated_deployment(
        cluster,
        tmp_path,
        PARTITIONS,
        SESSION_TIMEOUT_MS,
        consumer_mode="share",
        ordering="none",
    )
    name = f"cluster_share_{which}_coordinator_sigkill"
    sc = share_scenario(name, dep, tmp_path, plan)
    observer = sc.observer
    assert isinstance(observer, ShareObserver)
    kills: list[dict[str, Any]] = []
    try:
        run = Run(sc, shares=1 + 2 * size.share_kills)
        for _ in range(size.share_kills):
            run.gap(chaos_rng.uniform(*size.gap_s))
            kills.append(sigkill_coordinator(cluster, run, observer.probe, size.down_s, which))
        end = run.end()
    finally:
        sc.close()
    report_and_check(
        chaos_report,
        sc,
        end,
        cluster,
        fault=f"SIGKILL the node that is {ROLE[which]} ({FOUND[which]}; "
        f"{size.share_kills}x); down {size.down_s:g}s, restarted, back in sync before the next",
        faults=len(kills),
        kills=len(kills),
        repeats=repeats(end.rec),
        at_kills=kills,
        **observer.fields(),
    )
    assert not observer.limit_refused, observer.limit_refused
    assert len(kills) == size.share_kills
    assert all(k["in_flight"] > 0 for k in kills), kills
    if which == "share":
        assert all(k["share_coordinator_of"] for k in kills), kills
