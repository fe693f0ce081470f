"""``key_order = strict`` under SIGKILLs (issue 23, item 12): the chaos ledger check, plus per
key order and the work redone after the kills.

The plan's messages go to a few keys (``strict_keys``) so that every key has records in the
retry chain and records waiting behind them. Checked at the end:

- the ledger: nothing lost, nothing in two places, every id in its expected place;
- order: per key, the *first* successful call of each record comes in the records' offset
  order (the call log's line order is the order of the calls; offsets and keys are read back
  from the main topic);
- the key-state topic holds no entry any more (every chain ended);
- redone work, against the guarantee (README: "a crash or rebalance redoes the records after
  the last committed offset"): every record handled again (a success repeated, a failure or
  a dead letter redone) must have a record, its main-topic record or a tier copy, that a
  fault could make the group read again: in a partition that changed hands, at an offset from
  the group's committed offset when the kill came up to the partition's end then (the killed
  process's partitions) or once both workers own partitions again (one a live worker gave up
  in the rebalance the restart brings, as its own log says: it may have read records that
  came after the kill). The committed offsets are read just before each kill (a commit
  between the read and the kill only shrinks what may be redone), the ends just after it; the
  group's first join counts as such a fault, from offset 0. So nothing committed is
  redone, nothing of a partition that stayed with its worker, nothing in steady state. Not
  the calls alone: strict order may park a record (an entry and a copy, no call) that a kill
  then makes the partition's next owner read and call again. Strict order keeps this contract
  as ``key_order = none`` does: its waiting records hold their partition's committed offset
  back (README, "Strict key order"), which widens what is uncommitted at a fault, never what
  is redone beyond it. The same plan under the same kill schedule runs first with
  ``key_order = none``, checked alike; the two redo counts and their ratio are reported, not
  compared: each depends on what happened to be in flight when each kill landed, on a
  machine that may be busy (CI once saw 156 against 35 records), so a ratio of two runs
  measures the machine, not the product.

Scenarios: two ``retryd worker`` processes, one SIGKILLed every few seconds and restarted (one
broker); the node leading most main-topic partitions, then the one leading most key-state,
tier and ``failed_topic`` partitions, SIGKILLed and restarted (a three-node cluster; at CI size
only with ``RETRYD_CHAOS_CLUSTER=all``, as the other cluster scenarios beyond the first).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from retryd.kafka.topics import create_topics, make_admin
from tests.chaos.cluster import Nodes
from tests.chaos.handler import OK
from tests.chaos.ledger import Reconciliation, Spec, make_plan
from tests.chaos.load import PacedProducer, Record
from tests.chaos.replicated import (
    Run,
    check,
    cluster_fields,
    sigkill_and_restart,
    start_replicated,
)
from tests.chaos.report import ChaosReport
from tests.chaos.scale import MAX_RETRIES, Sizes, every_cluster_scenario, settle_budget
from tests.chaos.scenario import Scenario, start
from tests.support import unique, wait_for

SETTLE_S = settle_budget(600.0)
JOIN_S = 5.0
PARTITIONS = 4
PLANNED_CALLS = {"ok": 1, "poison": MAX_RETRIES + 1, "non_retryable": 1}  # transient: k + 1


TP = tuple[str, int]  # (topic, partition)
# A worker's own log of its assignment: "assigned t[0], t[1]", "revoked ...", "lost ..."
ASSIGNMENT = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO (\d+) retryd\.worker\.engine: "
    r"(assigned|revoked|lost) (.*)$",
    re.MULTILINE,
)
PARTITION = re.compile(r"([^\s,\[]+)\[(\d+)\]")


@dataclass
class Window:
    """A fault and its aftermath: from a kill (or the start) until both workers own partitions
    again. Records of a partition that changed hands meanwhile may be redone from its
    committed offset at the start (``since``), up to its end once settled (``until``)."""

    began: float  # wall clock: the kill, or 0 for the group's first join
    ended: float  # wall clock: the group settled again
    since: dict[TP, int]  # committed offsets when it began (empty: nothing yet)
    killed_at: dict[TP, int]  # the partitions' ends just after the kill (the join: empty)
    until: dict[TP, int]  # the partitions' ends when it ended
    victim: int | None = None  # the pid killed


@dataclass(frozen=True, slots=True)
class Where:
    """Where a record of the main topic is: its key, partition and offset."""

    key: str
    partition: int
    offset: int


def keyed(plan: list[Spec], keys: int) -> list[Record]:
    """The plan's messages over ``keys`` keys, in turn: every key gets the mix."""
    return [(f"key-{i % keys}".encode(), spec.value(), []) for i, spec in enumerate(plan)]


