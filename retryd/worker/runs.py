"""Runs: the success path of fast handlers without per-record engine state.

A *run* (``retryd.worker.work.Run``) is consecutive records of one main-topic partition,
consumed in one batch, that go through the engine as one entry: one place in the partition's
``pending``, one item in the scheduler, one claim. Its slot calls the handler for each record
in offset order (each record a call that starts through ``Lifecycle.step``, under the lock a
revoke closes with), and a run that succeeds settles as one entry: its offset (the last
record's) is stored like any other. A record that fails stops its run: the poll thread
*splits* it (``split_failed``): the records before it stay settled as the run, the failed one
becomes a single record like any other failure (routed, or held by the circuit breaker), and
the records after it, and every record chained or held behind the run, are queued again one by one
behind it. Nothing a single record has is skipped: only its bookkeeping is deferred until it
fails.

When: calls return in microseconds (the thread pool measures it, ``Scheduler.fast_calls``, or
the scheduler's ``RunPace`` pins it; a single thread serves them anyway, so a partition running
one record at a time loses no concurrency), a main topic with no delay before the first
attempt, not strict key order. The intake *offers* a batch's records of a partition as a run;
the scheduler, which owns the key lanes, decides (``retryd.worker.run_policy``): with
``ordering = key`` a run holds its partition's lane (its records run in offset order, so every
key's order holds) and is queued only while the partition has no single record queued,
running or waiting behind its runs; otherwise it is unfolded into single records. Single
records of a partition whose run is busy wait behind it in the scheduler (``held``). A run
whose calls turn slow (``SLOW_STREAK`` in a row) stops and goes back as single records too, so
a slow handler gets its key-level concurrency back.

A revoke stops a run before its next record once the assignment is closed past it
(``Lifecycle.step``): the records that ran are committed (``keep_done``), the rest is left to
the next owner. A shut gate (circuit breaker) stops it the same way, at the front of the line;
a run is never the probe, but a probe can be taken from one (``probe_of``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from retryd.handlers.base import Message
from retryd.policy.classify import HandlerResult, Outcome
from retryd.worker.lifecycle import FAILED, QUEUED
from retryd.worker.run_policy import replace_in_pending, singles, unfold
from retryd.worker.slots import SLOW_CALL_S, adapter_failure, perf
from retryd.worker.work import Run, Work, work_of_message

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    from retryd.worker.events import SlotStats
    from retryd.worker.lifecycle import Lifecycle, SlotLike
    from retryd.worker.partition import PartitionState
    from retryd.worker.scheduler import Scheduler

_SUCCESS = Outcome.SUCCESS
_DROP = Outcome.DROP
_OK = HandlerResult.success()
# Slow calls in a row (each past ``SLOW_CALL_S``) that stop a run: one alone may only have
# waited for the interpreter lock.
SLOW_STREAK = 3
# Records of a partition fetched after a run of it failed that go as single records: where
# failures are common, splitting runs would cost more than runs save.
RUNS_BACKOFF = 2000


def new_run(
    raws: list[Any], size: int, part: PartitionState, lock: Hashable | None, by_key: bool
) -> Run:
    """A run over ``raws`` (consecutive records of ``part``), appended to its pending; its
    records take key lanes when it splits with ``by_key``, else the run's own ``lock``."""
    first = raws[0]
    r = Run.__new__(Run)
    r.msg = _view(first, part)
    r.raw = first
    r.raws = raws
    r.done = 0
    r.extra = len(raws) - 1
    r.offset = raws[-1].offset()
    r.part = part
    r.due = 0
    r.stage = QUEUED
    r.attempt = 0
    r.next = None
    r.result = None
    r.route = None
    r.size = size
    r.lock = lock
    r.by_key = by_key
    part.pending.append(r)
    part.pending_bytes += size
    part.pending_extra += r.extra
    return r


# ---------------------------------------------------------------------- slot side
def call_run(
    run: Run,
    attempt: int,
    slot: SlotLike,
    call: Callable[[Message], HandlerResult],
    lifecycle: Lifecycle,
    scheduler: Scheduler,
    stats: SlotStats,
) -> tuple[HandlerResult | None, float]:
    """Call the handler for each record of ``run`` from ``run.done`` on, until one fails.

    Returns the last call's result and duration: a success when every record succeeded, the
    failure of ``run.done`` otherwise (``Lifecycle.finish`` then settles the run either way);
    None when a record must not start (``Lifecycle.step``: the slot checks ``abandoned``).
    Counted like single calls: a duration per call, successes and calls per run, calls last
    (the collector's "nothing new" check)."""
    raws = run.raws
    part = run.part
    topic, partition = part.topic, part.partition
    durations = stats.durations.get(topic) or stats.duration(topic)
    observe = durations.observe
    step = lifecycle.step
    first = run.done
    slow_call_s = scheduler.pace.slow_call_s
    if slow_call_s is None:
        slow_call_s = SLOW_CALL_S
    ok = dropped = calls = slow = 0
    i = run.done
    n = len(raws)
    result: HandlerResult | None = None
    seconds = 0.0
    try:
        while i < n:
            raw = raws[i]
            m = Message.__new__(Message)
            m._raw = raw
            m._env = None
            m._hdrs = None
            m.topic = topic
            m.partition = partition
            m.offset = raw.offset()
            if i != first and not scheduler.gate_open:
                # the circuit breaker shut the gate: nothing more starts; the run waits at
                # the front of the line, holding its lane, and goes on from this record
                if lifecycle.pause(run, attempt, i, slot):
                    scheduler.requeue([run])
                return None, seconds
            if not step(run, attempt, i, m, slot):
                return None, seconds
            started = slot.started
            try:
                result = call(m)
            except BaseException as exc:  # adapters never raise; if one does, retry
                result = adapter_failure(exc)
            seconds = perf() - started
            if slot.abandoned:  # timed out meanwhile: the watchdog settled it
                return None, seconds
            observe(seconds)
            calls += 1
            if result is not _OK:
                outcome = result.outcome
                if outcome is _DROP:
                    dropped += 1
                elif outcome is not _SUCCESS:
                    return result, seconds  # run.done is the failed record
                else:
                    ok += 1
            else:
                ok += 1
            i += 1
            if seconds > slow_call_s:
                slow += 1
                if slow >= SLOW_STREAK and i < n:
                    # calls turned slow: the rest goes back as single records, so keys run
                    # side by side again (``Intake`` resumes it)
                    scheduler.fast_calls = False
                    if lifecycle.pause(run, attempt, i, slot):
                        scheduler.slowed(run)
                    return None, seconds
            else:
                slow = 0
        return result, seconds
    finally:
        if ok:
            stats.success[topic] = stats.success.get(topic, 0) + ok
        if dropped:
            stats.dropped[topic] = stats.dropped.get(topic, 0) + dropped
        stats.calls += calls  # last


