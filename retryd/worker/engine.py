"""The worker loop: one consumer (main and/or tier topics), one idempotent producer, and a pool
of handler slots (``max_in_flight`` calls at a time, ordered by ``ordering``).

The parts come complete from ``retryd.worker.assembly``; the engine only drives them. Each
iteration of the poll thread, which never waits on a handler:

1. release tier records that came due, ``consume()`` a batch, and turn it into work
   (``Intake``): runs for the scheduler, tier records into their in-memory tails;
2. hand new runs to the pool; abandon calls past their timeout;
3. settle finished calls (``Settler``): done, or a routed copy on its way;
4. flow control: pause partitions whose buffer is full, or all of them while memory or the
   producer's queue is full; resume below half (waiting is pause + resume, never a sleep);
5. store the contiguous settled prefix of every partition (auto-commit ships it), publish the
   iteration's events once, write the heartbeat.

Rebalance (``_release``), bounded in three steps:

1. the assignment is *closed*: only queued main-topic records below the highest started one
   still start, so the commit can reach past every record already started (keys complete out
   of order); at most ``handler_timeout_s``;
2. nothing more starts; calls already running finish or are timed out (at most
   ``handler_timeout_s`` + the async cancel grace);
3. routed copies are acknowledged, the assignment is *released* (every unsettled record is
   discarded, and a result arriving later is dropped, never routed), and the settled prefix
   is committed. The other partitions keep running meanwhile.

A lost partition (session timed out) is released at once: its results are discarded.

Exactly-once routing (``retryd.worker.offsets``): copies are sent at each partition's settled
frontier and committed with the input offsets in one transaction per
``transaction_interval_ms``. When a transaction aborts (or an assignment is lost, whose copies
must not be seen), the worker *rewinds*: every partition it owns is released and, once the
calls still running on it ended or timed out, assigned again at its committed offset, so what
the aborted transaction held is redone (never beside its own first call).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, TopicPartition

from retryd.errors import HungHandlersError, KafkaRuntimeError
from retryd.worker.flow import flow_control
from retryd.worker.lifecycle import ROUTING
from retryd.worker.loop_pool import ASYNC_CANCEL_GRACE_S
from retryd.worker.offsets import Committed
from retryd.worker.partition import PartitionState
from retryd.worker.runs import keep_done
from retryd.worker.summary import RunSummary

if TYPE_CHECKING:
    from retryd.worker.assembly import WorkerParts

log = logging.getLogger(__name__)

BUSY_POLL_S = 0.005  # consume() timeout while calls are in flight: settle results promptly
SETTLE_WAIT_S = 0.005
# While the pool has a full batch of runnable records it has not taken yet, the poll thread
# consumes nothing more (librdkafka keeps its own bounded prefetch) and lets the pool catch up.
# Past this long it pauses every partition instead, so consume() keeps serving the group.
THROTTLE_MAX_S = 1.0
ROUTED_BOUND_S = 30.0  # a revoke waits this long for routed copies' acknowledgements
ACK_POLL_S = 0.002  # consume() timeout while acknowledgements are awaited
ASIDE_POLL_S = 0.05  # consume() timeout while strict records wait for their chain


def _now_ms() -> int:
    return int(time.time() * 1000)


class Worker:
    """Consumes the topics of its role and moves failed messages along the retry plan."""

    def __init__(self, parts: WorkerParts) -> None:
        self.parts = parts
        self.settings = parts.settings
        self.role = parts.role
        self.topics = parts.topics
        self.summary = parts.summary
        self.events = parts.events
        self.book = parts.book
        self.scheduler = parts.scheduler
        self.lifecycle = parts.lifecycle
        self.pool = parts.pool
        self.router = parts.router
        self.settler = parts.settler
        self.intake = parts.intake
        self.circuit = parts.circuit
        self.faults = parts.faults
        self.strict = parts.strict
        self._key_gauges_at = 0.0
        self._consumer = parts.consumer
        self.offsets = parts.offsets
        self._exactly_once = parts.offsets.exactly_once
        self._heartbeat = parts.heartbeat
        self._total_partitions = sum(parts.partition_counts[t] for t in parts.topics)
        self._stop = threading.Event()
        self._joined = False
        self._closing = False
        self._idle_since: float | None = None
        self._beat_at = 0.0
        self._inflight_seen = -1
        self._paused_seen: dict[str, int] | None = None
        self._rewind_due: str | None = None  # exactly-once: why the next tick rewinds

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """Finish what was consumed (up to ``shutdown_timeout_s``), flush, commit and return.
        Signal-safe."""
        self._stop.set()

    def run(self, *, until_drained: bool = False) -> RunSummary:
        try:
            self._consumer.subscribe(
                self.topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            log.info(
                "worker role=%s group=%s topics=%s max_in_flight=%d ordering=%s",
                self.role,
                self.settings.group_id,
                self.topics,
                self.settings.max_in_flight,
                self.settings.ordering,
            )
            self._loop(until_drained)
        finally:
            self._shutdown()
        if self.faults.first is not None:
            raise self.faults.first
        return self.summary

    # ------------------------------------------------------------------ the loop
    def _loop(self, until_drained: bool) -> None:
        consumer, intake = self._consumer, self.intake
        settings = self.settings
        batch_size, poll_s = settings.batch_size, settings.poll_timeout_s
        scheduler, faults = self.scheduler, self.faults
        strict = self.strict
        throttled_since: float | None = None
        while not self._stop.is_set() and not faults:
            started = time.monotonic()
            intake.release_due(_now_ms())
            if strict is not None:
                intake.decide_strict(_now_ms())
            self._dispatch()
            batch: list[Any] = []
            if (
                scheduler.ready_items >= 2 * batch_size
                and not self.book.backlog_paused
                and self.circuit.closed  # an open circuit holds records ready on purpose
            ):
                # The pool is behind: consuming more would only grow the buffers. Wait for
                # it to take half of what is runnable (settling meanwhile), not for the broker.
                throttled_since = throttled_since or started
                if started - throttled_since > THROTTLE_MAX_S:
                    self.book.set_backlog_pause(True)
                scheduler.wait_below(batch_size, BUSY_POLL_S)
            else:
                throttled_since = None
                if self.book.backlog_paused and scheduler.ready_items <= batch_size // 2:
                    self.book.set_backlog_pause(False)
                batch = consumer.consume(batch_size, self._poll_timeout(poll_s))
                if batch:
                    intake.take(batch, _now_ms(), self.settler.stats)
                    self._dispatch()
            self._tick(started)
            if until_drained and self._drained(bool(batch)):
                log.info("drained: every assigned partition is at its end, nothing in flight")
                break

    def _poll_timeout(self, poll_s: float) -> float:
        if self.pool.completions or self.router.blocked or self.router.reports:
            return 0.0
        timeout = BUSY_POLL_S if self.pool.running() or self.scheduler.runnable else poll_s
        if self.router.inflight:
            # acknowledgements are served by this loop: a record whose writes go one after
            # the other (strict order) would otherwise wait a whole poll per write when
            # nothing else is going on
            timeout = min(timeout, ACK_POLL_S)
        strict = self.strict
        if strict is not None:
            if strict.busy:
                timeout = BUSY_POLL_S
            elif strict.aside:
                timeout = min(timeout, ASIDE_POLL_S)  # their chain may move any moment
        due = self.intake.next_due_ms()
        if due is not None:
            timeout = min(timeout, max(0.0, (due - _now_ms()) / 1000))
        return timeout

    def _dispatch(self) -> None:
        works = self.intake.works()
        if works:
            self.scheduler.submit(works)
        self.pool.wake(self.scheduler.runnable)

    def _settle_once(self) -> None:
        settler, pool = self.settler, self.pool
        settler.poll()
        pool.watchdog()
        # The failures to settle are counted before the slots' counters are read: a slot counts
        # a call before it hands a failure over, so every answer that came before one of these
        # failures is in the counters too (the circuit breaker's window sees answers and
        # failures in step, never a burst of failures ahead of the answers around them).
        failed = len(pool.completions)
        pool.collect(settler.stats)
        settler.settle(pool.completions, failed)
        if self._exactly_once:
            settler.route_frontier(self.book.parts.values())
        settler.poll()
        # settling releases lanes (failures decided here): the records behind them may run
        pool.wake(self.scheduler.runnable)

    def _tick(self, started: float) -> None:
        """Everything after consume(): settle, flow control, store, publish, heartbeat."""
        if self._rewind_due is not None:
            self._rewind(self._rewind_due)
        self._settle_once()
        self.circuit.tick(_now_ms())
        s = self.settings
        flow_control(
            self.book,
            s.partition_buffer,
            s.tier_buffer,
            s.buffer_bytes,
            self.router.blocked,
            _now_ms(),
        )
        self.book.store()
        if self.offsets.tick() is Committed.ABORTED:
            self._rewind("transaction aborted")
        self._flush_stats(started)
        self._publish_gauges()
        hung = self.pool.hung
        if hung > s.max_abandoned_handlers:
            self.faults.set(
                HungHandlersError(
                    f"{hung} handler calls are hung past their timeout "
                    f"(max_abandoned_handlers={s.max_abandoned_handlers}); "
                    "exiting so the process is restarted"
                )
            )
        self._beat()

    def _publish_gauges(self) -> None:
        running = self.pool.running()
        if running != self._inflight_seen:
            self._inflight_seen = running
            self.events.inflight(running)
        paused = self.book.paused_by_topic()
        if paused != self._paused_seen:
            self._paused_seen = paused
            self.events.paused(paused)
        strict = self.strict
        if strict is not None:
            now = time.monotonic()
            if now - self._key_gauges_at >= 1.0:
                self._key_gauges_at = now
                self.events.key_order(*strict.gauges(_now_ms()))

    # ------------------------------------------------------------------ settling
    def _wait_calls_ended(
        self, states: list[PartitionState], timeout_s: float, why: str, otherwise: str
    ) -> None:
        """Settle until no call of these partitions runs: at most the handler timeout plus
        the async cancellation grace and 1 s, by which a watchdog has timed out any call
        still running. A revoke and a rewind both wait so, before the partitions' next
        assignment (here or in the next owner) runs their records again."""
        bound = timeout_s + ASYNC_CANCEL_GRACE_S + 1.0
        if not self._settle_until(lambda: all(st.running == 0 for st in states), bound):
            running = sum(st.running for st in states)
            log.warning("%s: %d handler calls still running %gs %s", why, running, bound, otherwise)

    def _settle_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Keep settling results (and writing heartbeats) until ``done()`` or the deadline.
        Runs inside a revoke callback, at shutdown, or in an exactly-once rewind once every
        partition is unassigned (so the poll loop has nothing to consume while it waits);
        never in the poll loop's normal course."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.strict is not None:
                self.intake.decide_strict(_now_ms())  # lane heads below a revoke's bound run
            if self.intake.runs.waiting:
                self._dispatch()  # runs stopped as calls turned slow (retryd.worker.runs)
            self._settle_once()
            if done():
                return True
            if time.monotonic() >= deadline:
                return False
            self._beat()
            time.sleep(SETTLE_WAIT_S)

    def _release(self, states: list[PartitionState], *, why: str) -> None:
        """Give partitions up cleanly (see the module docstring for the three steps)."""
        if not states:
            return
        lifecycle = self.lifecycle
        timeout_s = self.pool.timeout_s  # a call's longest run, quick retries included
        # With the circuit open nothing may start: records held in place go to the next owner.
        closed_circuit = self.circuit.closed
        for st in states:
            lifecycle.close(st, 0 if st.is_tier or not closed_circuit else st.started_end())
            self.intake.forget(st)  # not-yet-due tier records: the next owner waits for them

        def gaps_run() -> bool:
            return all(st.running == 0 and st.gaps_done() for st in states)

        if not self._settle_until(gaps_run, timeout_s):
            log.warning(
                "%s: queued records below started ones did not all run within %gs; "
                "the next owner redoes them and the records above",
                why,
                timeout_s,
            )
        for st in states:
            lifecycle.stop_starting(st)
        self._wait_calls_ended(
            states,
            timeout_s,
            why,
            "after the revoke closed their partitions; their results will be discarded (the "
            "next owner runs them again)",
        )

        # Every record of these partitions that is writing (a routed copy, or strict order's
        # writes one after the other) finishes its writes, so release never drops one half
        # written: a copy whose acknowledgement sends the next write is waited for too.
        # With nothing in flight or waiting for room no acknowledgement can come: a record
        # still ROUTING then had a write refused for good (the run stops), so stop waiting.
        router = self.router

        def writes_done() -> bool:
            if not router.inflight and not router.blocked and not router.reports:
                return True
            return not any(w.stage is ROUTING for st in states for w in st.pending)

        if not self._settle_until(writes_done, ROUTED_BOUND_S):
            writing = sum(1 for st in states for w in st.pending if w.stage is ROUTING)
            log.error(
                "%s: %d records' routed copies undelivered after %gs; their inputs stay "
                "uncommitted",
                why,
                writing,
                ROUTED_BOUND_S,
            )
        for st in states:
            keep_done(st, lifecycle)  # runs stopped part-way: what ran is committed
        discarded = self._discard(states)
        if discarded:
            log.info("%s: %d unfinished records left to the next owner", why, discarded)
        self.book.store(states)
        if self.book.commit_sync(states) is Committed.ABORTED and not self._closing:
            # the partitions given up are redone by their next owner; the kept ones here,
            # once the rebalance callback has returned
            self._rewind_due = "transaction aborted during a revoke"

    def _discard(self, states: list[PartitionState]) -> int:
        """The assignments are over: every unsettled record of theirs is discarded (a result
        arriving later is dropped), and what waits for them (tails, held records, lanes,
        strict gates) lets go. Returns how many records were discarded."""
        discarded = 0
        for st in states:
            discarded += self.lifecycle.release(st)
            self.intake.forget(st)
        self.circuit.forget(states)
        self.scheduler.forget(states)
        return discarded

    def _rewind(self, why: str) -> None:
        """Exactly-once: start every owned partition again from its committed offset.
        Everything held is discarded; results of calls still running are dropped when they
        end (their assignment is over). Called from the poll loop before anything is settled
        or stored (never from a rebalance callback, which only marks it due): a copy settled
        after an abort could otherwise let an offset past an aborted copy be committed.

        The partitions are assigned again only once the calls of the old assignment ended
        (or were timed out), as a revoke's step 2 waits before the next owner starts: the
        new assignment is a new lane (``ordering`` keys on the assignment), so a record
        redone at once would start beside its own first call still running, and the
        records of one key or partition would overlap. Nothing is settled meanwhile: every
        record of these partitions is already discarded."""
        self._rewind_due = None
        states = list(self.book.parts.values())
        if not states:
            return
        self._discard(states)
        self.book.forget(states)
        parts = [TopicPartition(st.topic, st.partition) for st in states]
        try:
            self._consumer.incremental_unassign(parts)
            self._wait_calls_ended(
                states,
                self.pool.timeout_s,
                why,
                "after the rewind; their records may run again beside them",
            )
            committed = self._consumer.committed(parts, timeout=30)
            self.book.assign(committed)
        except KafkaException as exc:
            fault = KafkaRuntimeError(f"{why}: cannot rewind to the committed offsets: {exc}")
            fault.__cause__ = exc
            self.faults.set(fault)
            return
        log.warning("%s: %s rewound to their committed offsets", why, _fmt(parts))

    def _shutdown(self) -> None:
        try:
            fatal = self.faults.first
            if fatal is None or isinstance(fatal, HungHandlersError):
                self._finish_consumed()
            self._release(list(self.book.parts.values()), why="shutdown")
            self._closing = True
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.error("error while closing the consumer: %s", exc)
        finally:
            self.pool.close(1.0)
            if self.strict is not None:
                self.strict.close()
            self._flush_stats()
            self._heartbeat.remove()
            self.events.paused({})
            self.events.inflight(0)
            self._end_tracing()

    def _end_tracing(self) -> None:
        """Export the spans still buffered (bounded by the exporter's own timeouts)."""
        try:
            self.parts.tracing.shutdown()
        except Exception as exc:  # traces must never change how a worker ends
            log.warning("could not flush traces at shutdown: %s", exc)

    def _flush_stats(self, started: float | None = None) -> None:
        """Collect the slots' counts and emit what this batch observed. Also called once at
        shutdown: a call that ended just before the stop may not have reached a batch's
        collection yet."""
        settler = self.settler
        self.pool.collect(settler.stats)
        retries, rescued = self.parts.quick.take()
        stats = settler.take_stats()
        stats.quick_retries += retries
        stats.quick_rescued += rescued
        if stats:
            ended = time.monotonic()
            self.events.batch(stats, ended if started is None else started, ended)

    def _finish_consumed(self) -> None:
        """On a clean stop, finish the records already consumed (not the ones waiting for
        their due time), so a restart redoes as little as possible. Not while the circuit is
        open: the records it holds stay uncommitted, for whoever runs next."""
        if not self.circuit.closed:
            log.info(
                "shutdown with the circuit %s: held records are left uncommitted",
                self.circuit.breaker.state.value,
            )
            return

        def finished() -> bool:
            return not any(st.unfinished() for st in self.book.parts.values())

        if not self._settle_until(finished, self.settings.shutdown_timeout_s):
            log.warning(
                "shutdown: records still unfinished after %gs; they are redone by the next owner",
                self.settings.shutdown_timeout_s,
            )

    # ------------------------------------------------------------------ rebalance
    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._joined = True
        self.events.rebalance("assign", len(partitions))
        states = self.book.assign(partitions)
        if self.strict is not None:
            self.strict.assigned(states)
        log.info("assigned %s", _fmt(partitions))

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        states = self.book.states(partitions)
        if not self._closing:  # the revoke of a clean close is not a rebalance
            self.events.rebalance("revoke", len(partitions))
            self._release(states, why="revoke")
        self.book.forget(states)
        self.events.forget([(st.topic, st.partition) for st in states])
        log.info("revoked %s", _fmt(partitions))

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.events.rebalance("lost", len(partitions))
        states = self.book.states(partitions)
        for st in states:
            st.lost = True
        self._discard(states)
        log.warning(
            "lost %s (session timed out); their uncommitted work will be redone", _fmt(partitions)
        )
        self.book.forget(states)
        self.events.forget([(st.topic, st.partition) for st in states])
        if self._exactly_once:
            # The open transaction may hold copies of the lost partitions, whose offsets can
            # no longer be committed: abort it, and redo the kept partitions' share of it.
            self.offsets.abort()
            self._rewind_due = "an assignment was lost"

    # ------------------------------------------------------------------ observability
    def _beat(self) -> None:
        hb = self._heartbeat
        now = time.monotonic()
        if now - self._beat_at < hb.interval_s:
            return
        self._beat_at = now
        self.circuit.apply_orders(_now_ms())
        book = self.book
        hb.beat(
            len(book.parts),
            sum(1 for st in book.parts.values() if st.paused),
            # readiness stops counting a worker that finishes its last records before it exits
            state="stopping" if self._stop.is_set() else "running",
            drained=self._idle(),
            positions={
                f"{st.topic}/{st.partition}": st.position
                for st in book.parts.values()
                if st.position is not None
            },
            produced={f"{t}/{p}": end for (t, p), end in self.router.produced_end.items()},
            circuit=self.circuit.snapshot().as_dict(),
        )

    def _idle(self) -> bool:
        """Nothing left to do right now on the partitions this process owns."""
        router = self.router
        busy = bool(router.inflight or router.blocked or router.reports)
        return self._joined and not busy and self.book.idle()

    def _drained(self, busy: bool) -> bool:
        """Single-process drain: idle *and* owning every partition (an empty assignment while a
        departed member is still being timed out is not "drained")."""
        now = time.monotonic()
        if busy or not self._idle() or len(self.book.parts) < self._total_partitions:
            self._idle_since = None
            return False
        if self._idle_since is None:
            self._idle_since = now
        return now - self._idle_since >= self.parts.drain_grace_s


def _fmt(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing"


__all__ = ["Worker"]