def strict_settings() -> dict[str, Any]:
    return {"key_order": "strict", "key_state_topic": unique("key-state")}


def read_calls(path: Path) -> list[dict[str, Any]]:
    """The call log, in its line order (the order the calls were made in)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _read_all(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Any]:
    """Every record of ``topic`` now, read from the start by a group-less reader."""
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("chaos-readback"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        md = reader.list_topics(topic, timeout=15).topics[topic]
        parts = sorted(md.partitions)
        assert md.error is None and parts, f"{topic}: no partitions in the metadata"
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        at_end: set[int] = set()
        out = []
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(parts):
            assert time.monotonic() < deadline, f"{topic}: not read to its end in {timeout_s}s"
            for msg in reader.consume(1000, 0.2):
                err = msg.error()
                if err is None:
                    at_end.discard(msg.partition())
                    out.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
        return out
    finally:
        reader.close()


def produced_where(bootstrap: str, topic: str) -> dict[str, Where]:
    """Every id of the main topic with its key, partition and offset, read back from it."""
    out = {}
    for msg in _read_all(bootstrap, topic):
        ident = str(json.loads(msg.value())["id"])
        out[ident] = Where(msg.key().decode(), msg.partition(), msg.offset())
    return out


def live_state_entries(bootstrap: str, topic: str) -> int:
    """Entries of the key-state topic that no tombstone removed (0: every chain ended)."""
    last: dict[bytes, bytes | None] = {}
    for msg in _read_all(bootstrap, topic):
        last[msg.key()] = msg.value()
    return sum(1 for value in last.values() if value is not None)


def _calls_of(calls: list[dict[str, Any]], ident: str) -> str:
    return "; ".join(
        f"line {n + 1}: {c.get('o')} r={c.get('r')} {c.get('t')}[{c.get('p')}]@{c.get('off')} "
        f"pid={c.get('pid')} at={c.get('at')}"
        for n, c in enumerate(calls)
        if c.get("id") == ident
    )


@dataclass
class Order:
    """Per key, the first successes against the offsets: the keys out of order, the records
    whose first success came after that of a later record of their key, and the evidence."""

    keys: int
    keys_out_of_order: int
    records_out_of_order: int
    problems: list[str]

    def row(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "keys_out_of_order": self.keys_out_of_order,
            "records_out_of_order": self.records_out_of_order,
        }


def order_check(calls: list[dict[str, Any]], where: dict[str, Where]) -> Order:
    firsts: dict[str, list[tuple[int, str]]] = defaultdict(list)
    seen: set[str] = set()
    problems: list[str] = []
    for n, call in enumerate(calls):
        ident = str(call.get("id"))
        if call.get("o") != OK or ident in seen:
            continue
        seen.add(ident)
        if ident not in where:
            problems.append(f"{ident}: succeeded at line {n + 1}, not on the main topic")
            continue
        firsts[where[ident].key].append((n, ident))
    bad_keys = 0
    bad_records = 0
    for key, seq in sorted(firsts.items()):
        highest: tuple[int, int, str] | None = None  # (offset, line, id) of the latest so far
        out_of_order = 0
        for n, ident in seq:
            at = where[ident]
            if highest is not None and at.offset < highest[0]:
                out_of_order += 1
                if len(problems) < 10:
                    problems.append(
                        f"key {key} (partition {at.partition}): {ident} at offset {at.offset} "
                        f"first succeeded at line {n + 1}, after {highest[2]} at offset "
                        f"{highest[0]} (line {highest[1] + 1}). Calls of {ident}: "
                        f"{_calls_of(calls, ident)}. Calls of {highest[2]}: "
                        f"{_calls_of(calls, highest[2])}"
                    )
            elif highest is None or at.offset > highest[0]:
                highest = (at.offset, n, ident)
        bad_keys += out_of_order > 0
        bad_records += out_of_order
    return Order(len(firsts), bad_keys, bad_records, problems)


def redone(calls: list[dict[str, Any]], plan: list[Spec]) -> dict[str, int]:
    """Work done again: ``records`` whose handler was called more often than their fate needs
    (a success repeated, or a failure or dead letter redone), the ``extra_calls``, and
    ``handled_again``: records with more than one successful call."""
    planned = {s.id: PLANNED_CALLS.get(s.kind, s.k + 1) for s in plan}
    per_id = Counter(str(c.get("id")) for c in calls)
    ok = Counter(str(c.get("id")) for c in calls if c.get("o") == OK)
    return {
        "records": sum(1 for i, n in per_id.items() if n > planned.get(i, n)),
        "extra_calls": sum(n - planned[i] for i, n in per_id.items() if n > planned.get(i, n)),
        "handled_again": sum(1 for i, n in ok.items() if i in planned and n > 1),
    }


def redone_ids(calls: list[dict[str, Any]], plan: list[Spec]) -> set[str]:
    """The ids ``redone`` counts as ``records``: called more often than their fate needs."""
    planned = {s.id: PLANNED_CALLS.get(s.kind, s.k + 1) for s in plan}
    per_id = Counter(str(c.get("id")) for c in calls)
    return {i for i, n in per_id.items() if n > planned.get(i, n)}


def committed_now(meta: Consumer, parts: list[TopicPartition]) -> dict[TP, int]:
    """The group's committed offset of each partition (0 where nothing is committed)."""
    return {(tp.topic, tp.partition): max(tp.offset, 0) for tp in meta.committed(parts, 30)}


