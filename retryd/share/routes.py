"""Where the share worker sends a record it does not simply accept: its tier or
``failed_topic`` (a copy, acks=all, then ACCEPT), a record on its last delivery, a record the
open circuit left uncalled, a record its lock cannot hold until its first attempt is due
(``retryd.share.delay``), and what a refused copy becomes. Part of ``ShareWorker``
(``retryd.share.worker``), kept apart to keep each module small."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import AcknowledgeType, KafkaError

from retryd.errors import DeliveryError, RetrydError
from retryd.handlers.base import Message
from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.headers import DEAD_EXHAUSTED, DEAD_NON_RETRYABLE, DEAD_REASON
from retryd.policy.oversize import DEAD_TOO_LARGE, route_too_large
from retryd.policy.routing import Route, RoutePlanner, planning_now_ms
from retryd.share.delay import not_due
from retryd.share.gate import ShareGate, not_called
from retryd.worker.events import BatchStats
from retryd.worker.router import Router
from retryd.worker.settle import TOO_LARGE_CODES, TRANSIENT_CODES

log = logging.getLogger(__name__)

LIMIT_CLASS = "delivery_count_limit"


@dataclass(slots=True, eq=False)
class Acquired:
    """One record of the batch in hand."""

    msg: Any  # the client's message
    view: Message
    acquired: float  # monotonic: the earliest its lock may have started (retryd.share.fetch)
    result: HandlerResult | None = None
    attempt: int = 0  # its running (or last) call's attempt: only that call's answer counts
    due: float = 0.0  # monotonic: not to be called before (delay=, retryd.share.delay)
    route: Route | None = None
    done: bool = field(default=False)


def acquired(msg: Any, since: float) -> Acquired:
    """A record of a poll, with the handler's view of it (built without copying a field)."""
    view = Message.__new__(Message)
    view._raw = msg
    view._env = None
    view._hdrs = None
    view.topic = msg.topic()
    view.partition = msg.partition()
    view.offset = msg.offset()
    return Acquired(msg, view, since)


class Routes:
    """The routing half of ``ShareWorker`` (which sets these attributes)."""

    parts: Any  # ShareParts
    planner: RoutePlanner
    router: Router
    gate: ShareGate
    limit: int
    stats: BatchStats
    fault: RetrydError | None

    def _ack(self, rec: Acquired, kind: AcknowledgeType) -> None:
        raise NotImplementedError

    def _plan(self, rec: Acquired, result: HandlerResult) -> Route:
        """Where a record's failure sends it: the route planner's verdict for a first attempt
        (a share-group record has no retry number: its retries are tier copies)."""
        view = rec.view
        return self.planner.route(
            view.topic,
            view.partition,
            view.offset,
            view.timestamp,
            0,
            None,
            view.headers,
            result,
            planning_now_ms(),  # rounded up: a due time is never before failure + delay
        )

    def _last_delivery(self, rec: Acquired, count: int) -> None:
        """The broker's last delivery of this record: dead-letter it (module docstring)."""
        message = (
            f"delivered {count} times (share.delivery.count.limit={self.limit}): the earlier "
            "deliveries never finished (their worker stopped or their lock expired)"
        )
        rec.result = HandlerResult(Outcome.DEAD, LIMIT_CLASS, message)
        route = self._plan(rec, rec.result)
        if route.dead_reason == DEAD_NON_RETRYABLE:  # not the handler's verdict: exhausted
            route.headers = [
                (k, DEAD_EXHAUSTED.encode("ascii") if k == DEAD_REASON else v)
                for k, v in route.headers
            ]
            route.dead_reason = DEAD_EXHAUSTED
        log.warning("%s: %s; dead-lettered to %s", rec.view.where, message, route.topic)
        self._route(rec, route)

    def _uncalled(self, rec: Acquired) -> int:
        """A record in hand whose lock runs out while the circuit is open: on to its tier
        without a call (no delivery used), or RELEASEd where its route would dead-letter it."""
        result = not_called(f"not called: the circuit was open ({self.gate.breaker.reason})")
        route = self._plan(rec, result)
        if route.is_dead:
            self._ack(rec, AcknowledgeType.RELEASE)
            return 1
        rec.result = result
        self._route(rec, route)
        return 1

    def _not_due(self, rec: Acquired, due_ms: int) -> None:
        """A record its lock cannot hold until its first attempt is due: on to its first tier
        without a call when that tier brings it back no earlier than due, else RELEASEd."""
        result = not_due(due_ms)
        route = self._plan(rec, result)
        if route.is_dead or route.due_ms is None or route.due_ms < due_ms:
            log.warning(
                "%s: its lock cannot hold it until its first attempt (delay=) and its tier "
                "would bring it back too early: released",
                rec.view.where,
            )
            self._ack(rec, AcknowledgeType.RELEASE)
            return
        rec.result = result
        self._route(rec, route)

    def _route(self, rec: Acquired, route: Route) -> None:
        if rec.route is None:
            self.parts.tracing.stamp(rec.view, route)
        rec.route = route
        self.router.send(route, rec.msg.key(), rec.msg.value(), rec.view.partition, rec)

    def _settle_reports(self) -> None:
        router = self.router
        router.poll()
        reports = router.reports
        while reports:
            report = reports.popleft()
            rec: Acquired = report.context
            if report.error is None:
                reason = report.route.dead_reason
                topic = rec.view.topic
                if reason is None:
                    self.stats.outcomes[(topic, "retried")] += 1
                else:
                    self.stats.outcomes[(topic, "dead")] += 1
                    self.stats.dead[reason] += 1
                self._ack(rec, AcknowledgeType.ACCEPT)
            else:
                self._refused(rec, report.route, report.error)

    def _refused(self, rec: Acquired, route: Route, err: KafkaError) -> None:
        """A copy not delivered: again when the cluster said "not now"; without its payload
        when too large; anything else stops the worker, the record unacknowledged (the broker
        hands it out again after its lock)."""
        if err.code() in TRANSIENT_CODES and not err.fatal():
            log.warning(
                "%s: copy to %s not delivered (%s): again", rec.view.where, route.topic, err.str()
            )
            self._route(rec, route)
            return
        if err.code() in TOO_LARGE_CODES and route.dead_reason != DEAD_TOO_LARGE:
            size = sum(len(v or b"") + len(k) for k, v in route.headers)
            size += len(rec.msg.value() or b"") + len(rec.msg.key() or b"")
            smaller = route_too_large(self.planner.plan, route, size, err.str())
            rec.route = smaller
            self.router.send(smaller, rec.msg.key(), None, rec.view.partition, rec)
            return
        self.fault = DeliveryError(
            f"routed copy of {rec.view.where} to {route.topic} failed: {err.str()}; the "
            "record stays unacknowledged and is handed out again after its lock"
        )
        log.error("%s", self.fault)
