"""Every feature keeps every guarantee, together: a stateful property test of the whole engine
on the stub broker, over the feature combinations (issue 23).

Combinations: ordering {key, partition, none} x circuit breaker {on, off} x key_order {none,
strict} x exactly_once {on, off} x handler {def, async def, and one of batch def / batch async
def in turn} x partitions *interleaved* in a consumed batch or contiguous x tier consumer {own,
shared} x, for a ``def`` handler, *runs* {on, off}, where allowed (strict order needs
ordering=key and is not combined with exactly_once; exactly_once keeps one consumer, so it is
``shared`` by construction). Not the full product: 14 feature rows x 3 handlers, chosen so that
every allowed pair of values of any two dimensions runs together
(``test_every_dimension_meets_every_other``); the id names every dimension. Interleaved, the
stub's consume hands a batch over as librdkafka's queue does when fetch responses of several
partitions arrive between two polls: a few records of one partition, then of another, then the
first again (issue 31 fault 8: P0-low, P1, P0-high). Tiers ``own``: role ``all`` reads its
tiers on a second group member (``retryd.worker.split_consumer``, two stub members) and
consumes batches of ``OWN_TIERS_BATCH``, so that a tier's due copies fill the tiers' share of a
batch; every consume must then poll the main member and hand out a quarter of the batch of main
records while it has them (``MainShare``; issue 31 fault 9), and the ``tier_backlog`` step
makes such a tier (an outage's copies, main records arriving, a new member). Runs
(``retryd.worker.runs``) on: the scheduler's pace is pinned fast, however long the calls take,
and a failed run puts runs off for a few records only, so the backoff point falls inside
batches; off: pinned slow, no runs at all. Each combination is one pytest item; in it,
Hypothesis drives a ``RuleBasedStateMachine`` whose steps are what production throws at a
worker: records arriving, a revoke to a new member, a lost assignment, a clean restart, an
outage's backlog in the tier met by a new member, an outage of the business service (every call
fails until it ends), acknowledgements that arrive late. Per call, the outcome is random:
success, retryable or non-retryable failure, a hang past the timeout, and for ``async def`` a
call that ignores its cancellation (its loop abandoned). A batch handler (``handle_batch``, two
records per call) answers per record, as an exception instance,
``retryd.Retry``/``retryd.Dead``, None or True; one hang (or ignored cancellation) holds its
whole call, whose every record then times out.

Invariants, checked while it runs (order) and once everything settled:

- **no same-key overlap or disorder**: on one member, calls of one ordering key (key, or
  partition) never overlap and start in offset order (a held record runs again before the
  next one of its key); across a revoke or restart, the new owner never overlaps the old one;
- **one terminal place**: no record handled and dead-lettered, except one redone after a lost
  assignment (at-least-once's own case); with exactly_once no copy exists twice;
- **nothing lost**: every record handled or dead-lettered;
- **progress**: every partition's committed offset reaches its end within a bound once the
  faults stop;
- **strict order**: per key, first successes come in offset order; every chain entry is
  removed at the end;
- **the main member is served** (tiers ``own``): every consume polls it and hands out at least
  a quarter of the batch of main records while it has them, however deep the tier.

Calls abandoned past their timeout are excluded from the overlap checks: Python cannot stop a
thread, which the README says. That is every call the engine timed out (noted where it does,
``Lifecycle.expire``), not only those drawn to hang: on a busy machine a 3 ms call can outlast
the 0.2 s timeout too (seen as a 60 µs overlap on one key). So are calls *cut off* with an
abandoned event loop (another call on it ignored its cancellation): frozen in the stopped loop,
they never resume; the worker runs their records again once that loop's thread has ended. Their
coroutine's ``finally`` still runs, but only when the garbage collector closes the pending
task, at any later time (``GeneratorExit``): that is no end of the call, and used as one it
showed a record "called twice at once" (``Service.cut_off``). ``RETRYD_COMPOSE_EXAMPLES``
sets the examples per combination (CI: 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import itertools
import math
import os
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import retryd
from retryd.config import load_settings
from retryd.errors import NonRetryableError
from retryd.handlers.base import Message
from retryd.handlers.python_batch import PythonBatchHandler
from retryd.handlers.python_handler import PythonHandler
from retryd.policy import headers as h
from retryd.policy import key_order as ko
from retryd.worker import loop_pool
from retryd.worker import runs as runs_module
from retryd.worker.assembly import build_worker
from retryd.worker.engine import Worker
from retryd.worker.lifecycle import Lifecycle
from retryd.worker.run_policy import RunPace
from retryd.worker.split_consumer import SplitConsumer
from tests.stub_kafka import LateAcksProducer, StubBroker, StubReader, members
from tests.support import wait_for

MAIN = "orders"
GROUP = "g"
TIER = "retry_50ms"
FAILED = "orders.failed"
STATE = "orders.key_state"
PARTITIONS = 2
TIMEOUT_S = 0.2
EXAMPLES = int(os.environ.get("RETRYD_COMPOSE_EXAMPLES", "3"))
STEPS = int(os.environ.get("RETRYD_COMPOSE_STEPS", "10"))
SETTLE_S = float(os.environ.get("RETRYD_COMPOSE_SETTLE_S", "60"))  # progress bound
INTERLEAVE = 2  # records of a partition at a time in an interleaved batch
# runs on: records of a partition that go singly after a failed run, so the backoff point
# falls inside batches; interleaved (INTERLEAVE), an arrival's batch then holds P0-low
# (singles), P1, P0-high (offered as a run)
RUNS_BACKOFF = 2


class Combo(NamedTuple):
    ordering: str
    breaker: bool
    strict: bool
    exactly_once: bool
    kind: str
    interleaved: bool = False
    tiers: str = "own"  # tier_consumer: the tiers on a group member of their own, or shared
    runs: bool | None = None  # a def handler's runs pinned on or off (None: other kinds)

    @property
    def name(self) -> str:
        """Every dimension, so that a failing id says the whole combination."""
        runs = "" if self.runs is None else ("-runs" if self.runs else "-noruns")
        return (
            f"{self.ordering}-{'breaker' if self.breaker else 'nobreaker'}-"
            f"{'strict' if self.strict else 'nostrict'}-{'eos' if self.exactly_once else 'alo'}-"
            f"{self.kind}{runs}-{'interleaved' if self.interleaved else 'contiguous'}-"
            f"tiers_{self.tiers}"
        )


# The feature combinations (strict order needs ordering=key and is not combined with
# exactly_once), each with its tier consumer and, for a def handler, runs on or off. Chosen so
# that every value of every dimension meets every value of every other one (checked by
# ``test_every_dimension_meets_every_other``), and tiers x interleaved x handler kind, runs x
# interleaved x tiers, runs x ordering x interleaved all occur, in 14 combinations. Exactly-once
# keeps one consumer (its transactions commit one member's offsets): shared by construction.
_FEATURES = [
    # ordering, breaker, strict, exactly_once, tier_consumer, runs (def handler)
    ("key", True, False, False, "own", True),  # the defaults, with runs
    ("key", True, False, True, "shared", True),
    ("key", True, True, False, "shared", False),
    ("key", False, False, False, "own", False),
    ("key", False, False, True, "shared", True),
    ("key", False, True, False, "own", True),
    ("partition", True, False, False, "own", False),
    ("partition", True, False, True, "shared", False),
    ("partition", False, False, False, "own", True),
    ("partition", False, False, True, "shared", True),
    ("none", True, False, False, "own", False),
    ("none", True, False, True, "shared", False),
    ("none", False, False, False, "shared", True),
    ("none", False, False, True, "shared", True),
]
BATCH = 2  # records per batch call (max_in_flight 4: two calls at a time)
# Consumed batch of a worker whose tiers are on their own member: small, so that the due
# copies of an outage's backlog fill the tiers' share of it (all but a quarter) while main
# records arrive (issue 31 fault 9: the main member went unpolled). Shared: the default.
OWN_TIERS_BATCH = 8
# Per feature combination the two per-record handlers and one batch handler, def and async def
# in turn (every batch kind meets every ordering; CI size grows by half, not double), and
# interleaved batches or not in turn: def with even, async def with odd feature combinations,
# the batch handler every second pair (so batch def and batch async def each meet both). The
# defaults, key order with the breaker, at-least-once, tiers on their own member, with a def
# handler, run interleaved, with runs.
COMBOS = [
    Combo(
        ordering,
        breaker,
        strict,
        eos,
        kind,
        interleaved=(i + j + (i // 2 if j == 2 else 0)) % 2 == 0,
        tiers=tiers,
        runs=runs if kind == "sync" else None,
    )
    for i, (ordering, breaker, strict, eos, tiers, runs) in enumerate(_FEATURES)
    for j, kind in enumerate(("sync", "async", "batch-sync" if i % 2 == 0 else "batch-async"))
]


# ----------------------------------------------------------------------------- calls
@dataclass
class Call:
    member: int
    topic: str
    partition: int
    offset: int
    key: bytes | None
    retry: int
    origin: tuple[int, int]
    outcome: str
    start: float
    end: float = field(default=float("inf"))


class Service:
    """The business handler: per call an outcome drawn from the seed (stable per record,
    attempt and member), a short duration, and an outage switch."""

    def __init__(self, seed: int, kind: str) -> None:
        self.seed = seed
        self.kind = kind
        self.lock = threading.Lock()
        self.calls: list[Call] = []
        self.down = threading.Event()
        self.hangs = 0

    def _draw(self, origin: tuple[int, int], attempt: int, member: int) -> str:
        digest = hashlib.blake2b(
            f"{self.seed}/{origin}/{attempt}/{member % 2}".encode(), digest_size=4
        ).digest()
        n = int.from_bytes(digest, "big") % 100
        if n < 62:
            return "ok"
        if n < 82:
            return "retry"
        if n < 88:
            return "dead"
        if attempt > 0 or self.hangs >= 2:  # bounded: max_abandoned_handlers is 8
            return "ok"
        self.hangs += 1
        return "hang" if "async" not in self.kind or n < 94 else "ignore"

    def begin(self, m: Message, member: int) -> Call:
        origin = (m.original_partition, m.original_offset)
        assert origin[0] is not None and origin[1] is not None
        with self.lock:
            attempt = sum(1 for c in self.calls if c.origin == origin and c.member == member)
            outcome = "down" if self.down.is_set() else self._draw(origin, attempt, member)
            call = Call(
                member,
                m.topic,
                m.partition,
                m.offset,
                m.key,
                m.retry_number,
                origin,  # type: ignore[arg-type]
                outcome,
                time.perf_counter(),
            )
            self.calls.append(call)
        return call

    @staticmethod
    def cut_off(calls: list[Call]) -> None:
        """These calls' coroutines are being closed (``GeneratorExit``) without ever being
        resumed: their loop was abandoned and stopped, and the garbage collector finalises
        the pending task whenever it runs, possibly after the record ran again on the new
        loop. Such a call did not end then (it stopped when its loop did) and did not answer:
        its end stays unknown (excluded from the overlap checks, never counted handled).

        No lock: the collector runs finalisers on whichever thread allocates, possibly one
        holding ``self.lock`` already (``begin``), which would then wait for itself. Nothing
        else writes these calls' outcomes any more."""
        for c in calls:
            c.outcome = "cutoff"

    @staticmethod
    def ended(calls: list[Call]) -> None:
        end = time.perf_counter()
        for c in calls:
            if c.outcome != "cutoff":
                c.end = end

    def duration(self, call: Call) -> float:
        return (call.origin[1] % 4) / 1000

    def handler(self, member: int) -> Any:
        if self.kind.startswith("batch"):
            return self.batch_handler(member)
        if self.kind == "sync":

            def handle(m: Message) -> None:
                call = self.begin(m, member)
                try:
                    time.sleep(TIMEOUT_S * 2 if call.outcome == "hang" else self.duration(call))
                    _raise_for(call.outcome)
                finally:
                    call.end = time.perf_counter()

            return handle

        async def ahandle(m: Message) -> None:
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
                    await asyncio.sleep(self.duration(call))
                _raise_for(call.outcome)
            except GeneratorExit:
                self.cut_off([call])
                raise
            finally:
                self.ended([call])

        return ahandle

    def batch_handler(self, member: int) -> Any:
        """``handle_batch``: each record's outcome drawn as for single calls; a hang (or an
        ignored cancellation) of one record holds the whole call, so every record of it is a
        hang (it times out, and may overlap what runs after it)."""

        def begin_all(records: list[Message]) -> tuple[list[Call], str | None]:
            calls = [self.begin(m, member) for m in records]
            stuck = next((c.outcome for c in calls if c.outcome in ("hang", "ignore")), None)
            if stuck is not None:
                with self.lock:
                    for c in calls:
                        c.outcome = stuck
            return calls, stuck

        if self.kind == "batch-sync":

            def handle_batch(records: list[Message]) -> list[Any]:
                calls, stuck = begin_all(records)
                try:
                    time.sleep(TIMEOUT_S * 2 if stuck else max(map(self.duration, calls)))
                    return [_answer_for(c) for c in calls]
                finally:
                    self.ended(calls)

            return handle_batch

        async def ahandle_batch(records: list[Message]) -> list[Any]:
            calls, stuck = begin_all(records)
            try:
                if stuck == "hang":
                    await asyncio.sleep(TIMEOUT_S * 2)
                elif stuck == "ignore":
                    end = time.monotonic() + TIMEOUT_S * 2
                    while time.monotonic() < end:
                        try:
                            await asyncio.sleep(0.01)
                        except asyncio.CancelledError:
                            continue
                else:
                    await asyncio.sleep(max(map(self.duration, calls)))
                return [_answer_for(c) for c in calls]
            except GeneratorExit:
                self.cut_off(calls)
                raise
            finally:
                self.ended(calls)

        return ahandle_batch


