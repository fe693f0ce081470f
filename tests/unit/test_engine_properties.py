"""Property-based test of the whole engine on the stub broker.

Hypothesis draws a run: sync or async handler; records over a few keys and partitions; per
call an outcome (success, retryable failure, non-retryable failure, a hang past the timeout,
and for async an uncancellable call) and a duration; and a schedule of group events (revoke
to a new member, lost assignment, clean restart). Members take partitions over one after the
other, as the group coordinator would hand them over. After the run every invariant the README
promises is checked:

- zero loss: every input ends handled or dead-lettered;
- no record in two terminal places (handled *and* dead-lettered), except after a lost
  assignment, where at-least-once allows it;
- on one member, calls of one ordering key never overlap and start in offset order;
- across an old and a new owner (revoke, restart), calls of one key never overlap;
- a committed offset never passes a record whose call had not ended;
- no record is left RUNNING once its call ended, and no assignment counts a running call;
- the worker never exits on record content.

Hung calls (abandoned past their timeout) are excluded from the overlap checks: Python cannot
stop a thread, which the README says.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from retryd.config import load_settings
from retryd.errors import NonRetryableError
from retryd.handlers.base import Message
from retryd.handlers.python_handler import PythonHandler
from retryd.policy import headers as h
from retryd.worker import loop_pool
from retryd.worker.assembly import build_worker
from retryd.worker.engine import Worker
from retryd.worker.lifecycle import RUNNING
from retryd.worker.partition import PartitionState
from tests.stub_kafka import StubBroker
from tests.stub_kafka import members as stub_members
from tests.support import wait_for

MAIN = "orders"
GROUP = "g"
SEQUENCE = "100ms"  # one tier, then failed_topic
TIER = "retry_100ms"
FAILED = "orders.failed"
TIMEOUT_S = 0.2
EXAMPLES = int(os.environ.get("RETRYD_PROPERTY_EXAMPLES", "20"))

OUTCOMES = ("ok", "ok", "ok", "retry", "dead", "hang", "ignore")


@dataclass
class Run:
    kind: str  # sync | async
    partitions: int
    keys: list[int]  # per record
    outcomes: dict[tuple[int, int, int, int], str]  # (partition, offset, retry, member%2)
    durations_ms: list[int]
    events: list[tuple[int, str]]  # (after this many calls started, revoke|lost|restart)
    exactly_once: bool = False  # copies and offsets in transactions (aborted copies unseen)


@st.composite
def runs(draw: st.DrawFn) -> Run:
    kind = draw(st.sampled_from(["sync", "async"]))
    partitions = draw(st.integers(1, 2))
    n = draw(st.integers(4, 40))
    keys = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    durations = draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
    choices = OUTCOMES if kind == "async" else OUTCOMES[:-1]
    outcomes = {}
    hangs = 0
    for p in range(partitions):
        for o in range(n):
            for retry in (0, 1):
                for m in (0, 1):
                    out = draw(st.sampled_from(choices))
                    if out in ("hang", "ignore"):
                        hangs += 1
                        if hangs > 2 or retry:  # bounded: max_abandoned_handlers is 8
                            out = "ok"
                    outcomes[(p, o, retry, m)] = out
    events = draw(
        st.lists(
            st.tuples(st.integers(0, n), st.sampled_from(["revoke", "lost", "restart"])),
            max_size=3,
        )
    )
    exactly_once = draw(st.booleans())
    return Run(kind, partitions, keys, outcomes, durations, sorted(events), exactly_once)


@dataclass
class Call:
    member: int
    topic: str
    partition: int
    offset: int
    key: bytes | None
    retry: int
    origin: tuple[int, int]  # original (partition, offset)
    outcome: str
    start: float
    end: float = field(default=float("inf"))


class Recorder:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.lock = threading.Lock()
        self.calls: list[Call] = []
        self.member = 0

    def started(self) -> int:
        with self.lock:
            return len(self.calls)

    def begin(self, m: Message, member: int) -> Call:
        origin = (m.original_partition, m.original_offset)
        outcome = self.run.outcomes.get((*origin, min(m.retry_number, 1), member % 2), "ok")
        call = Call(
            member,
            m.topic,
            m.partition,
            m.offset,
            m.key,
            m.retry_number,
            origin,
            outcome,
            time.perf_counter(),
        )
        with self.lock:
            self.calls.append(call)
        return call

    def duration(self, origin: tuple[int, int]) -> float:
        return self.run.durations_ms[origin[1]] / 1000

    def sync_handler(self, member: int) -> Any:
        def handle(m: Message) -> None:
            call = self.begin(m, member)
            try:
                if call.outcome == "hang":
                    time.sleep(TIMEOUT_S * 2)
                else:
                    time.sleep(self.duration(call.origin))
                _raise_for(call.outcome)
            finally:
                call.end = time.perf_counter()

        return handle

    def async_handler(self, member: int) -> Any:
        async def handle(m: Message) -> None:
            call = self.begin(m, member)
            try:
                if call.outcome == "hang":
                    await asyncio.sleep(TIMEOUT_S * 2)
                elif call.outcome == "ignore":
                    end = time.monotonic() + TIMEOUT_S * 2
                    while time.monotonic() < end:
                        try:
                            await asyncio.sleep(0.01)
                        except asyncio.CancelledError:
                            continue
                else:
                    await asyncio.sleep(self.duration(call.origin))
                _raise_for(call.outcome)
            finally:
                call.end = time.perf_counter()

        return handle


def _raise_for(outcome: str) -> None:
    if outcome == "retry":
        raise ValueError("retryable")
    if outcome == "dead":
        raise NonRetryableError("poison")


class Group:
    """Members that own the partitions one after the other."""

    def __init__(self, broker: StubBroker, run: Run, rec: Recorder, root: Path) -> None:
        self.broker = broker
        self.run = run
        self.rec = rec
        self.root = root
        self.members: list[tuple[Worker, threading.Thread, Any]] = []
        self.errors: list[BaseException] = []
        self.transitions: list[tuple[int, str]] = []  # (new member, how it took over)
        # per transition: when the old member let go, and the committed offsets then
        self.handovers: list[tuple[float, dict[tuple[str, int], int]]] = []
        self.states: list[PartitionState] = []
        self.tps = [(MAIN, p) for p in range(run.partitions)] + [
            (TIER, p) for p in range(run.partitions)
        ]

    def start_member(self) -> None:
        index = len(self.members)
        settings = load_settings(
            bootstrap_servers="stub:9092",
            main_topics=MAIN,
            retry_sequence=SEQUENCE,
            group_id=GROUP,
            state_dir=self.root / f"m{index}",
            handler="python:tests.unit.test_engine_loop:unused",
            handler_timeout_s=TIMEOUT_S,
            max_poll_interval_ms=30_000,
            session_timeout_ms=6_000,
            poll_timeout_s=0.02,
            max_in_flight=4,
            shutdown_timeout_s=5,
            failed_topic=FAILED,
            exactly_once=self.run.exactly_once,
        )
        func = (
            self.rec.async_handler(index)
            if self.run.kind == "async"
            else self.rec.sync_handler(index)
        )
        handler = PythonHandler(func, timeout_s=TIMEOUT_S)
        broker = self.broker

        def consumer(conf: dict[str, Any]) -> Any:
            return broker.consumer({**conf, "stub.manual_assign": True})

        worker = build_worker(
            settings,
            handler,
            consumer_factory=consumer,
            producer_factory=broker.producer,
            drain_grace_s=0.1,
        )
        states = self.states
        original = worker.book.assign

        def assign(partitions: Any) -> list[PartitionState]:
            made = original(partitions)
            states.extend(made)
            return made

        worker.book.assign = assign  # type: ignore[method-assign]
        stub = stub_members(worker)

        def target() -> None:
            try:
                worker.run()
            except BaseException as exc:
                self.errors.append(exc)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        stub.trigger_assign(list(self.tps))
        self.members.append((worker, thread, stub))

    def current(self) -> tuple[Worker, threading.Thread, Any]:
        return self.members[-1]

    def handover(self, how: str) -> None:
        worker, thread, stub = self.current()
        if how == "revoke":
            stub.trigger_revoke(list(self.tps))
            wait_for(lambda: not stub.assigned, 15, interval=0.005, what="the revoke")
        elif how == "lost":
            stub.trigger_lost(list(self.tps))
            wait_for(lambda: not stub.assigned, 15, interval=0.005, what="the loss")
        else:
            worker.stop()
            thread.join(15)
            assert not thread.is_alive()
        committed = {tp: self.broker.committed_offset(GROUP, *tp) or 0 for tp in self.tps}
        self.handovers.append((time.perf_counter(), committed))
        self.transitions.append((len(self.members), how))
        self.start_member()

    def stop_all(self) -> None:
        for worker, _, _ in self.members:
            worker.stop()
        for _, thread, _ in self.members:
            thread.join(15)
            assert not thread.is_alive(), "a member did not stop"


def _finished(broker: StubBroker, run: Run) -> bool:
    for topic in (MAIN, TIER):
        for p in range(run.partitions):
            end = len(broker.logs[topic][p])
            if (broker.committed_offset(GROUP, topic, p) or 0) < end:
                return False
    return True


def _check(broker: StubBroker, run: Run, rec: Recorder, group: Group) -> None:
    assert not group.errors, f"a worker exited: {group.errors}"
    n = len(run.keys)
    lost = any(how == "lost" for _, how in group.transitions)  # at-least-once's own case
    calls = rec.calls
    hung = [c for c in calls if c.outcome in ("hang", "ignore")]

    # zero loss, one terminal place
    handled = {c.origin for c in calls if c.outcome == "ok" and c.end != float("inf")}
    dead: set[tuple[int, int]] = set()
    copies: Counter[tuple[str, int, int, bytes | None]] = Counter()
    for topic in (FAILED, TIER):
        for r in broker.records(topic):
            if r.aborted:
                continue  # a read_committed reader never sees it
            hdrs = dict(r.headers)
            origin = (int(hdrs[h.ORIGINAL_PARTITION]), int(hdrs[h.ORIGINAL_OFFSET]))
            copies[(topic, *origin, hdrs.get(h.RETRY_NUMBER))] += 1
            if topic == FAILED:
                dead.add(origin)
    if run.exactly_once:  # whatever was redone, each copy exists once
        twice = [k for k, n in copies.items() if n > 1]
        assert not twice, f"exactly-once: copies seen twice: {twice[:5]}"
    every = {(p, o) for p in range(run.partitions) for o in range(n)}
    assert every <= handled | dead, f"lost: {sorted(every - handled - dead)}"
    # two places only for a record a later member redid, and only from the committed offset
    members_of: dict[tuple[str, int, int], set[int]] = defaultdict(set)
    for c in calls:
        members_of[(c.topic, c.partition, c.offset)].add(c.member)
    redone = {c.origin for c in calls if len(members_of[(c.topic, c.partition, c.offset)]) > 1}
    both = sorted((handled & dead) - redone)
    assert not both, f"in two places without a redo: {both}"
    for (topic, partition, offset), members in members_of.items():
        for k in sorted(members)[1:]:
            _, committed = group.handovers[k - 1]
            assert offset >= committed[(topic, partition)] or lost, (
                f"member {k} redid {topic}[{partition}]@{offset} below the committed offset"
            )
    # the old member never starts a call once it let go
    for k, (at, _) in enumerate(group.handovers):
        late = [c for c in calls if c.member == k and c.start > at]
        assert not late, f"member {k} kept handling after it let go: {late[:3]}"

    # ordering per member, and across revoke/restart hand-overs
    def clean(c: Call) -> bool:
        return c not in hung and c.end != float("inf")

    by_key: dict[tuple[int, str, int, bytes | None], list[Call]] = defaultdict(list)
    for c in calls:
        by_key[(c.member, c.topic, c.partition, c.key)].append(c)
    for (member, topic, partition, key), items in by_key.items():
        items.sort(key=lambda c: c.start)
        offsets = [c.offset for c in items]
        assert offsets == sorted(offsets), f"member {member} {topic}[{partition}] key {key!r}"
        good = [c for c in items if clean(c)]
        for a, b in itertools.pairwise(good):
            assert b.start >= a.end, f"overlap on member {member}: {a} {b}"
    for new, how in group.transitions:
        if how == "lost":
            continue
        old_calls = [c for c in calls if c.member == new - 1 and clean(c)]
        new_calls = [c for c in calls if c.member == new and clean(c)]
        for a in old_calls:
            for b in new_calls:
                if (a.topic, a.partition, a.key) == (b.topic, b.partition, b.key):
                    assert b.start >= a.end, f"old and new owner overlap: {a} {b}"

    # a committed offset never passes a record whose call had not ended
    ended: dict[tuple[str, int, int], float] = {}
    for c in calls:
        end = c.start + TIMEOUT_S if c in hung else c.end
        k = (c.topic, c.partition, c.offset)
        ended[k] = min(ended.get(k, float("inf")), end)
    for t, g, topic, partition, offset in broker.commit_log:
        if g != GROUP or lost:
            continue
        for o in range(offset):
            done = ended.get((topic, partition, o))
            assert done is not None and done <= t + 1e-3, (
                f"{topic}[{partition}] committed {offset} at {t} before {o} ended ({done})"
            )

    # nothing left running
    try:
        wait_for(lambda: all(s.running == 0 for s in group.states), 10, what="every call to end")
    except AssertionError:
        stuck = [
            (s, s.running, [(w.offset, w.stage.value, w.attempt) for w in s.pending])
            for s in group.states
            if s.running
        ]
        raise AssertionError(
            f"calls counted as running after every call ended: {stuck} "
            f"transitions={group.transitions} kind={run.kind}"
        ) from None
    for s in group.states:
        assert not [w for w in s.pending if w.stage is RUNNING], f"RUNNING left in {s}"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("RETRYD_PROPERTY_RANDOM") is None,
    # a failing run takes seconds; shrinking one is for a person at a terminal, not for CI
    phases=[Phase.explicit, Phase.reuse, Phase.generate]
    + ([Phase.shrink] if os.environ.get("RETRYD_PROPERTY_SHRINK") else []),
)
@given(run=runs())
def test_engine_invariants_hold_under_random_outcomes_and_rebalances(run: Run) -> None:
    original_grace = loop_pool.ASYNC_CANCEL_GRACE_S
    loop_pool.ASYNC_CANCEL_GRACE_S = 0.1
    root = Path(tempfile.mkdtemp(prefix="retryd-prop-"))
    broker = StubBroker()
    broker.create(MAIN, run.partitions)
    broker.create(TIER, run.partitions)
    rec = Recorder(run)
    group = Group(broker, run, rec, root)
    try:
        broker.create(FAILED, 1)
        for i, key in enumerate(run.keys):
            for p in range(run.partitions):
                broker.append(MAIN, b"k%d" % key, b"v%d" % i, partition=p)
        group.start_member()
        for after, how in run.events:
            wait_for(
                lambda after=after: rec.started() >= after or _finished(broker, run),
                20,
                interval=0.002,
                what=f"{after} calls",
            )
            group.handover(how)
        wait_for(lambda: _finished(broker, run), 30, interval=0.01, what="every offset committed")
        group.stop_all()
        _check(broker, run, rec, group)
        if os.environ.get("RETRYD_PROPERTY_VERBOSE"):
            print(
                f"kind={run.kind} records={len(run.keys)}x{run.partitions} "
                f"calls={len(rec.calls)} transitions={group.transitions} "
                f"hung={sum(c.outcome in ('hang', 'ignore') for c in rec.calls)} "
                f"dead={len(broker.records(FAILED))} tier={len(broker.records(TIER))}"
            )
    finally:
        loop_pool.ASYNC_CANCEL_GRACE_S = original_grace
        with contextlib.suppress(AssertionError):
            group.stop_all()


def test_property_driver_sees_a_planted_fault() -> None:
    """The checks are not vacuous: a call log with two overlapping calls of one key on one
    member fails them."""
    run = Run("sync", 1, [0, 0], {}, [0, 0], [])
    rec = Recorder(run)
    rec.calls = [
        Call(0, MAIN, 0, 0, b"k0", 0, (0, 0), "ok", 0.0, 2.0),
        Call(0, MAIN, 0, 1, b"k0", 0, (0, 1), "ok", 1.0, 3.0),
    ]
    broker = StubBroker()
    broker.create(MAIN, 1)
    broker.create(TIER, 1)
    broker.create(FAILED, 1)
    group = Group(broker, run, rec, Path(tempfile.mkdtemp()))
    with pytest.raises(AssertionError, match="overlap"):
        _check(broker, run, rec, group)
        if os.environ.get("RETRYD_PROPERTY_VERBOSE"):
            print(
                f"kind={run.kind} records={len(run.keys)}x{run.partitions} "
                f"calls={len(rec.calls)} transitions={group.transitions} "
                f"hung={sum(c.outcome in ('hang', 'ignore') for c in rec.calls)} "
                f"dead={len(broker.records(FAILED))} tier={len(broker.records(TIER))}"
            )
