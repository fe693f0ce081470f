"""The share-group worker: the main topics read by a share group, each record on its own.

A share consumer in explicit acknowledgement mode returns a batch of *acquired* records and
refuses to poll again until every one of them is acknowledged. So the loop goes batch by
batch (a batch is a few rounds of ``max_in_flight`` calls: ``retryd.share.build``):

1. ``poll`` a batch (blocking up to ``poll_timeout_s``: the broker's wait, never a sleep);
2. start up to ``max_in_flight`` calls; as each ends (the loop waits on the calls' queue and
   the producer's acknowledgements, whichever comes first):

   - success (or DROP) -> ACCEPT;
   - retryable failure -> the copy goes to its tier (``RoutePlanner``, ``Router``: acks=all,
     ``retry_number`` and ``retry_timestamp`` headers), ACCEPT once the broker acknowledged
     the copy; the tier workers (a consumer group, as in group mode) run it when it is due;
   - non-retryable -> ``failed_topic`` (or its error route's topic) with the payload and the
     reason, ACCEPT once acknowledged;

3. send the acknowledgements (``commit_async``) and poll the next batch.

A crash anywhere before an ACCEPT leaves the record acquired; the broker hands it out again
once its lock expires, or as soon as it sees the worker's connection close (at-least-once:
nothing is lost, a call may repeat).

**The last delivery.** A record handed out ``share.delivery.count.limit`` times (the earlier
deliveries crashed their worker or outlived their lock) would be archived by the broker if
this delivery failed too: silently, or headers-only into a KIP-1191 dead-letter queue. retryd
does not call the handler again (a record that took its worker down every time would do it
once more): it dead-letters the record to ``failed_topic`` with its payload, reason
``exhausted`` and error class ``delivery_count_limit``, then ACCEPTs it. It can be replayed
like any other dead letter.

**Locks.** A record's lock started when the broker handed it out. A record of the batch that
could not start in time to finish within its lock (its call may take ``handler_timeout_s``) is
RELEASEd, handed out again at once to this worker or another, rather than run past its lock
(then the broker would hand it to another worker while it still runs). A release counts as a
delivery: a worker that keeps taking more than it can run within a lock (whole producer
batches of slow records) brings records to their last delivery, so each batch's releases are
logged and counted (``retryd_share_acknowledgements_total{type="release"}``).

**Calls** (``retryd.share.calls``) each carry an attempt number: only the current attempt's
answer counts, so a timed-out call's late answer never settles its record's rerun. Every call
has a deadline, async ones too (a loop frozen past it is abandoned and replaced), so the loop
never waits on business code without one. **A delay before the first attempt** (``delay=``)
holds a record in hand until due (``retryd.share.delay``). **Polls** are guarded and timed by
``retryd.share.fetch``: an exception from the client never ends the worker by itself, and a
record's lock is timed from the earliest moment it may have been acquired.

**The outage circuit breaker** (``retryd.share.gate``): while the circuit is open the loop
does not poll, records of the batch in hand not started yet wait for it (or go on to their tier
uncalled when their lock runs out), and a retryable failure that trips the window runs again in
place as the confirming call.

On SIGTERM the batch in hand is finished (its calls are bounded by their timeout), records not
started are RELEASEd, and the consumer is closed (which sends the acknowledgements).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from confluent_kafka import AcknowledgeType, KafkaException

from retryd.errors import HungHandlersError, KafkaRuntimeError, RetrydError
from retryd.handlers.quick import QuickCounts
from retryd.policy.classify import Outcome
from retryd.policy.routing import RoutePlanner
from retryd.runtime.heartbeat import HeartbeatWriter
from retryd.share.calls import Calls, Finished
from retryd.share.delay import first_due_ms
from retryd.share.fetch import Fetcher
from retryd.share.gate import ShareGate
from retryd.share.group import GroupConfigWatch, ShareGroupConfig, start_budget_s
from retryd.share.report import Reports
from retryd.share.routes import Acquired, Routes, acquired
from retryd.tracing import NO_TRACING, Tracing
from retryd.worker.events import BatchStats, Events
from retryd.worker.router import Router

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


ACK_WAIT_S = 0.002  # wait for a call while copies' acknowledgements are awaited
CALL_WAIT_S = 0.05  # wait for a call otherwise (a call's end wakes it at once)


@dataclass(frozen=True, slots=True)
class ShareParts:
    settings: Any
    consumer: Any  # confluent_kafka.ShareConsumer
    router: Router
    planner: RoutePlanner
    calls: Calls
    group: ShareGroupConfig
    events: Events
    heartbeat: HeartbeatWriter | None  # None: another part of the process writes it
    quick: QuickCounts  # quick retries in place (quick=<n>@<delay>), counted by the handler
    gate: ShareGate  # the outage circuit breaker (retryd.share.gate)
    watch: GroupConfigWatch | None = None  # the group's configuration, read again meanwhile
    tracing: Tracing = NO_TRACING  # stamps a routed copy with its call's traceparent


class ShareWorker(Routes, Reports):
    def __init__(self, parts: ShareParts) -> None:
        self.parts = parts
        s = parts.settings
        self.settings = s
        self.consumer = parts.consumer
        self.router = parts.router
        self.planner = parts.planner
        self.calls = parts.calls
        self.events = parts.events
        self.topics = list(s.main_topics)
        self.max_in_flight = s.max_in_flight
        self.gate = parts.gate
        self._use(parts.group)
        self._rerun: list[Acquired] = []  # the confirming probe, run again in place
        self._again: list[Acquired] = []  # cut off by an abandoned event loop: run again
        self.first_delay_ms = s.plan.first_delay_ms
        self._beat_at = 0.0
        self.stats = BatchStats()
        self.fault: RetrydError | None = None
        self._stop = threading.Event()
        self.fetch = Fetcher(parts.consumer, self._stop, s.max_poll_interval_ms / 1000)
        self._open = 0  # records of the batch in hand not yet acknowledged
        self.acks = {"accept": 0, "release": 0}  # since the last publish
        self._inflight_seen = -1
        self._gauge_at = 0.0
        self.handled = 0  # records acknowledged (tests and the run summary)

    @property
    def client_errors(self) -> int:
        """Exceptions from the share consumer's poll and commit_async, ever."""
        return self.fetch.errors

    def stop(self) -> None:
        """Finish the batch in hand, then close. Signal-safe."""
        self._stop.set()

    def _use(self, group: ShareGroupConfig) -> None:
        """The group's lock and delivery limit (at start, and as re-read: between batches)."""
        self.lock_s = group.lock_ms / 1000
        self.limit = group.delivery_limit
        self.budget_s = start_budget_s(group, self.calls.timeout_s)

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        consumer, s = self.consumer, self.settings
        consumer.set_acknowledgement_commit_callback(self._committed)
        consumer.subscribe(self.topics)
        log.info(
            "share worker: share group %s reads %s; max_in_flight=%d, lock %gs, delivery "
            "limit %d; failures go to the tiers of group %s",
            self.parts.group.group,
            ", ".join(self.topics),
            self.max_in_flight,
            self.lock_s,
            self.limit,
            s.group_id,
        )
        if self.parts.watch is not None:
            self.parts.watch.start()
        gate, fetch = self.gate, self.fetch
        try:
            while not self._stop.is_set() and self.fault is None:
                self._beat("running")
                now_ms = _now_ms()
                gate.tick(now_ms)
                if self.parts.watch is not None and (group := self.parts.watch.take()):
                    self._use(group)
                if not gate.may_poll(now_ms):  # open: acquire nothing (retryd.share.gate)
                    self._stop.wait(gate.idle_s(now_ms))
                    continue
                gate.polled()
                batch, since = fetch.poll(s.poll_timeout_s)  # since: its locks' earliest start
                started = time.monotonic()
                records = [acquired(m, since) for m in batch if self._readable(m)]
                if records:
                    self._batch(records)
                    fetch.commit()
                    self._publish(started)
                self.fault = self.fault or fetch.fault
        finally:
            self._close()
        if self.fault is not None:
            raise self.fault

    def _readable(self, msg: Any) -> bool:
        err = msg.error()
        if err is None:
            return True
        log.warning("share consumer: %s", err)
        if err.fatal():
            self.fault = KafkaRuntimeError(f"share consumer fatal error: {err}")
        return False

    def _batch(self, records: list[Acquired]) -> None:
        """Every record of the batch acknowledged (or the worker stopping on a fault)."""
        self._open = len(records)
        self._rerun.clear()
        self._again.clear()
        waiting = deque(r for r in records if self._due(r))
        if len(waiting) < len(records):
            log.warning(
                "%d of %d records went on to their tier uncalled: their lock (%gs) cannot hold "
                "them until their first attempt is due (delay=%gs) with a call",
                len(records) - len(waiting),
                len(records),
                self.lock_s,
                self.first_delay_ms / 1000,
            )
        calls, router, gate = self.calls, self.router, self.gate
        budget_s, lock_s = self.budget_s, self.lock_s
        late = uncalled = 0
        while self._open and self.fault is None:
            now = time.monotonic()
            while self._again:
                waiting.appendleft(self._again.pop())
            if self._rerun and calls.running < self.max_in_flight:
                self._start(self._rerun.pop())
            if waiting and not gate.closed:  # records in hand wait for the circuit...
                for rec in [r for r in waiting if now + budget_s > r.acquired + lock_s]:
                    waiting.remove(rec)  # ...while their lock holds a call (gate module)
                    uncalled += self._uncalled(rec)
            late += self._start_waiting(waiting, now)
            gate.tick(_now_ms())
            self._gauge(now)
            self._beat("running")  # (rate-limited by the writer) a long batch stays alive
            wait_s = ACK_WAIT_S if router.inflight else CALL_WAIT_S
            held = [r.due for r in waiting if r.due > now]  # delay=: wake when one is due
            self._wait(min(wait_s, min(held) - now) if held else wait_s)
            for finished in calls.expire(time.monotonic()):
                self._finished(finished)
            self._settle_reports()
            if calls.hung > self.settings.max_abandoned_handlers:
                self.fault = HungHandlersError(
                    f"{calls.hung} handler calls are hung past their timeout "
                    f"(max_abandoned_handlers={self.settings.max_abandoned_handlers}); "
                    "exiting so the process is restarted"
                )
        if late:
            log.warning(
                "%d of %d records released unhandled: after waiting for a free call their "
                "lock (%gs) could no longer hold one (%gs); raise max_in_flight or the "
                "group's share.record.lock.duration.ms, or lower handler_timeout_s",
                late,
                len(records),
                lock_s,
                budget_s,
            )
        if uncalled:
            log.warning(
                "%d of %d records were not called while the circuit was open: their lock (%gs) "
                "ran out, so they went on to their tier (or were released where no tier "
                "follows), using no delivery",
                uncalled,
                len(records),
                lock_s,
            )
        self._gauge(None)
        self.events.abandoned(calls.abandoned)

    def _start_waiting(self, waiting: deque[Acquired], now: float) -> int:
        """Start what may start while calls are free; returns how many were released because
        their lock could no longer hold a call."""
        gate, late = self.gate, 0
        for rec in list(waiting):
            if self.calls.running >= self.max_in_flight:
                break
            count = rec.msg.delivery_count() or 1
            if count >= self.limit and count > 1:
                waiting.remove(rec)
                self._last_delivery(rec, count)
            elif self._stop.is_set():
                waiting.remove(rec)
                self._ack(rec, AcknowledgeType.RELEASE)
            elif now + self.budget_s > rec.acquired + self.lock_s:
                waiting.remove(rec)
                self._ack(rec, AcknowledgeType.RELEASE)  # no time left
                late += 1
            elif rec.due > now:
                continue  # its first attempt is not due yet (delay=): held in hand
            elif rec is gate.probe or gate.may_start(rec):
                waiting.remove(rec)
                self._start(rec)
            else:
                break  # the circuit is open: it waits in hand
        return late

    def _start(self, rec: Acquired) -> None:
        rec.attempt = self.calls.start(rec, rec.view)

    def _due(self, rec: Acquired) -> bool:
        """Keep ``rec`` in hand to be called (``delay=``: once due, ``rec.due``); False when
        its lock cannot hold it until due, and it went on without a call (delay module)."""
        if not self.first_delay_ms:
            return True
        now_ms = _now_ms()
        due_ms = first_due_ms(rec.msg, self.first_delay_ms, now_ms)
        if due_ms <= now_ms:
            return True
        rec.due = time.monotonic() + (due_ms - now_ms) / 1000
        if rec.due + self.budget_s <= rec.acquired + self.lock_s:
            return True
        self._not_due(rec, due_ms)
        return False

    def _wait(self, timeout_s: float) -> None:
        """Until a call ends (or ``timeout_s``), then everything that ended meanwhile."""
        done = self.calls.done
        deadline = self.calls.next_deadline()
        if deadline is not None:
            timeout_s = min(timeout_s, max(0.0, deadline - time.monotonic()))
        try:
            first = done.get(timeout=timeout_s)
        except queue.Empty:
            return
        self._finished(first)
        while True:
            try:
                item = done.get_nowait()
            except queue.Empty:
                return
            self._finished(item)

    # ------------------------------------------------------------------ outcomes
    def _finished(self, finished: Finished) -> None:
        rec: Acquired = finished.token
        if rec.done or finished.attempt != rec.attempt:
            return  # an earlier call's answer: never this record's (Calls drops them first)
        result = finished.result
        if result is None:  # cut off by an abandoned event loop, not answered: again
            self._again.append(rec)
            return
        rec.result = result
        self.stats.duration(rec.view.topic).observe(finished.seconds)
        if result.outcome is Outcome.SUCCESS or result.outcome is Outcome.DROP:
            dropped = result.outcome is Outcome.DROP
            self.stats.outcomes[(rec.view.topic, "dropped" if dropped else "success")] += 1
            self.stats.answered += 1
            self.gate.answered(rec, _now_ms())
            self._ack(rec, AcknowledgeType.ACCEPT)
            return
        route = self._plan(rec, result)
        if result.outcome is not Outcome.RETRY:
            self.gate.answered(rec, _now_ms())  # the service answered: not an outage
        elif self.gate.failed(rec, result, route.dead_reason, _now_ms(), rec.view.where):
            if time.monotonic() + self.budget_s <= rec.acquired + self.lock_s:
                self._rerun.append(rec)  # the confirming call: this record again, in place
                return
            self.gate.cannot_rerun(rec)
        if route.is_dead:
            log.info(
                "%s dead-lettered (%s): %s", rec.view.where, route.dead_reason, result.error_class
            )
        self._route(rec, route)

    def _ack(self, rec: Acquired, kind: AcknowledgeType) -> None:
        if rec.done:
            return
        rec.done = True
        self._open -= 1
        self.gate.unanswered(rec)  # the probe, gone without an answer: the next record probes
        try:
            self.consumer.acknowledge(rec.msg, kind)
        except (KafkaException, RuntimeError, ValueError) as exc:
            # its lock expired meanwhile: the broker hands it out again (a repeat, never a loss)
            log.warning("%s: cannot acknowledge (%s)", rec.view.where, exc)
            return
        self.handled += 1
        self.acks["accept" if kind == AcknowledgeType.ACCEPT else "release"] += 1

    def _close(self) -> None:
        if self.parts.watch is not None:
            self.parts.watch.stop()
        try:
            if self.router.flush(10.0):
                log.error("copies not acknowledged at shutdown: their records are redone")
            self._settle_reports()  # acknowledgements of what was just delivered
            self.consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.error("closing the share consumer: %s", exc)
        finally:
            self.calls.close()
            self._publish(time.monotonic())
            self.events.inflight(0)
            if self.parts.heartbeat is not None:
                self.parts.heartbeat.remove()