def _answer_for(call: Call) -> Any:
    """A batch handler's per-record answer, in each of the forms it may take. A hung call
    that returns before the watchdog saw it (a busy machine) answers a failure: its records
    are routed then, never counted handled without a call that says so."""
    if call.outcome in ("retry", "down", "hang", "ignore"):
        return ConnectionError(call.outcome) if call.offset % 2 else retryd.Retry(call.outcome)
    if call.outcome == "dead":
        return NonRetryableError("poison") if call.offset % 2 else retryd.Dead("poison")
    return None if call.offset % 2 else True


def _raise_for(outcome: str) -> None:
    """A call's answer. A hung call (or one that ignored its cancellation) that returns
    before the watchdog gave up on it (a busy machine: the poll thread did not look in time)
    fails, as a batch call's does (``_answer_for``): returning, it would be a success the
    checks never count as handled, and its record would look lost."""
    if outcome in ("retry", "down", "hang", "ignore"):
        raise ConnectionError(outcome)
    if outcome == "dead":
        raise NonRetryableError("poison")


# how late acknowledgements arrive (seconds), changed by the machine while a run goes on
LATE_ACKS = [0.0]


# ----------------------------------------------------------------------------- the members
class MainShare:
    """Role ``all``'s two members (``tier_consumer = own``): every consume of the worker's
    ``SplitConsumer`` polls its main member and hands out at least a quarter of the batch
    (one record at least) of main records while the main member has them, however many due
    copies the tiers member holds (issue 31 fault 9). Noted on the poll thread, per call;
    checked by the machine. A call during which the main member's assignment or pauses
    changed (a rebalance runs inside its consume) is not judged."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.violations: list[str] = []

    def watch(self, member: int, split: SplitConsumer) -> None:
        main: Any = split.main
        tiers: Any = split.tiers
        consume = split.consume
        main.serves = []

        def noted(num_messages: int = 1, timeout: float = -1) -> list[Any]:
            before = (list(main.assigned), set(main.paused))
            ready = main.ready(num_messages)
            polls = len(main.serves)
            out = consume(num_messages, timeout)
            if before != (list(main.assigned), set(main.paused)) or num_messages < 2:
                return out
            from_main = sum(1 for m in out if m.topic() == MAIN)
            quarter = max(1, num_messages // 4)
            wrong = []
            if len(main.serves) == polls:
                wrong.append("main member not polled")
            if from_main < min(ready, quarter):
                wrong.append(f"main handed {from_main} of {ready} ready")
            if wrong:
                with self.lock:
                    self.violations.append(
                        f"member {member} consume({num_messages}): {wrong}; "
                        f"tiers ready now {tiers.ready(num_messages)}; batch "
                        f"{[(m.topic(), m.partition(), m.offset()) for m in out]}"
                    )
            return out

        split.consume = noted  # type: ignore[method-assign]

    def check(self, combo: Combo) -> None:
        with self.lock:
            violations = list(self.violations)
        assert not violations, f"{combo.name}: main member starved: {violations[:3]}"


# ----------------------------------------------------------------------------- the group
class Group:
    """Members that own every partition one after the other, as the coordinator hands them
    over (a revoke, a lost assignment, a clean restart)."""

    def __init__(self, combo: Combo, service: Service) -> None:
        self.combo = combo
        self.service = service
        self.root = Path(tempfile.mkdtemp(prefix="retryd-compose-"))
        self.broker = StubBroker(interleave=INTERLEAVE if combo.interleaved else 0)
        for topic in (MAIN, TIER):
            self.broker.create(topic, PARTITIONS)
        self.broker.create(FAILED, 1)
        self.broker.create(STATE, 3)
        self.members: list[tuple[Worker, threading.Thread]] = []
        self.errors: list[BaseException] = []
        self.transitions: list[tuple[int, str]] = []
        self.handovers: list[tuple[float, dict[tuple[str, int], int]]] = []
        self.tps = [(t, p) for t in (MAIN, TIER) for p in range(PARTITIONS)]
        self.produced = 0
        self.shares = MainShare()

    def start_member(self) -> None:
        index = len(self.members)
        c = self.combo
        settings = load_settings(
            bootstrap_servers="stub:9092",
            main_topics=MAIN,
            retry_sequence="50ms",
            group_id=GROUP,
            state_dir=self.root / f"m{index}",
            handler="python:tests.unit.test_engine_loop:unused",
            handler_timeout_s=TIMEOUT_S,
            tier_consumer=c.tiers,
            batch_size=OWN_TIERS_BATCH if c.tiers == "own" else 500,
            max_poll_interval_ms=30_000,
            session_timeout_ms=6_000,
            poll_timeout_s=0.02,
            max_in_flight=4,
            shutdown_timeout_s=5,
            failed_topic=FAILED,
            ordering=c.ordering,
            exactly_once=c.exactly_once,
            key_order="strict" if c.strict else "none",
            key_state_topic=STATE,
            circuit_breaker=c.breaker,
            circuit_min_failures=4,
            circuit_min_keys=2,
            circuit_window_calls=20,
            circuit_probe_s=0.05,
            circuit_probe_max_s=0.2,
        )
        broker = self.broker

        def consumer(conf: dict[str, Any]) -> Any:
            return broker.consumer({**conf, "stub.manual_assign": True})

        def producer(conf: dict[str, Any]) -> Any:
            p = LateAcksProducer(broker, conf, delay=lambda: LATE_ACKS[0])
            broker.producers.append(p)
            return p

        func = self.service.handler(index)
        if c.kind.startswith("batch"):
            handler: Any = PythonBatchHandler(func, timeout_s=TIMEOUT_S, max_batch=BATCH)
        else:
            handler = PythonHandler(func, timeout_s=TIMEOUT_S)
        worker = build_worker(
            settings,
            handler,
            drain_grace_s=0.1,
            consumer_factory=consumer,
            producer_factory=producer,
            reader_factory=lambda conf: StubReader(broker, conf),
        )
        # exactly-once keeps one consumer whatever tier_consumer says
        reads = worker.parts.consumer
        assert isinstance(reads, SplitConsumer) == (c.tiers == "own"), f"{c.name}: {reads!r}"
        if c.runs is not None:
            # runs on: whatever the calls take (the thread pool's measurement never says
            # fast for 0-3 ms calls), run through to their end or first failure; off: never
            worker.scheduler.pace = (
                RunPace(fast=True, slow_call_s=math.inf) if c.runs else RunPace(fast=False)
            )
        stub = members(worker)
        if isinstance(reads, SplitConsumer):
            self.shares.watch(index, reads)

        def target() -> None:
            try:
                worker.run()
            except BaseException as exc:  # surfaced by the checks
                self.errors.append(exc)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        stub.trigger_assign(list(self.tps))
        self.members.append((worker, thread))

    def handover(self, how: str) -> None:
        worker, thread = self.members[-1]
        stub = members(worker)
        if how == "revoke":
            stub.trigger_revoke(list(self.tps))
            wait_for(lambda: not stub.assigned, 60, interval=0.005, what="the revoke")
        elif how == "lost":
            stub.trigger_lost(list(self.tps))
            wait_for(lambda: not stub.assigned, 60, interval=0.005, what="the loss")
        else:
            worker.stop()
            thread.join(30)
            assert not thread.is_alive(), "a member did not stop"
        committed = {tp: self.broker.committed_offset(GROUP, *tp) or 0 for tp in self.tps}
        self.handovers.append((time.perf_counter(), committed))
        self.transitions.append((len(self.members), how))
        self.start_member()

    def produce(self, n: int, keys: int) -> None:
        # interleaved: an arrival is fetched at once, as one batch (the interleaving is inside
        # a batch)
        with self.broker.lock if self.combo.interleaved else contextlib.nullcontext():
            self._produce(n, keys)

    def _produce(self, n: int, keys: int) -> None:
        for _ in range(n):
            i = self.produced
            self.produced += 1
            k = i % keys
            # a key lives on one partition, as with Kafka's partitioner (strict order's chain
            # entries are keyed by the origin offset within the key's partition)
            self.broker.append(MAIN, b"k%d" % k, b"v%d" % i, partition=k % PARTITIONS)

    def finished(self) -> bool:
        """Every partition committed past its last record a consumer is handed (aborted
        copies of exactly-once transactions never are: nothing settles them)."""
        for topic in (MAIN, TIER):
            for p in range(PARTITIONS):
                log = self.broker.logs[topic][p]
                end = len(log)
                while end and log[end - 1].aborted:
                    end -= 1
                if (self.broker.committed_offset(GROUP, topic, p) or 0) < end:
                    return False
        return True

    def stop_all(self) -> None:
        for worker, _ in self.members:
            worker.stop()
        for _, thread in self.members:
            thread.join(30)


# ----------------------------------------------------------------------------- checks
# Calls a watchdog gave up on (their timeout result given, their thread or loop abandoned):
# (topic, partition, offset, when). A call drawn "ok" gets there too on a busy machine, when a
# 3 ms sleep outlasts the 0.2 s timeout; what runs after it may then overlap its abandoned
# thread, as it may overlap a hung call's (README: Python cannot stop a thread).
EXPIRED: list[tuple[str, int, int, float]] = []


def record_expiries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note every call the engine times out, at its one owner (``Lifecycle.expire``)."""
    EXPIRED.clear()
    expire = Lifecycle.expire

    def noted(self: Lifecycle, w: Any, attempt: int, result: Any) -> bool:
        if not expire(self, w, attempt, result):
            return False
        EXPIRED.append((w.msg.topic, w.msg.partition, w.msg.offset, time.perf_counter()))
        return True

    monkeypatch.setattr(Lifecycle, "expire", noted)