def ends_now(meta: Consumer, parts: list[TopicPartition]) -> dict[TP, int]:
    """Each partition's high watermark: one past its last record now."""
    return {
        (tp.topic, tp.partition): meta.get_watermark_offsets(tp, timeout=30, cached=False)[1]
        for tp in parts
    }


def ids_at_offsets(bootstrap: str, topics: list[str]) -> dict[TP, dict[int, str]]:
    """The id of every record of ``topics`` (main and tiers), by partition and offset."""
    out: dict[TP, dict[int, str]] = defaultdict(dict)
    for topic in topics:
        for msg in _read_all(bootstrap, topic):
            out[(topic, msg.partition())][msg.offset()] = str(json.loads(msg.value())["id"])
    return out


def assignment_events(logs: list[str]) -> list[tuple[float, int, str, list[TP]]]:
    """Every (wall time, pid, assigned|revoked|lost, partitions) the workers logged."""
    out = []
    for text in logs:
        for stamp, pid, kind, rest in ASSIGNMENT.findall(text):
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            parts = [(t, int(p)) for t, p in PARTITION.findall(rest)]
            out.append((at, int(pid), kind, parts))
    return sorted(out)


def handed_over(
    events: list[tuple[float, int, str, list[TP]]], w: Window
) -> tuple[set[TP], set[TP]]:
    """Partitions that changed hands in ``w``: the victim's at the kill, and those a worker
    gave up (revoked or lost) before the group settled. A log line's time has a millisecond's
    precision; a second of slack on either side covers it and the line's delay."""
    owned: set[TP] = set()
    given_up: set[TP] = set()
    for at, pid, kind, parts in events:
        if pid == w.victim and at <= w.began:
            if kind == "assigned":
                owned.update(parts)
            else:
                owned.difference_update(parts)
        if kind != "assigned" and w.began - 1 <= at <= w.ended + 1:
            given_up.update(parts)
    return owned, given_up


