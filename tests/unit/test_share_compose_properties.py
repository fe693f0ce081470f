"""Share mode keeps every guarantee, together: a stateful property test of the real share worker
(``retryd.share``) on the fake share consumer (``tests.unit.fake_share``) and the stub producer,
over the feature combinations (issue 31: the combination test gains ``consumer_mode = share``).

Combinations (one pytest item each, every one of the 16): circuit breaker {on, off} x handler
{def, async def} x first delay {none, ``delay=400ms``} x ``share.delivery.count.limit``
{default 5, small 2}. The worker is composed as ``retryd.share.build`` composes it
(``built_share_worker``: the call wrapper, the lock and first-delay checks, the breaker from the
settings), on a group lock of ``LOCK_S``. In each item, Hypothesis drives a
``RuleBasedStateMachine``: records arrive (fresh, or old enough to be due already), each with a
script of what its successive calls do; a step waits for everything to drain and checks. Per
call: success, a retryable failure, a non-retryable one, a call slow past its timeout (``def``:
its thread hangs, then answers late with ``LateAnswer`` once the record runs again or the
example ends; ``async def``: cancelled at its timeout), an ``async def`` that swallows its
cancellation (its event loop is abandoned; for ``def`` it is a slow call), and a crash of the
worker holding the record (the fake forgets the acquisition: the dead worker's acknowledgement
is refused, and the broker hands the record out again once its lock runs out, a delivery
used).

Invariants, once everything drained (after each drain step and at the end):

- **one terminal place, nothing lost**: every record ACCEPTed exactly once, with at most one
  routed copy: none after a success, a tier copy (its retryable failure, a ``timeout``,
  ``not_due``, ``circuit_open``) or a ``failed_topic`` copy with its reason (its
  non-retryable failure; ``exhausted``/``delivery_count_limit`` on its last delivery). The
  broker archives nothing: retryd dead-letters a record on its last delivery instead (README,
  "Share groups"); no acknowledgement comes after its lock (``refused``);
- **the last delivery is never called** (limit > 1);
- **never early**: no call before the record's timestamp + the first delay, and a ``not_due``
  copy is due no earlier;
- **no overlap**: a record's call starts only once its earlier calls ended, unless an earlier
  one had outlived its timeout (abandoned there: Python cannot stop a thread) or was frozen on
  an event loop that no longer runs (cut off with an abandoned loop: it can never resume);
- **no late answer settles a newer attempt**: ``LateAnswer`` is never a copy's error class;
- **progress**: everything drains within ``DRAIN_S``; ``stop()`` returns; ``run`` raised
  nothing.

``RETRYD_SHARE_COMPOSE_EXAMPLES`` sets the examples per combination, ``RETRYD_SHARE_COMPOSE_STEPS``
the steps per example; ``RETRYD_PROPERTY_RANDOM`` draws new examples (derandomized otherwise),
``RETRYD_PROPERTY_SHRINK`` shrinks a failure (slow: every example runs in real time).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from retryd.config import load_settings
from retryd.errors import NonRetryableError
from retryd.handlers.base import Message
from retryd.handlers.python_handler import PythonHandler
from retryd.policy import headers as h
from retryd.policy.classify import TIMEOUT_CLASS, error_class_name
from retryd.share.build import POLL_ROUNDS
from retryd.share.delay import NOT_DUE
from retryd.share.gate import CIRCUIT_OPEN
from retryd.share.routes import LIMIT_CLASS
from tests.support import wait_for
from tests.unit.fake_share import MAIN, FakeShareConsumer, Running, built_share_worker

TIMEOUT_S = 0.2  # handler_timeout_s
LOCK_S = 3.0  # the group's record lock: above delay + timeout + the 2 s margin (start-up check)
DELAY_MS = 400
DEFAULT_LIMIT, SMALL_LIMIT = 5, 2
MAX_IN_FLIGHT = 2
WORK_S = 0.02  # what an async call awaits before it answers (so an abandoned loop cuts some off)
OLD_MS = 5_000  # an old record's age: due at once, even with the first delay
EXAMPLES = int(os.environ.get("RETRYD_SHARE_COMPOSE_EXAMPLES", "2"))
STEPS = int(os.environ.get("RETRYD_SHARE_COMPOSE_STEPS", "4"))
DRAIN_S = 45.0  # progress bound of one drain (crashes wait out locks, up to limit - 1 each)
STOP_S = 10.0
TIER = "retry_5m"
FAILED = "failed_topic"

OUTCOMES = ("ok", "retry", "fatal", "slow", "swallow", "crash")


class Failure(Exception):
    """A retryable failure of the business service."""


class Fatal(NonRetryableError):
    """A non-retryable failure."""


class LateAnswer(NonRetryableError):
    """What a call abandoned at its timeout answers, late: it must never settle a record."""


RETRY_CLASS = error_class_name(Failure())
FATAL_CLASS = error_class_name(Fatal())
LATE_CLASS = error_class_name(LateAnswer())


class Combo(NamedTuple):
    breaker: bool
    kind: str  # def | async
    delay: bool
    small_limit: bool

    @property
    def name(self) -> str:
        return (
            f"{'breaker' if self.breaker else 'nobreaker'}-{self.kind}-"
            f"{'delay' if self.delay else 'nodelay'}-"
            f"limit{SMALL_LIMIT if self.small_limit else DEFAULT_LIMIT}"
        )

    @property
    def limit(self) -> int:
        return SMALL_LIMIT if self.small_limit else DEFAULT_LIMIT


COMBOS = [
    Combo(*c)
    for c in itertools.product((True, False), ("def", "async"), (False, True), (False, True))
]


@dataclass
class Call:
    offset: int
    what: str
    count: int  # the delivery it belongs to
    wall: float  # time.time() at its start
    start: float  # monotonic
    asked: float  # monotonic: no later than the worker started it (its timeout runs from then)
    loop: asyncio.AbstractEventLoop | None
    end: float | None = None  # None: abandoned (hung, or frozen on a stopped loop)


class Service:
    """The business service: each record's calls follow its script (then succeed); every call
    is recorded, and a call that starts while an earlier one of its record may still run is a
    violation unless that one had outlived its timeout or its loop no longer runs."""

    def __init__(self, consumer: FakeShareConsumer, kind: str) -> None:
        self.consumer = consumer
        self.kind = kind
        self.cond = threading.Condition()
        self.scripts: dict[int, list[str]] = {}
        self.calls: dict[int, list[Call]] = defaultdict(list)
        self.violations: list[str] = []
        self.released = False  # the example ends: hung calls answer (late) and end
        self.asked: dict[int, list[float]] = defaultdict(list)  # calls asked for, not begun

    def ask(self, offset: int | None) -> None:
        """The worker asks for a call of ``offset`` (a spy on ``Calls.start``)."""
        with self.cond:
            self.asked[offset or 0].append(time.monotonic())

    def begin(self, m: Message, loop: asyncio.AbstractEventLoop | None) -> Call:
        offset = m.offset
        assert offset is not None
        count = self.consumer.delivery_count(offset)
        now = time.monotonic()
        with self.cond:
            past = self.calls[offset]
            script = self.scripts[offset]
            what = script[len(past)] if len(past) < len(script) else "ok"
            if what == "swallow" and self.kind == "def":
                what = "slow"
            # the oldest call asked for and not begun: no later than this call's own asking
            # (one asked for may never begin: frozen on an abandoned loop before its start)
            waiting = self.asked[offset]
            if not waiting:
                self.violations.append(f"offset {offset}: called without the worker asking")
            asked = waiting.pop(0) if waiting else now
            call = Call(offset, what, count, time.time(), now, asked, loop)
            for prev in past:
                if prev.end is not None and prev.end <= now:
                    continue
                if now >= prev.asked + TIMEOUT_S:
                    continue  # may have been abandoned at its timeout (a thread runs on)
                if prev.loop is not None and not prev.loop.is_running():
                    continue  # frozen on an abandoned loop that has stopped: never resumes
                self.violations.append(
                    f"offset {offset}: call {len(past) + 1} ({what}, delivery {count}) started "
                    f"{now - prev.asked:.3f}s after call {past.index(prev) + 1} ({prev.what}, "
                    f"delivery {prev.count}), which was still running within its timeout"
                )
            past.append(call)
            self.cond.notify_all()
        if what == "crash" and not self.consumer.crash(offset):  # its worker died: lock runs out
            call.what = "ok"  # (not acquired any more: nothing to forget, an ordinary call)
        return call

    def ended(self, call: Call) -> None:
        with self.cond:
            call.end = time.monotonic()

    def _newer(self, call: Call) -> bool:
        return self.released or self.calls[call.offset][-1] is not call

    def release(self) -> None:
        with self.cond:
            self.released = True
            self.cond.notify_all()

    @staticmethod
    def _answer(what: str) -> None:
        if what == "retry":
            raise Failure("the service failed")
        if what == "fatal":
            raise Fatal("a bad record")

    def handle(self, m: Message) -> None:
        call = self.begin(m, None)
        if call.what == "slow":  # hangs past its timeout; answers once its record runs again
            with self.cond:
                self.cond.wait_for(lambda: self._newer(call), DRAIN_S * 2)
            self.ended(call)
            raise LateAnswer("answering after my timeout")
        self.ended(call)
        self._answer(call.what)

    async def ahandle(self, m: Message) -> None:
        call = self.begin(m, asyncio.get_running_loop())
        try:
            if call.what == "slow":
                await asyncio.sleep(3600)  # cancelled at its timeout
            elif call.what == "swallow":
                while True:
                    try:
                        await asyncio.sleep(3600)
                    except asyncio.CancelledError:
                        continue  # business code that swallows its cancellation
            else:
                await asyncio.sleep(WORK_S)
        except asyncio.CancelledError:
            self.ended(call)
            raise
        # (GeneratorExit, when a frozen call is collected with its loop: no end of the call)
        self.ended(call)
        self._answer(call.what)


SCRIPTS = st.lists(st.sampled_from(OUTCOMES), max_size=3).map(
    # at most one crash per record: each costs a whole lock (LOCK_S) of waiting
    lambda s: [w for i, w in enumerate(s) if w != "crash" or "crash" not in s[:i]]
)
RECORDS = st.lists(st.tuples(st.booleans(), SCRIPTS), min_size=1, max_size=4)


class ShareCompose(RuleBasedStateMachine):
    combo: Combo = COMBOS[0]

    def __init__(self) -> None:
        super().__init__()
        self.running: Running | None = None
        self.timestamps: dict[int, int] = {}

    @initialize(records=RECORDS)
    def start(self, records: list[tuple[bool, list[str]]]) -> None:
        combo = self.combo
        self.dir = Path(tempfile.mkdtemp(prefix="share-compose-"))
        self.consumer = FakeShareConsumer(
            lock_s=LOCK_S, limit=combo.limit, max_records=MAX_IN_FLIGHT * POLL_ROUNDS
        )
        self.service = Service(self.consumer, combo.kind)
        fn = self.service.ahandle if combo.kind == "async" else self.service.handle
        self.settings = load_settings(
            consumer_mode="share",
            ordering="none",
            group_id="g",
            main_topics=[MAIN],
            retry_sequence=f"5m, delay={DELAY_MS}ms" if combo.delay else "5m",
            handler_timeout_s=TIMEOUT_S,
            max_in_flight=MAX_IN_FLIGHT,
            max_abandoned_handlers=1000,  # hung sync calls end when their record runs again
            poll_timeout_s=0.05,
            state_dir=self.dir,
            circuit_breaker=combo.breaker,
            # an outage is two calls of which one failed: the window trips often, the confirming
            # call reruns a record in place, probes come quickly
            circuit_window_calls=2,
            circuit_min_failures=1,
            circuit_min_keys=1,
            circuit_probe_s=0.3,
            circuit_probe_max_s=0.6,
        )
        handler = PythonHandler(fn, timeout_s=TIMEOUT_S)
        self.worker, self.broker = built_share_worker(handler, self.consumer, self.settings)
        calls, service = self.worker.calls, self.service
        start = calls.start

        def asking(token: Any, message: Message) -> int:
            service.ask(message.offset)
            return start(token, message)

        calls.start = asking  # type: ignore[method-assign]  # a spy: when each call was asked
        self.running = Running(self.worker)
        self.arrive(records)

    @rule(records=RECORDS)
    def arrive(self, records: list[tuple[bool, list[str]]]) -> None:
        for old, script in records:
            offset = len(self.consumer.log)
            ts = int(time.time() * 1000) - (OLD_MS if old else 0)
            with self.service.cond:
                self.service.scripts[offset] = script
            self.timestamps[offset] = ts
            assert self.consumer.add(f"k{offset}".encode(), b"{}", ts) == offset

    @rule()
    def drain(self) -> None:
        self._drain()
        self._check()

    def _drained(self) -> bool:
        ends = set(self.consumer.accepted()) | set(self.consumer.archived)
        return all(o in ends for o in range(len(self.consumer.log)))

    def _drain(self) -> None:
        assert self.running is not None
        try:
            wait_for(self._drained, DRAIN_S, interval=0.01, what="every record settled")
        except AssertionError:
            raise AssertionError(
                f"{self.combo.name}: no progress within {DRAIN_S}s: {self._state()}"
            ) from None
        assert self.running.failure is None, self.running.failure

    def _state(self) -> str:
        c = self.consumer
        probe = getattr(self.worker.gate.probe, "view", None)
        with c.cond:
            return (
                f"accepted={c.accepted()} archived={c.archived} inflight={sorted(c.inflight)} "
                f"ghosts={sorted(c.ghosts)} available={list(c.available)} counts={c.counts} "
                f"circuit={self.worker.gate.state.value} probe={probe} "
                f"scripts={self.service.scripts} calls={self._calls()}"
            )

    def _calls(self) -> dict[int, list[tuple[str, int, bool]]]:
        with self.service.cond:
            return {
                o: [(c.what, c.count, c.end is not None) for c in calls]
                for o, calls in self.service.calls.items()
            }

    def _check(self) -> None:
        problems = check_places(
            self.combo, self.consumer, self.broker, self.service, self.timestamps
        )
        assert not problems, f"{self.combo.name}:\n" + "\n".join(problems) + f"\n{self._state()}"

    def teardown(self) -> None:
        running = self.running
        if running is None:
            return
        try:
            self._drain()
            self._check()
            stopped = running.stop(STOP_S)
            assert stopped, f"{self.combo.name}: stop() did not return within {STOP_S}s"
            assert running.failure is None, running.failure
            self._check()  # nothing moved while it stopped
        finally:
            self.service.release()
            running.stop(STOP_S)
            shutil.rmtree(self.dir, ignore_errors=True)


def check_places(
    combo: Combo,
    consumer: FakeShareConsumer,
    broker: Any,
    service: Service,
    timestamps: dict[int, int],
) -> list[str]:
    """Every invariant of the module docstring that a drained example must hold."""
    problems: list[str] = []
    accepted = Counter(consumer.accepted())
    copies: dict[int, list[tuple[str, dict[str, bytes | None]]]] = defaultdict(list)
    for topic in (TIER, FAILED):
        for rec in broker.records(topic):
            hd = dict(rec.headers)
            copies[int(hd[h.ORIGINAL_OFFSET] or b"-1")].append((topic, hd))
    with service.cond:
        calls = {o: list(cs) for o, cs in service.calls.items()}
        never_begun = {o for o, asked in service.asked.items() if asked}
        problems += service.violations
    strays = sorted(set(copies) - set(range(len(consumer.log))))
    if strays:
        problems.append(f"copies of no record: {strays}")
    if consumer.archived:
        problems.append(
            f"archived by the broker (retryd dead-letters instead): {consumer.archived}"
        )
    if consumer.refused:
        problems.append(f"acknowledged after their lock ran out: {consumer.refused}")
    for offset in range(len(consumer.log)):
        mine = calls.get(offset, [])
        whats = {c.what for c in mine}
        due_ms = timestamps[offset] + (DELAY_MS if combo.delay else 0)
        for c in mine:
            if c.wall * 1000 < due_ms:
                problems.append(f"offset {offset}: called {due_ms - c.wall * 1000:.1f} ms early")
            if combo.limit > 1 and c.count >= combo.limit:
                problems.append(f"offset {offset}: called on its last delivery ({c.count})")
        if offset in consumer.archived:
            continue
        if accepted[offset] != 1:
            problems.append(f"offset {offset}: ACCEPTed {accepted[offset]} times")
        placed = copies.get(offset, [])
        if len(placed) > 1:
            problems.append(f"offset {offset}: {len(placed)} copies: {placed}")
        if not placed:
            if "ok" not in whats:
                problems.append(f"offset {offset}: ACCEPTed without a copy, never succeeded")
            continue
        topic, hd = placed[0]
        cls = (hd.get(h.ERROR_CLASS) or b"").decode()
        reason = (hd.get(h.DEAD_REASON) or b"").decode()
        if cls == LATE_CLASS:
            problems.append(f"offset {offset}: a late answer settled a newer attempt ({topic})")
        elif topic == TIER:
            ok = (
                (cls == RETRY_CLASS and "retry" in whats)
                or (cls == TIMEOUT_CLASS and (timed_out(mine) or offset in never_begun))
                or (cls == NOT_DUE and combo.delay)
                or (cls == CIRCUIT_OPEN and combo.breaker)
            )
            if not ok:
                problems.append(f"offset {offset}: tier copy {cls!r} unexplained by {mine}")
            if cls == NOT_DUE and int(hd.get(h.RETRY_TIMESTAMP) or 0) < due_ms:
                problems.append(f"offset {offset}: not_due copy due before {due_ms}")
        elif reason == h.DEAD_NON_RETRYABLE:
            if cls != FATAL_CLASS or "fatal" not in whats:
                problems.append(f"offset {offset}: dead letter {cls!r} unexplained by {mine}")
        elif reason == h.DEAD_EXHAUSTED and cls == LIMIT_CLASS:
            if consumer.delivery_count(offset) < combo.limit:
                problems.append(f"offset {offset}: delivery-limit dead letter before the limit")
        else:
            problems.append(f"offset {offset}: dead letter {reason!r}/{cls!r}")
    return problems


def timed_out(calls: list[Call]) -> bool:
    """A timeout is explained by a call drawn slow, or one that did not end well within its
    timeout (a starved call; or frozen on an abandoned loop past its own deadline), or one
    asked for that never began (``never_begun``)."""
    return any(
        c.what in ("slow", "swallow") or c.end is None or c.end - c.asked >= TIMEOUT_S / 2
        for c in calls
    )


@pytest.mark.parametrize("combo", COMBOS, ids=[c.name for c in COMBOS])
def test_share_mode_keeps_every_guarantee(combo: Combo) -> None:
    machine = type(f"ShareCompose_{combo.name}", (ShareCompose,), {"combo": combo})
    run = machine.TestCase
    run.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=os.environ.get("RETRYD_PROPERTY_RANDOM") is None,
        database=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate]
        + ([Phase.shrink] if os.environ.get("RETRYD_PROPERTY_SHRINK") else []),
        print_blob=True,
    )
    run().runTest()