def _clean(c: Call) -> bool:
    return c.outcome not in ("hang", "ignore") and c.end != float("inf")


def _not_abandoned(calls: list[Call]) -> list[Call]:
    """The calls that ran to their end as far as the engine knows: neither hung, cut off
    nor timed out while they ran."""
    expired: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for topic, partition, offset, at in list(EXPIRED):
        expired[(topic, partition, offset)].append(at)
    return [
        c
        for c in calls
        if _clean(c)
        and not any(
            c.start <= at <= c.end for at in expired.get((c.topic, c.partition, c.offset), ())
        )
    ]


def check_order(combo: Combo, calls: list[Call], group: Group) -> None:
    """No overlap or disorder of one ordering key, on a member and across a hand-over."""
    if combo.ordering == "none":
        return
    by_lock: dict[tuple[int, str, int, bytes | None], list[Call]] = defaultdict(list)
    for c in calls:
        key = c.key if combo.ordering == "key" else None
        by_lock[(c.member, c.topic, c.partition, key)].append(c)
    for lock, items in by_lock.items():
        items.sort(key=lambda c: c.start)
        # strict key order orders a key's tier copies by their record's origin offset: a copy
        # blocked behind its key's head waits (set aside) while the head's later retry runs
        strict_tier = combo.strict and lock[1] == TIER
        offsets = [c.origin[1] if strict_tier else c.offset for c in items]
        assert offsets == sorted(offsets), f"{combo.name}: {lock} started out of order {offsets}"
        good = _not_abandoned(items)
        for a, b in itertools.pairwise(good):
            assert b.start >= a.end, f"{combo.name}: overlap on {lock}: {a} {b}"
    for new, how in group.transitions:
        if how == "lost":
            continue
        old = _not_abandoned([c for c in calls if c.member == new - 1])
        fresh = _not_abandoned([c for c in calls if c.member == new])
        for a in old:
            for b in fresh:
                same = (a.topic, a.partition) == (b.topic, b.partition) and (
                    combo.ordering == "partition" or a.key == b.key
                )
                if same:
                    assert b.start >= a.end, f"{combo.name}: old and new owner overlap {a} {b}"


