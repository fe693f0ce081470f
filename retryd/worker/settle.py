"""Phase 3 of every poll: finished handler calls become settled records.

Success and DROP settle at once; RETRY and DEAD route a copy (to the next tier or
``failed_topic``) and settle when the broker acknowledges it (acks=all). A record of a *lost*
partition is discarded: its next owner redoes it from the committed offset.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from confluent_kafka import KafkaError

from retryd.errors import DeliveryError
from retryd.policy.classify import Outcome
from retryd.policy.routing import Route, RoutePlanner
from retryd.worker.book import PartitionBook
from retryd.worker.events import BatchStats
from retryd.worker.router import Router
from retryd.worker.work import Work

log = logging.getLogger(__name__)

_SUCCESS = Outcome.SUCCESS
_DROP = Outcome.DROP


class Settler:
    def __init__(
        self,
        planner: RoutePlanner,
        book: PartitionBook,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self.planner = planner
        self.router: Router  # set by the worker once the producer exists
        self.book = book
        self._on_fatal = on_fatal
        self.stats = BatchStats()

    def settle(self, completions: deque[Work]) -> int:
        """Route every finished call that failed (successes settle on their slot); returns
        how many."""
        if not completions:
            return 0
        now_ms = int(time.time() * 1000)
        n = 0
        popleft = completions.popleft
        while completions:
            w = popleft()
            n += 1
            if w.part.lost:
                continue
            result = w.result
            assert result is not None
            if result.outcome is _SUCCESS or result.outcome is _DROP:  # never queued here
                w.state = Work.DONE
                continue
            env = w._env
            if env is None:  # first failure, on a main topic: the record is its own origin
                raw = w._raw
                route = self.planner.route(
                    w.topic,
                    w.partition,
                    w.offset,
                    raw.timestamp()[1] if raw is not None else w.timestamp,
                    0,
                    None,
                    raw.headers() if raw is not None else w.headers,
                    result,
                    now_ms,
                )
            else:
                route = self.planner.failure(env, w.headers, result, now_ms)
            if route.is_dead:
                log.info(
                    "%s dead-lettered (%s): %s", w.where, route.dead_reason, result.error_class
                )
            self.route(w, route)
        return n

    def route(self, w: Work, route: Route) -> None:
        """Send ``w``'s routed copy; ``w`` settles on the acknowledgement (``acked``)."""
        w.state = Work.ROUTING
        raw = w._raw
        if raw is not None:
            self.router.send(route, raw.key(), raw.value(), w.partition, w)
        else:
            self.router.send(route, w.key, w.value, w.partition, w)

    def acked(self, w: Work, route: Route, partition: int, offset: int) -> None:
        """The broker acknowledged ``w``'s copy (acks=all): ``w`` is done."""
        w.state = Work.DONE
        stats = self.stats  # the current iteration's, not the one at send time
        reason = route.dead_reason
        if reason is None:
            stats.outcomes[(w.topic, "retried")] += 1
        else:
            stats.outcomes[(w.topic, "dead")] += 1
            stats.dead[reason] += 1
        target = self.book.parts.get((route.topic, partition))
        if target is not None and offset + 1 > target.known_end:
            target.known_end = offset + 1

    def failed(self, w: Work, route: Route, err: KafkaError) -> None:
        """The copy could not be delivered: stop, leaving ``w``'s offset uncommitted."""
        hint = ""
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            hint = (
                " (the copy carries retryd headers on top of the original: raise the producer's"
                " message.max.bytes and the tier/failed topics' max.message.bytes)"
            )
        exc = DeliveryError(
            f"routed copy of {w.where} to {route.topic} failed: {err.str()}{hint}; "
            "the input stays uncommitted and is redone after a restart"
        )
        log.error("%s", exc)
        self._on_fatal(exc)

    def take_stats(self) -> BatchStats:
        """This iteration's observations; a fresh accumulator starts."""
        stats, self.stats = self.stats, BatchStats()
        return stats