def redoable(
    ids_at: dict[TP, dict[int, str]], w: Window, victims: set[TP], given_up: set[TP]
) -> set[str]:
    """Ids of the records ``w`` may make the group redo, from each handed-over partition's
    committed offset when the fault began: up to its end at the kill in the victim's partitions
    (it read nothing after), up to its end once settled in those a live worker gave up (it
    may have read records that arrived after the kill)."""
    ids: set[str] = set()
    for tp in victims | given_up:
        start = w.since.get(tp, 0)
        end = w.until.get(tp, 0) if tp in given_up else w.killed_at.get(tp, 0)
        ids.update(i for off, i in ids_at.get(tp, {}).items() if start <= off < end)
    return ids


@dataclass
class KillRun:
    """One run of the worker-SIGKILL scenario and what it left."""

    sc: Scenario
    rec: Reconciliation
    behind: int
    kills: list[dict[str, Any]]
    survivors: list[tuple[str, bool]]
    codes: list[int]
    order: Order
    redone: dict[str, int]
    state_left: int | None  # live key-state entries (None: key_order = none)
    seconds: float
    redone_ids: set[str]
    uncommitted: set[str]  # ids a fault may make the group redo (``redoable``)

    def beyond_guarantee(self) -> set[str]:
        """Records redone that no fault explains: none of their records (main-topic record or
        tier copy) was uncommitted when a kill came, or arrived before the group settled."""
        return self.redone_ids - self.uncommitted

    def summary(self) -> dict[str, Any]:
        return {
            **self.rec.row(),
            "partitions_behind_at_end": self.behind,
            "seconds": self.seconds,
            "order": self.order.row(),
            "redone": self.redone,
            "redoable": len(self.uncommitted),
        }


def sigkill_run(
    key_order: str,
    bootstrap: str,
    tmp_path: Path,
    plan: list[Spec],
    records: list[Record],
    schedule: list[tuple[float, int]],
) -> KillRun:
    """Two workers with ``key_order``. Each kill of ``schedule`` (pause, victim) waits until
    the group has settled (both workers own partitions: the last restarted one works again),
    lets a share of the load run for the pause, then SIGKILLs the victim and starts it again at
    once: each kill hits a working group, in both runs alike."""
    directory = tmp_path / key_order
    directory.mkdir()
    strict = key_order == "strict"
    settings = strict_settings() if strict else {}
    sc = start(
        f"strict_order_sigkill_workers_{key_order}",
        bootstrap,
        directory,
        plan,
        partitions=PARTITIONS,
        **settings,
    )
    kills: list[dict[str, Any]] = []
    windows: list[Window] = []
    meta = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": sc.dep.settings.group_id,
            "enable.auto.commit": False,
        }
    )  # reads the group's committed offsets; never joins it
    parts = [TopicPartition(t, p) for t in sc.topics for p in range(PARTITIONS)]
    # The first window is the group's join: the second worker joining makes the first give up
    # partitions, as a restart does after each kill (nothing is committed yet: all from 0).
    opened: tuple[float, dict[TP, int], dict[TP, int], int | None] | None = (0.0, {}, {}, None)
    try:
        if strict:  # the compacted key-state topic, as 'retryd topics create' makes it
            states = create_topics(sc.dep.settings, make_admin(sc.dep.settings))
            assert {s.spec.kind for s in states if s.status == "created"} >= {"key_state"}
        workers = [sc.fleet.worker("w0"), sc.fleet.worker("w1")]
        load = PacedProducer(bootstrap, sc.dep.main, records)
        shares = len(schedule) + 1  # one while the group joins, one before each kill
        load.allow_share(1, shares, JOIN_S)
        partitions = len(sc.topics) * PARTITIONS
        for i, (pause, victim) in enumerate([*schedule, (0.0, -1)]):
            wait_for(
                lambda: sc.fleet.group_settled(workers, partitions),
                180,
                what="both workers to own partitions (the restarted one working)",
            )
            if opened is not None:  # the group settled: the window open since closes
                began, since, killed_at, victim_pid = opened
                until = ends_now(meta, parts)
                windows.append(Window(began, time.time(), since, killed_at, until, victim_pid))
            if victim < 0:
                break  # the last kill's window is closed
            load.allow_share(i + 2, shares, pause)
            time.sleep(pause)  # the fault schedule's pace
            proc = workers[victim]
            assert proc.alive(), f"{proc.name} exited on its own: {proc.output()[-2000:]}"
            # Read before the kill: a commit made between the read and the kill only shrinks
            # what the kill can make the group redo.
            committed = committed_now(meta, parts)
            began = time.time()
            at = time.monotonic()
            code = sc.fleet.kill(proc)
            # read after the kill: ends past anything the killed process could have read
            opened = (began, committed, ends_now(meta, parts), proc.pid)
            kills.append(sc.fault_entry(load, at, pid=proc.pid, status=code))
            workers[victim] = sc.fleet.worker(proc.name)
        load.finish()
        load.join(300)
        _, behind = sc.observer.settle(SETTLE_S)
        survivors = [(w.name, w.alive()) for w in workers]
        codes = [sc.fleet.terminate(w) for w in workers]
        rec = sc.observer.final()  # anything redone before the clean stop is counted
        calls = read_calls(sc.call_log)
        order = order_check(calls, produced_where(bootstrap, sc.dep.main))
        state = sc.dep.settings.key_state_topic
        left = live_state_entries(bootstrap, state) if strict else None
        ids_at = ids_at_offsets(bootstrap, sc.topics)
        seconds = round(time.monotonic() - sc.began, 1)
    finally:
        meta.close()
        sc.close()
    work = redone(calls, plan)
    events = assignment_events([p.output() for p in sc.fleet.procs])
    joined, *after_kills = [redoable(ids_at, w, *handed_over(events, w)) for w in windows]
    uncommitted = set(joined)
    for kill, ids in zip(kills, after_kills, strict=True):
        kill["redoable"] = len(ids)
        uncommitted |= ids
    return KillRun(
        sc,
        rec,
        behind,
        kills,
        survivors,
        codes,
        order,
        work,
        left,
        seconds,
        redone_ids(calls, plan),
        uncommitted,
    )