def check_outcomes(combo: Combo, group: Group) -> None:
    broker = group.broker
    calls = group.service.calls
    assert not group.errors, f"{combo.name}: a worker exited: {group.errors}"
    lost_any = any(how == "lost" for _, how in group.transitions)
    handled = {c.origin for c in calls if c.outcome == "ok" and c.end != float("inf")}
    dead: set[tuple[int, int]] = set()
    copies: dict[tuple[str, int, int, bytes | None], int] = defaultdict(int)
    for topic in (FAILED, TIER):
        for r in broker.records(topic):
            if r.aborted:
                continue  # a read_committed reader never sees it
            origin = (
                int(h.header_value(r.headers, h.ORIGINAL_PARTITION) or b"-1"),
                int(h.header_value(r.headers, h.ORIGINAL_OFFSET) or b"-1"),
            )
            if h.header_value(r.headers, ko.PARKED) is None:
                copies[(topic, *origin, h.header_value(r.headers, h.RETRY_NUMBER))] += 1
            if topic == FAILED:
                dead.add(origin)
    every = {(r.partition, r.offset) for r in broker.records(MAIN)}
    missing = sorted(every - handled - dead)
    assert not missing, (
        f"{combo.name}: lost {missing[:10]}; calls: "
        f"{[c for c in calls if c.origin in missing[:2]]}; copies: "
        f"{[(t, o, n) for (t, *o, n) in copies if tuple(o) in missing[:2]]}; "
        f"transitions: {group.transitions}; handovers: {group.handovers}"
    )
    members_of: dict[tuple[str, int, int], set[int]] = defaultdict(set)
    for c in calls:
        members_of[(c.topic, c.partition, c.offset)].add(c.member)
    redone = {c.origin for c in calls if len(members_of[(c.topic, c.partition, c.offset)]) > 1}
    both = sorted((handled & dead) - redone)
    assert not both or lost_any, (
        f"{combo.name}: in two places without a redo: {both[:10]}; calls: "
        f"{[c for c in calls if c.origin in both[:2]]}; transitions: {group.transitions}"
    )
    if combo.exactly_once:
        twice = [k for k, n in copies.items() if n > 1]
        assert not twice, f"{combo.name}: exactly-once copies seen twice: {twice[:5]}"
    # the old owner never starts a call once it let go of its partitions
    for k, (at, _) in enumerate(group.handovers):
        late = [c for c in calls if c.member == k and c.start > at]
        assert not late, f"{combo.name}: member {k} kept handling after it let go: {late[:3]}"


