"""Phase 3 of every poll: finished handler calls become settled records.

Success and DROP settle on their slot; RETRY and DEAD (and timeouts) route a copy (to the next
tier or ``failed_topic``) and settle when the broker acknowledges it (acks=all). The settler
owns the router's side of a record's life: FAILED → ROUTING → ACKED through the
``Lifecycle``, so a record whose assignment was released is never routed, and a late
acknowledgement of one changes nothing.

A copy the broker refuses as too large is sent again alone (the broker refuses a whole
batch, so a small copy batched with a big one is refused too), and replaced by a dead letter
without the payload (``too_large``) only when it is refused alone too; one refused for now
(timed out in the client during an outage, too few in-sync replicas, a leader moving) is sent
again; any other refusal stops the run with the input uncommitted.

With ``exactly_once`` a copy is sent only at its partition's *settled frontier* (every lower
offset settled: ``route_frontier``), and counts as settled as soon as it is sent: the
transaction that carries it also carries its input's offset, so both become visible together
or neither does. A copy sent above the frontier could be committed while its input is not, and
be routed again by whoever redoes the input. A refused copy makes the transaction abort
(``retryd.worker.offsets``); one refused as too large is remembered, so the redo dead-letters
it as ``too_large`` instead of sending it again.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError

from retryd.errors import DeliveryError
from retryd.policy.classify import Outcome
from retryd.policy.oversize import DEAD_TOO_LARGE, route_too_large
from retryd.policy.routing import Route, RoutePlanner, planning_now_ms, route_malformed
from retryd.tracing import NO_TRACING, Tracing
from retryd.worker.book import PartitionBook
from retryd.worker.circuit import Circuit
from retryd.worker.events import BatchStats
from retryd.worker.faults import Faults
from retryd.worker.lifecycle import (
    ACKED,
    DISCARDED,
    FAILED,
    ROUTING,
    SKIPPED,
    SUCCEEDED,
    Lifecycle,
)
from retryd.worker.partition import PartitionState
from retryd.worker.reading import readable_headers
from retryd.worker.router import Report, Router
from retryd.worker.runs import split_failed
from retryd.worker.scheduler import Scheduler
from retryd.worker.strict import SideWrite, Step
from retryd.worker.work import Work

if TYPE_CHECKING:
    from retryd.worker.strict import StrictOrder

log = logging.getLogger(__name__)

TOO_LARGE_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
# Refusals that say "not now", not "never": the copy timed out in the client (an outage longer
# than message.timeout.ms) or the cluster could not take it yet (fewer in-sync replicas than
# min.insync.replicas, a leader moving). The input is still uncommitted: send the copy again.
TRANSIENT_CODES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }
)
OVERSIZE_MEMO = 1024  # exactly-once: inputs whose copy was refused as too large, remembered


class Settler:
    def __init__(
        self,
        planner: RoutePlanner,
        book: PartitionBook,
        router: Router,
        lifecycle: Lifecycle,
        faults: Faults,
        circuit: Circuit,
        scheduler: Scheduler,
        *,
        exactly_once: bool = False,
        strict: StrictOrder | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self.planner = planner
        self.tracing = tracing  # on: a routed copy carries the trace of the call that failed
        self._traced = tracing.enabled
        self.strict = strict  # key_order = strict (retryd.worker.strict)
        self.circuit = circuit
        self.scheduler = scheduler  # a failure keeps its key's lane until decided here
        self._answered_fed = 0  # stats.answered already told to the circuit
        self._retried_fed = 0  # stats.retried_ok likewise
        self.book = book
        self.router = router
        self.lifecycle = lifecycle
        self.faults = faults
        self.exactly_once = exactly_once
        self.stats = BatchStats()
        # (topic, partition, offset) -> (size, broker error) of copies refused as too large
        self._oversize: dict[tuple[str, int, int], tuple[int, str]] = {}
        self.resent = 0  # copies sent again after a transient refusal
        self._alone_sent: set[int] = set()  # records whose copy was sent again alone (ids)

    def settle(self, completions: deque[Work], limit: int | None = None) -> int:
        """Route every finished call that failed (successes settle on their slot), at most
        ``limit`` of them, unless the circuit breaker holds it in place; returns how many. The
        calls answered since the last look (collected into ``stats`` first) reach the breaker
        before the failures."""
        stats = self.stats
        answered = stats.answered - self._answered_fed
        if not completions and not answered:
            return 0
        if limit is None:
            limit = len(completions)
        now_ms = planning_now_ms()
        circuit = self.circuit
        if answered:
            retried_ok = stats.retried_ok - self._retried_fed
            self._answered_fed += answered
            self._retried_fed += retried_ok
            circuit.answered(answered, now_ms, retried_ok)
        n = 0
        popleft = completions.popleft
        while completions and n < limit:
            w = popleft()
            n += 1
            if w.stage is not FAILED:
                self.scheduler.release(w)  # discarded: the records behind it drain
                continue
            if w.many:  # a run stopped by a failed record: settled as single records
                split = split_failed(w, self.scheduler, self.lifecycle)  # type: ignore[arg-type]
                if split is None:
                    continue
                w = split
            if self.strict is not None and w.part.strict and w.hold:
                outcome = w.result.outcome if w.result is not None else None
                if outcome is Outcome.SUCCESS or outcome is Outcome.DROP:
                    self._strict_success(w)  # its chain entry goes before it settles
                    continue
            route = self._plan(w, now_ms)
            if self._traced:
                self.tracing.stamp(w.msg, route)
            if circuit.hold(w, now_ms, route.dead_reason):
                continue  # an outage: the record stays in place (and in its lane), runs again
            if route.is_dead:
                error_class = w.result.error_class if w.result is not None else None
                log.info("%s dead-lettered (%s): %s", w.where, route.dead_reason, error_class)
            self.route(w, route)
            if not (w.part.strict and w.chain is not None):  # (strict: once its writes are done)
                self.scheduler.release(w)  # moved on: the next record of its key may start
        return n

    def _plan(self, w: Work, now_ms: int) -> Route:
        result = w.result
        assert result is not None
        if w.raw is not None:
            headers, problem = readable_headers(w.msg)
            if problem is not None:
                return route_malformed(
                    self.planner.plan,
                    w.msg.topic,
                    w.msg.partition,
                    w.offset,
                    w.msg.timestamp,
                    headers,
                    problem,
                    now_ms,
                    self.planner.group,
                )
        else:
            headers = w.msg.headers
        env = w.env
        if env is None:  # first failure, on a main topic: the record is its own origin
            route = self.planner.route(
                w.msg.topic,
                w.msg.partition,
                w.offset,
                w.msg.timestamp,
                0,
                None,
                headers,
                result,
                now_ms,
            )
        else:
            route = self.planner.failure(env, headers, result, now_ms)
        return route

    def route(self, w: Work, route: Route) -> None:
        """Send ``w``'s routed copy; ``w`` settles on the acknowledgement. ``w`` is FAILED.
        Exactly-once: the copy waits on ``w`` until its partition's frontier reaches it."""
        if self.exactly_once:
            w.route = route
            return
        self._send(w, route)

    def route_frontier(self, states: Iterable[PartitionState]) -> None:
        """Exactly-once: send the planned copies of failed records that every lower offset
        of their partition has settled before, and settle them at once (their transaction
        commits them with their inputs' offsets, or aborts both)."""
        stats = self.stats
        for st in states:
            for w in st.pending:
                stage = w.stage
                if stage is SUCCEEDED or stage is ACKED or stage is SKIPPED:
                    continue
                route = w.route
                if stage is not FAILED or route is None:
                    break
                w.route = None
                if not self._send(w, route):
                    break  # waits in the router's backlog: settled once it is produced
                if self.lifecycle.acked(w):
                    self._count(stats, w, route)

    def _send(self, w: Work, route: Route) -> bool:
        """Route ``w``'s copy; False when it waits in the router's backlog (or ``w`` was
        discarded)."""
        if not self.lifecycle.route(w):
            return False
        strict = self.strict
        if strict is not None and w.part.strict and w.chain is not None:
            w.route = route  # what the record's settling counts
            w.steps = strict.steps_for(w, route, planning_now_ms())
            return self._step(w)
        if self._oversize:
            seen = self._oversize.get((w.msg.topic, w.msg.partition, w.offset))
            if seen is not None and route.dead_reason != DEAD_TOO_LARGE:
                return self._send_too_large(w, route, *seen)
        return self._produce(w, route)

    # ------------------------------------------------------------------ strict order
    def _strict_success(self, w: Work) -> None:
        """A held success (key_order = strict): remove its chain entry, then settle. It is
        an answer for the circuit breaker like a success settled on its slot (and retry
        evidence when the record failed before)."""
        assert self.strict is not None
        retried = 1 if w.env is not None or w.attempt > 1 else 0
        self.circuit.answered(1, int(time.time() * 1000), retried)
        if not self.lifecycle.route(w):
            self.scheduler.release(w)  # discarded meanwhile
            return
        w.route = None
        w.steps = self.strict.success_steps(w)
        self._step(w)

    def _step(self, w: Work) -> bool:
        """Send ``w``'s next write (``w.steps[0]``, removed once acknowledged)."""
        steps = w.steps
        assert steps
        step: Step = steps[0]
        if step.copy:
            return self._produce(w, step.route)
        return self.router.send(step.route, step.key, step.value, step.partition, w)

    def _count_strict(self, w: Work) -> None:
        stats = self.stats
        route = w.route
        result = w.result
        topic = w.msg.topic
        if route is None:  # a held success
            dropped = result is not None and result.outcome is Outcome.DROP
            stats.outcomes[(topic, "dropped" if dropped else "success")] += 1
        elif result is None and not route.is_dead:
            stats.key_order["parked"] += 1
        else:
            self._count(stats, w, route)
        w.route = None

    def _produce(self, w: Work, route: Route) -> bool:
        raw = w.raw
        if raw is not None:  # the client's record: no property hops on this path
            return self.router.send(route, raw.key(), raw.value(), w.msg.partition, w)
        msg = w.msg
        return self.router.send(route, msg.key, msg.value, msg.partition, w)

    def poll(self) -> None:
        """Serve the producer's delivery reports and settle what they say."""
        router = self.router
        router.poll()
        late = router.produced_late
        while late:  # backlogged copies now in the producer's queue
            sent, route = late.popleft()
            if self.exactly_once and self.lifecycle.acked(sent):
                # in the open transaction, before any later copy of its partition: settled
                self._count(self.stats, sent, route)
        reports = router.reports
        while reports:
            report = reports.popleft()
            w = report.context
            if type(w) is SideWrite:
                self._side_written(w, report)
            elif report.error is None:
                self._acked(w, report.route, report.partition, report.offset)
            else:
                self._refused(w, report.route, report.error)

    def side_write(self, step: Step) -> None:
        """A state write that settles no record (strict order's orphan tombstones)."""
        assert step.key is not None
        self.router.send(step.route, step.key, step.value, step.partition, SideWrite(step.key))

    def _side_written(self, write: SideWrite, report: Report) -> None:
        assert self.strict is not None
        if report.error is not None:
            log.warning(
                "key-state tombstone of an orphaned entry not written (%s); the next sweep "
                "tries again",
                report.error.str(),
            )
        if self.strict.side_acked(write.key, None if report.error else report.offset):
            self.stats.key_order["orphan_removed"] += 1

    def _acked(self, w: Work, route: Route, partition: int, offset: int) -> None:
        """The broker acknowledged ``w``'s copy (acks=all): ``w`` is done."""
        if self._alone_sent:
            self._alone_sent.discard(id(w))
        target = self.book.parts.get((route.topic, partition))
        if target is not None and offset + 1 > target.known_end:
            target.known_end = offset + 1
        strict = self.strict
        if strict is not None and w.part.strict and w.steps:
            step = w.steps[0]
            strict.acked(route, step.key, step.value, offset)  # a state write: into the view
            if w.stage is not ROUTING:
                self.scheduler.release(w)  # its key's lane goes on without it
                return  # discarded meanwhile: its next owner redoes it
            w.steps.pop(0)
            if w.steps:
                self._step(w)
                return
            w.steps = None
            if self.lifecycle.acked(w):
                self._count_strict(w)
                self.scheduler.release(w)  # every write done: the key's next record is decided
            return
        if not self.lifecycle.acked(w):
            return  # discarded while its copy was in flight, or settled when sent (exactly-once)
        self._count(self.stats, w, route)  # the current iteration's, not the send time's

    @staticmethod
    def _count(stats: BatchStats, w: Work, route: Route) -> None:
        reason = route.dead_reason
        if reason is None:
            stats.outcomes[(w.msg.topic, "retried")] += 1
        else:
            stats.outcomes[(w.msg.topic, "dead")] += 1
            stats.dead[reason] += 1

    def _refused(self, w: Work, route: Route, err: KafkaError) -> None:
        """The copy could not be delivered. Too large: dead-letter an envelope instead.
        Anything else: stop, leaving ``w``'s offset uncommitted. Exactly-once: the transaction
        aborts at its commit and the input is redone (a copy too large is remembered)."""
        if w.stage is DISCARDED:
            if w.part.strict and w.chain is not None:
                self.scheduler.release(w)  # its key's lane goes on without it
            return  # its assignment was released (or rewound): its next run decides
        too_large = err.code() in TOO_LARGE_CODES and route.dead_reason != DEAD_TOO_LARGE
        size = sum(len(v or b"") + len(k) for k, v in route.headers)
        size += len(w.msg.value or b"") + len(w.msg.key or b"")
        if self.exactly_once:
            log.warning(
                "%s: routed copy to %s refused (%s): the transaction aborts and the input is "
                "redone",
                w.where,
                route.topic,
                err.str(),
            )
            if too_large:
                memo = self._oversize
                if len(memo) >= OVERSIZE_MEMO:
                    del memo[next(iter(memo))]
                memo[(w.msg.topic, w.msg.partition, w.offset)] = (size, err.str())
            return
        strict_step = self.strict is not None and w.part.strict and bool(w.steps)
        if too_large and not (strict_step and route.topic == self.strict.state_topic):  # type: ignore[union-attr]
            if self.router.can_send_alone and id(w) not in self._alone_sent:
                # the broker refuses a whole batch over a topic's max.message.bytes: this copy
                # may only have been beside a big one. Alone, it is judged on its own size.
                self._alone_sent.add(id(w))
                log.info(
                    "%s: routed copy to %s refused as too large (%s); sending it again alone",
                    w.where,
                    route.topic,
                    err.str(),
                )
                raw = w.raw
                key, value = (
                    (raw.key(), raw.value()) if raw is not None else (w.msg.key, w.msg.value)
                )
                self.router.send_alone(route, key, value, w.msg.partition, w)
                return
            self._alone_sent.discard(id(w))
            if strict_step:  # the dead letter that replaces the copy ends the chain entry
                assert self.strict is not None and w.steps is not None
                w.steps[1:] = self.strict.success_steps(w)
            self._send_too_large(w, route, size, err.str())
            return
        if err.code() in TRANSIENT_CODES and not err.fatal():
            self.resent += 1
            log.warning(
                "%s: routed copy to %s not delivered (%s): sending it again (its input stays "
                "uncommitted until it is acknowledged)",
                w.where,
                route.topic,
                err.str(),
            )
            if strict_step:
                self._step(w)  # the same write again
            else:
                self._produce(w, route)
            return
        hint = ""
        if err.code() in TOO_LARGE_CODES:
            hint = (
                " (even the dead letter without payload is too large: raise the failed"
                " topic's max.message.bytes)"
            )
        exc = DeliveryError(
            f"routed copy of {w.where} to {route.topic} failed: {err.str()}{hint}; "
            "the input stays uncommitted and is redone after a restart"
        )
        log.error("%s", exc)
        self.faults.set(exc)

    def _send_too_large(self, w: Work, route: Route, size: int, error: str) -> bool:
        """Replace ``w``'s copy by a dead letter without its payload (``too_large``)."""
        log.warning(
            "%s: routed copy to %s is too large for the broker (%d bytes): dead-lettered "
            "as %s without its payload",
            w.where,
            route.topic,
            size,
            DEAD_TOO_LARGE,
        )
        smaller = route_too_large(self.planner.plan, route, size, error)
        key = w.msg.key
        return self.router.send(
            smaller, key if key is None or len(key) <= 1024 else None, None, w.msg.partition, w
        )

    def take_stats(self) -> BatchStats:
        """This iteration's observations; a fresh accumulator starts."""
        # Answers collected after this iteration's settling reach the circuit breaker with the
        # next one, together with the failures that came before them (never ahead of those).
        rest = self.stats.answered - self._answered_fed
        rest_retried = self.stats.retried_ok - self._retried_fed
        stats, self.stats = self.stats, BatchStats()
        self._answered_fed = -rest
        self._retried_fed = -rest_retried
        return stats