@pytest.mark.chaos
def test_strict_order_through_worker_sigkills(
    bootstrap: str,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes
    plan = make_plan(size.strict_messages, chaos_rng, "strict-", MAX_RETRIES)
    records = keyed(plan, size.strict_keys)
    schedule = [
        (chaos_rng.uniform(*size.strict_kill_every_s), chaos_rng.randrange(2))
        for _ in range(size.strict_kills)
    ]
    none = sigkill_run("none", bootstrap, tmp_path, plan, records, schedule)
    strict = sigkill_run("strict", bootstrap, tmp_path, plan, records, schedule)
    ratio = strict.redone["records"] / max(1, none.redone["records"])
    chaos_report.add(
        strict.sc.row(
            strict.rec,
            strict.behind,
            len(strict.kills),
            fault=f"key_order=strict, {size.strict_keys} keys: SIGKILL one of 2 worker "
            f"processes {size.strict_kill_every_s[0]:g}-{size.strict_kill_every_s[1]:g}s after "
            f"the group settled, restarted at once; the same plan and kill schedule with "
            f"key_order=none for comparison",
            key_order="strict",
            kills=len(strict.kills),
            restarts=len(strict.kills),
            order=strict.order.row(),
            order_problems=strict.order.problems[:5],
            key_state_entries_left=strict.state_left,
            redone={
                "strict": strict.redone,
                "none": none.redone,
                "ratio": round(ratio, 2),
                "guarantee": "every record redone was uncommitted in a partition that changed "
                "hands at a fault",
                "strict_redoable": len(strict.uncommitted),
                "none_redoable": len(none.uncommitted),
            },
            none=none.summary(),
            at_kills=strict.kills,
            none_at_kills=none.kills,
        )
    )
    for run in (none, strict):
        run.sc.assert_settled(run.rec, run.behind)
        assert len(run.kills) == size.strict_kills, run.kills
        assert all(k["status"] == -9 for k in run.kills), run.kills
        # The faults hit a system under load: messages were on their way at every kill.
        assert all(k["in_flight"] > 0 for k in run.kills), run.kills
        assert all(alive for _, alive in run.survivors), f"a worker exited: {run.survivors}"
        assert run.codes == [0, 0], f"SIGTERM at the end: exit statuses {run.codes}"
    assert strict.order.problems == [], "\n".join(strict.order.problems) + strict.sc.diagnosis()
    assert strict.order.keys_out_of_order == 0, strict.order.row()
    assert strict.state_left == 0, f"{strict.state_left} key-state entries never removed"
    for run in (none, strict):
        beyond = sorted(run.beyond_guarantee())
        assert not beyond, (
            f"key_order={run.sc.dep.settings.key_order.value}: {len(beyond)} of the "
            f"{len(run.redone_ids)} records redone had no record uncommitted in a partition "
            f"that changed hands at a fault ({len(run.uncommitted)} ids had), e.g. "
            + "; ".join(f"{i}: {_calls_of(read_calls(run.sc.call_log), i)}" for i in beyond[:3])
            + run.sc.diagnosis()
        )
    print(
        f"\nstrict: {strict.rec.describe()} redone={strict.redone} order={strict.order.row()}"
        f"\nnone:   {none.rec.describe()} redone={none.redone} order={none.order.row()}"
        f"\nredone records strict/none = {ratio:.2f}; redoable after the faults: "
        f"strict {len(strict.uncommitted)}, none {len(none.uncommitted)}"
    )


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.skipif(
    not every_cluster_scenario(),
    reason="ci scale runs one cluster scenario (RETRYD_CHAOS_CLUSTER=all runs this one too)",
)
def test_strict_order_through_leader_sigkills(
    cluster: Nodes,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size = chaos_sizes.cluster
    plan = make_plan(size.strict_messages, chaos_rng, "slead-", MAX_RETRIES)
    records = keyed(plan, chaos_sizes.strict_keys)
    sc = start_replicated(
        "cluster_strict_order_leader_sigkill", cluster, tmp_path, plan, **strict_settings()
    )
    settings = sc.dep.settings
    state = settings.key_state_topic
    written = [state, *settings.plan.tier_topics, sc.dep.failed]
    kills: list[dict[str, Any]] = []
    try:
        run = Run(sc, shares=1 + 2 * 2 * size.strict_rounds, records=records)
        for _ in range(size.strict_rounds):
            for role, topics in (("main", [sc.dep.main]), ("state+tiers", written)):
                run.gap(chaos_rng.uniform(*size.gap_s))
                victim = cluster.busiest_leader(topics)
                kills.append(sigkill_and_restart(cluster, run, victim, size.down_s, led_of=role))
        end = run.end()
        calls = read_calls(sc.call_log)
        order = order_check(calls, produced_where(cluster.bootstrap, sc.dep.main))
        left = live_state_entries(cluster.bootstrap, state)
    finally:
        sc.close()
    work = redone(calls, plan)
    chaos_report.add(
        sc.row(
            end.rec,
            end.behind,
            len(kills),
            fault=f"key_order=strict, {chaos_sizes.strict_keys} keys: SIGKILL the node leading "
            f"most main-topic partitions, then the one leading most key-state, tier and "
            f"failed_topic partitions ({size.strict_rounds}x each); down {size.down_s:g}s, "
            f"restarted, back in sync before the next",
            **cluster_fields(cluster, sc),
            key_order="strict",
            kills=len(kills),
            order=order.row(),
            order_problems=order.problems[:5],
            key_state_entries_left=left,
            redone=work,
            at_kills=kills,
        )
    )
    check(sc, end)
    assert len(kills) == 2 * size.strict_rounds
    assert all(k["led"] and k["in_flight"] > 0 for k in kills), kills
    assert order.problems == [], "\n".join(order.problems) + sc.diagnosis()
    assert order.keys_out_of_order == 0, order.row()
    assert left == 0, f"{left} key-state entries never removed"
    print(f"\n{end.rec.describe()} redone={work} order={order.row()}")