def check_strict(combo: Combo, group: Group) -> None:
    """Per key, first successes in offset order; every chain entry removed."""
    if not combo.strict:
        return
    first: dict[tuple[int, int], Call] = {}
    for c in sorted(group.service.calls, key=lambda c: c.end):
        if c.outcome == "ok" and c.end != float("inf") and c.origin not in first:
            first[c.origin] = c
    by_key: dict[tuple[int, bytes | None], list[Call]] = defaultdict(list)
    for c in first.values():
        by_key[(c.origin[0], c.key)].append(c)
    lost_any = any(how == "lost" for _, how in group.transitions)
    for key, items in by_key.items():
        items.sort(key=lambda c: c.end)
        offsets = [c.origin[1] for c in items]
        if lost_any:
            continue  # a lost member's late writes are at-least-once's own case
        assert offsets == sorted(offsets), (
            f"{combo.name}: key {key} succeeded as {offsets}; calls of the key: "
            f"{[(c.member, c.topic, c.offset, c.origin[1], c.retry, c.outcome, round(c.start % 100, 4), round(c.end % 100, 4)) for c in sorted(group.service.calls, key=lambda c: c.start) if (c.origin[0], c.key) == key]}"  # noqa: E501
        )
    entries: dict[bytes, bytes | None] = {}
    for rec in group.broker.records(STATE):
        assert rec.key is not None
        entries[rec.key] = rec.value
    live = {k: v for k, v in entries.items() if v is not None}
    assert not live, f"{combo.name}: chain entries left: {len(live)}"