# ---------------------------------------------------------------------- poll-thread side
def split_failed(run: Run, scheduler: Scheduler, lifecycle: Lifecycle) -> Work | None:
    """A run whose record ``run.done`` failed (or timed out): that record becomes a single
    FAILED record with the run's result, to be settled like any failure (its key's lane held
    until then); the records after it and every record chained behind the run are queued again
    as single records behind it. The records before it stay settled as the run. None when the
    run was discarded meanwhile."""
    part = run.part
    if part.position is not None:  # failures come in bunches: single records for a while
        part.runs_from = part.position + RUNS_BACKOFF
    failed = _single(run, run.msg)
    failed.stage = FAILED
    failed.attempt = 1
    failed.result = run.result
    failed.seconds = getattr(run, "seconds", 0.0)
    return failed if _split(run, failed, scheduler, lifecycle) else None


def probe_of(run: Run, scheduler: Scheduler, lifecycle: Lifecycle) -> Work | None:
    """A queued run the circuit breaker took out of the ready queue for want of any other
    probe: its next record becomes a single record, the head of its key's lane outside the
    ready queue (where a probe waits to be offered), everything after it queued behind as
    single records. The probe is one call, never a run."""
    m = _view(run.raws[run.done], run.part)
    head = _single(run, m)
    return head if _split(run, head, scheduler, lifecycle) else None


def resume_singles(run: Run, scheduler: Scheduler, lifecycle: Lifecycle) -> None:
    """A run its slot stopped because calls turned slow (QUEUED, out of the ready queue):
    the rest of it, and what is chained behind it, queued as single records."""
    m = _view(run.raws[run.done], run.part)
    _split(run, _single(run, m), scheduler, lifecycle, ready=True)


def _view(raw: Any, part: PartitionState) -> Message:
    """The handler's view of one record of ``part`` (the run loop builds its own inline: it
    is the hot path)."""
    m = Message.__new__(Message)
    m._raw = raw
    m._env = None
    m._hdrs = None
    m.topic = part.topic
    m.partition = part.partition
    m.offset = raw.offset()
    return m


def _single(run: Run, msg: Message) -> Work:
    """A single record for ``run.raws[run.done]``, over ``msg``."""
    part = run.part
    raw = run.raws[run.done]
    w = work_of_message(msg, part)
    w.raw = raw
    w.size = len(raw)
    w.lock = (part, raw.key()) if run.by_key else run.lock
    return w


def _split(
    run: Run, head: Work, scheduler: Scheduler, lifecycle: Lifecycle, *, ready: bool = False
) -> bool:
    """``run`` (FAILED, or QUEUED and out of the ready queue) gives way to ``head`` (its
    record ``run.done``), the records after it and those chained or held behind it
    (``Scheduler.detach``), all single records in its lane's place; the records before
    ``run.done`` stay, settled, as the run."""
    part = run.part
    i = run.done
    raws = run.raws
    if i and not lifecycle.split(run):
        return False
    if not i and run.stage is not FAILED and run.stage is not QUEUED:
        return False
    rest = singles(run, i + 1)
    chained = scheduler.detach(run)
    later: list[Work] = []
    for c in chained:
        later.extend(unfold(c) if c.many else (c,))  # type: ignore[arg-type]
    pending = part.pending
    if i:
        moved = sum(len(r) for r in raws[i:])
        run.raws = raws[:i]
        run.offset = raws[i - 1].offset()
        run.size -= moved
        part.pending_extra -= len(raws) - i
        run.extra = i - 1
        replace_in_pending(pending, run, [head, *rest], keep=True)
    else:
        part.pending_extra -= run.extra
        replace_in_pending(pending, run, [head, *rest], keep=False)
    if ready:
        scheduler.submit([head, *rest, *later])
    else:
        scheduler.place(head, rest + later)
    return True


def keep_done(part: PartitionState, lifecycle: Lifecycle) -> None:
    """An assignment is being released: a run a revoke stopped part-way (QUEUED, ``done``
    records in) keeps the records that succeeded settled, so the commit covers them; the rest
    become single records, discarded with the assignment (its next owner runs them)."""
    stopped = [w for w in part.pending if w.many and w.stage is QUEUED]
    for run in stopped:
        assert isinstance(run, Run)
        i = run.done
        if not i:
            continue
        raws = run.raws
        rest = singles(run, i)
        if not lifecycle.split(run):
            continue
        run.raws = raws[:i]
        run.offset = raws[i - 1].offset()
        run.size -= sum(w.size for w in rest)
        part.pending_extra -= len(raws) - i
        run.extra = i - 1
        replace_in_pending(part.pending, run, rest, keep=True)