def diagnosis(worker: Worker) -> str:
    """Where a member stands: circuit, lanes, and each partition's unsettled records."""
    sched = worker.scheduler
    parts = {
        repr(st): [(w.offset, w.stage.value, w.attempt) for w in list(st.pending)[:6]]
        for st in list(worker.book.parts.values())
    }
    return (
        f"circuit={worker.circuit.snapshot().state.value} held={worker.circuit.held} "
        f"gate_open={sched.gate_open} probe={sched.probe} ready={list(sched.ready)[:6]} "
        f"decisions={list(sched.decisions)[:6]} tails={list(sched._tails.values())[:6]} "
        f"running={worker.pool.running()} completions={len(worker.pool.completions)} "
        f"partitions={parts}"
    )


# ----------------------------------------------------------------------------- the machine
class ComposedEngine(RuleBasedStateMachine):
    combo: Combo = COMBOS[0]

    def __init__(self) -> None:
        super().__init__()
        self.group: Group | None = None
        self.outage_until = 0.0

    @initialize(seed=st.integers(0, 2**16))
    def start(self, seed: int) -> None:
        self.service = Service(seed, self.combo.kind)
        self.group = Group(self.combo, self.service)
        self.group.produce(12, 3)
        self.group.start_member()

    @rule(n=st.integers(1, 12), keys=st.integers(1, 4))
    def records_arrive(self, n: int, keys: int) -> None:
        assert self.group is not None
        self.group.produce(n, keys)

    @rule(how=st.sampled_from(["revoke", "lost", "restart"]))
    def hand_over(self, how: str) -> None:
        assert self.group is not None
        self.group.handover(how)

    @rule(n=st.integers(6, 18))
    def tier_backlog(self, n: int) -> None:
        """A tier deep with due copies while main records arrive (issue 31 fault 9): ``n``
        records fail in an outage and their copies go to the tier (unless the breaker holds
        them), main records arrive, and a new member (a revoke) finds the copies all due at
        once beside them."""
        group = self.group
        assert group is not None
        worker = group.members[-1][0]
        was_down = self.service.down.is_set()
        self.service.down.set()
        copies = len(group.broker.records(TIER))
        group.produce(n, 4)
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: len(group.broker.records(TIER)) >= copies + n or not worker.circuit.closed,
                2.0,
                interval=0.005,
            )
        if not was_down:
            self.service.down.clear()
        group.produce(12, 4)
        group.handover("revoke")

    @rule()
    def outage(self) -> None:
        """The business service fails every call until a later step (or the end) ends it."""
        if self.service.down.is_set():
            self.service.down.clear()
        else:
            self.service.down.set()

    @rule(delay=st.sampled_from([0.0, 0.005, 0.03]))
    def acknowledgements_late(self, delay: float) -> None:
        LATE_ACKS[0] = delay

    @rule()
    def time_passes(self) -> None:
        """Let the members work a little between faults (a bounded wait on the calls)."""
        seen = len(self.service.calls)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: len(self.service.calls) > seen, 0.3, interval=0.005)

    @invariant()
    def never_out_of_order(self) -> None:
        if self.group is not None:
            with self.service.lock:
                calls = list(self.service.calls)
            check_order(self.combo, calls, self.group)

    @invariant()
    def main_member_served(self) -> None:
        if self.group is not None:
            self.group.shares.check(self.combo)

    def teardown(self) -> None:
        group = self.group
        if group is None:
            return
        try:
            self.service.down.clear()
            LATE_ACKS[0] = 0.0
            try:
                wait_for(group.finished, SETTLE_S, interval=0.01, what="every offset committed")
            except AssertionError:
                raise AssertionError(
                    f"{self.combo.name}: no progress within {SETTLE_S}s once the faults "
                    f"stopped; transitions={group.transitions} "
                    f"committed={[group.broker.committed_offset(GROUP, *tp) for tp in group.tps]}"
                    f" ends={[len(group.broker.logs[t][p]) for t, p in group.tps]}; "
                    f"worker errors: {group.errors}; "
                    f"last member: {diagnosis(group.members[-1][0])}"
                ) from None
            if self.combo.strict:
                wait_for(
                    lambda: all(
                        v is None
                        for v in {r.key: r.value for r in group.broker.records(STATE)}.values()
                    ),
                    SETTLE_S,
                    what="every chain entry removed",
                )
            group.stop_all()
            check_order(self.combo, list(self.service.calls), group)
            check_outcomes(self.combo, group)
            group.shares.check(self.combo)
            check_strict(self.combo, group)
        finally:
            LATE_ACKS[0] = 0.0
            group.stop_all()


@pytest.mark.parametrize("combo", COMBOS, ids=[c.name for c in COMBOS])
def test_every_feature_keeps_every_guarantee(combo: Combo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_pool, "ASYNC_CANCEL_GRACE_S", 0.1)
    if combo.runs:
        monkeypatch.setattr(runs_module, "RUNS_BACKOFF", RUNS_BACKOFF)
    record_expiries(monkeypatch)
    machine = type(f"Composed_{combo.name}", (ComposedEngine,), {"combo": combo})
    run = machine.TestCase
    run.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=os.environ.get("RETRYD_PROPERTY_RANDOM") is None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate]
        + ([Phase.shrink] if os.environ.get("RETRYD_PROPERTY_SHRINK") else []),
    )
    run().runTest()


_DOMAINS: dict[str, tuple[Any, ...]] = {
    "ordering": ("key", "partition", "none"),
    "breaker": (True, False),
    "strict": (True, False),
    "exactly_once": (True, False),
    "kind": ("sync", "async", "batch-sync", "batch-async"),
    "interleaved": (True, False),
    "tiers": ("own", "shared"),
    "runs": (True, False),  # def handlers only
}


def _allowed(values: dict[str, Any]) -> bool:
    """Strict order needs ordering=key, not exactly-once; exactly-once keeps one consumer;
    runs are a def handler's."""
    if values.get("strict") and (
        values.get("ordering", "key") != "key" or values.get("exactly_once")
    ):
        return False
    if values.get("tiers") == "own" and values.get("exactly_once"):
        return False
    return not ("runs" in values and values.get("kind", "sync") != "sync")


def test_every_dimension_meets_every_other() -> None:
    """The combinations are a pairwise cover: every allowed pair of values of two dimensions
    runs in at least one combination (and the ids are unique and name every dimension)."""
    assert len({c.name for c in COMBOS}) == len(COMBOS)
    missing = []
    for a, b in itertools.combinations(_DOMAINS, 2):
        seen = {
            (getattr(c, a), getattr(c, b))
            for c in COMBOS
            if getattr(c, a) is not None and getattr(c, b) is not None
        }
        for pair in itertools.product(_DOMAINS[a], _DOMAINS[b]):
            if _allowed({a: pair[0], b: pair[1]}) and pair not in seen:
                missing.append((a, pair[0], b, pair[1]))
    assert not missing, missing
    assert all((c.runs is None) == (c.kind != "sync") for c in COMBOS)
    assert all(c.tiers == "shared" for c in COMBOS if c.exactly_once)


def _checked_alone() -> tuple[Combo, Group]:
    """Key order on one member that never handed over: what the planted calls are checked in."""
    group = Group.__new__(Group)
    group.transitions = []
    return Combo("key", True, False, False, "sync"), group


def test_the_order_check_sees_a_planted_overlap() -> None:
    """The checks are not vacuous: two overlapping calls of one key on one member fail them."""
    combo, group = _checked_alone()
    calls = [
        Call(0, MAIN, 0, 0, b"k0", 0, (0, 0), "ok", 0.0, 2.0),
        Call(0, MAIN, 0, 1, b"k0", 0, (0, 1), "ok", 1.0, 3.0),
    ]
    with pytest.raises(AssertionError, match="overlap"):
        check_order(combo, calls, group)
    held_again = [
        Call(0, MAIN, 0, 0, b"k0", 0, (0, 0), "down", 0.0, 1.0),
        Call(0, MAIN, 0, 1, b"k0", 0, (0, 1), "ok", 1.0, 2.0),
        Call(0, MAIN, 0, 0, b"k0", 0, (0, 0), "ok", 2.0, 3.0),  # item 1: ran after a1
    ]
    with pytest.raises(AssertionError, match="out of order"):
        check_order(combo, held_again, group)


@pytest.mark.parametrize("kind", ["async", "batch-async"])
def test_a_call_cut_off_with_its_loop_has_no_end(kind: str) -> None:
    """A call frozen in an abandoned (stopped) loop is finalised by the garbage collector,
    whenever it runs: its ``finally`` then is no end of the call. Counted as one, the record
    run again on the new loop meanwhile looked like a second call beside the first."""
    service = Service(0, kind)
    # offset 3: a call that sleeps at least 3 ms, still asleep when its loop stops
    m = SimpleNamespace(
        topic=MAIN, partition=0, offset=3, key=b"k", retry_number=0,
        original_partition=0, original_offset=3,
    )  # fmt: skip
    func = service.handler(0)
    loop = asyncio.new_event_loop()
    task = loop.create_task(func([m] if kind.startswith("batch") else m))
    loop.run_until_complete(asyncio.sleep(0))  # the call starts, then waits in its sleep
    loop.close()  # stopped for good with the call pending, as an abandoned loop is
    [call] = service.calls
    assert call.end == float("inf")
    outcome = call.outcome
    del task
    with service.lock:  # as in ``begin``: a finaliser may run on a thread holding it
        gc.collect()  # the pending task is finalised: GeneratorExit runs the call's finally
    assert call.outcome == "cutoff", outcome
    assert call.end == float("inf") and not _clean(call)


def test_the_order_check_spares_only_a_call_the_engine_timed_out() -> None:
    """A call the engine gave up on (timed out while it ran) may overlap what runs after it;
    the same overlap with no expiry inside the first call still fails."""
    combo, group = _checked_alone()
    calls = [
        Call(0, MAIN, 0, 0, b"k0", 0, (0, 0), "ok", 0.0, 2.0),
        Call(0, MAIN, 0, 1, b"k0", 0, (0, 1), "ok", 1.5, 3.0),
    ]
    EXPIRED[:] = [(MAIN, 0, 0, 1.2)]
    try:
        check_order(combo, calls, group)
        EXPIRED[:] = [(MAIN, 0, 0, 2.5)]  # after the call ended: no excuse
        with pytest.raises(AssertionError, match="overlap"):
            check_order(combo, calls, group)
    finally:
        EXPIRED.clear()
