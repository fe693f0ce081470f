"""The worker loop: one consumer (main and/or tier topics), one idempotent producer, and a pool
of handler slots (``max_in_flight`` calls at a time, ordered by ``ordering``).

Each iteration of the poll thread, which never waits on a handler:

1. release tier records that came due, ``consume()`` a batch, and turn it into work
   (``Intake``): runs for the scheduler, tier records into their in-memory tails;
2. hand new runs to the pool; abandon calls past their timeout;
3. settle finished calls (``Settler``): done, or a routed copy on its way;
4. flow control: pause partitions whose buffer is full, or all of them while memory or the
   producer's queue is full; resume below half (waiting is pause + resume, never a sleep);
5. store the contiguous settled prefix of every partition (auto-commit ships it), publish the
   iteration's events once, write the heartbeat.

Rebalance: a revoked partition's queued records are dropped (its next owner redoes them), its
in-flight calls are settled (bounded by the handler timeout), routed copies acknowledged, and
its offsets committed before it is released; the other partitions keep running. A lost
partition's results are discarded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from retryd.config import Role, Settings
from retryd.errors import HungHandlersError, KafkaRuntimeError, KafkaSetupError
from retryd.handlers.base import AsyncHandler, Handler, SyncHandler, is_async_handler
from retryd.kafka.clients import new_consumer, new_producer
from retryd.policy.routing import Route, RoutePlanner
from retryd.runtime.heartbeat import HeartbeatWriter
from retryd.worker.book import ConsumerLike, PartitionBook
from retryd.worker.clients import worker_consumer_config, worker_producer_config
from retryd.worker.events import Events, Sink
from retryd.worker.flow import flow_control
from retryd.worker.intake import WAITING, Intake
from retryd.worker.partition import PartitionState, partition_lags
from retryd.worker.pools import LoopPool, Pool, ThreadPool
from retryd.worker.router import ProducerLike, Router
from retryd.worker.scheduler import Scheduler
from retryd.worker.settle import Settler
from retryd.worker.summary import RunSummary
from retryd.worker.work import Work

log = logging.getLogger(__name__)

ConsumerFactory = Callable[[dict[str, Any]], ConsumerLike]
ProducerFactory = Callable[[dict[str, Any]], ProducerLike]

BUSY_POLL_S = 0.005  # consume() timeout while calls are in flight: settle results promptly
SETTLE_WAIT_S = 0.005
# While the pool has a full batch of runnable records it has not taken yet, the poll thread
# consumes nothing more (librdkafka keeps its own bounded prefetch) and lets the pool catch up.
# Past this long it pauses every partition instead, so consume() keeps serving the group.
THROTTLE_MAX_S = 1.0


def _now_ms() -> int:
    return int(time.time() * 1000)


class Worker:
    """Consumes the topics of its role and moves failed messages along the retry plan."""

    def __init__(
        self,
        settings: Settings,
        handler: Handler,
        *,
        role: Role | None = None,
        drain_grace_s: float = 1.0,
        consumer_factory: ConsumerFactory | None = None,
        producer_factory: ProducerFactory | None = None,
        sinks: Sequence[Sink] = (),
    ) -> None:
        self.settings = settings
        self.plan = settings.plan
        self.handler = handler
        self.role = role or settings.role
        self.drain_grace_s = drain_grace_s
        self.topics = topics_for_role(settings, self.role)
        if not self.topics:
            raise KafkaSetupError("nothing to consume: set main_topics (RETRYD_MAIN_TOPICS)")
        self.summary = RunSummary()
        self.events = Events([self.summary, *sinks])
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self._joined = False
        self._closing = False
        self._idle_since: float | None = None
        self._total_partitions = 0
        self._heartbeat: HeartbeatWriter | None = None
        self._beat_at = 0.0
        self._inflight_seen = -1
        self._paused_seen: dict[str, int] | None = None
        make_consumer: ConsumerFactory = consumer_factory or new_consumer  # type: ignore[assignment]
        self._make_producer: ProducerFactory = producer_factory or new_producer
        self._consumer = make_consumer(worker_consumer_config(settings, self.role, self._on_stats))
        self.book = PartitionBook(self._consumer, self.plan.tier_delays)
        self.scheduler = Scheduler()
        self.pool = self._make_pool(handler)
        self._router: Router | None = None
        self._settler: Settler | None = None
        self.intake = Intake(
            self.book,
            self.plan,
            settings.group_id,
            settings.ordering,
            settings.max_in_flight,
            self._route,
            self._consumer_error,
        )

    def _make_pool(self, handler: Handler) -> Pool:
        s = self.settings
        if is_async_handler(handler):
            assert isinstance(handler, AsyncHandler)
            return LoopPool(
                handler,
                self.scheduler,
                s.max_in_flight,
                s.handler_timeout_s,
                self.events.abandoned,
            )
        assert isinstance(handler, SyncHandler)
        return ThreadPool(
            handler, self.scheduler, s.max_in_flight, s.handler_timeout_s, self.events.abandoned
        )

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """Finish what was consumed (up to ``shutdown_timeout_s``), flush, commit and return.
        Signal-safe."""
        self._stop.set()

    def run(self, *, until_drained: bool = False) -> RunSummary:
        self._heartbeat = HeartbeatWriter(
            self.settings.state_dir, self.role.value, self.settings.group_id
        )
        self._heartbeat.beat(0, 0, "starting", force=True)
        try:
            counts = self._check_topics()
            self._total_partitions = sum(counts[t] for t in self.topics)
            producer = self._make_producer(worker_producer_config(self.settings))
            planner = RoutePlanner(self.plan, self.settings.group_id)
            settler = self._settler = Settler(planner, self.book, self._set_fatal)
            self._router = settler.router = Router(producer, counts, settler.acked, settler.failed)
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
        if self._fatal is not None:
            raise self._fatal
        return self.summary

    def _check_topics(self) -> dict[str, int]:
        """Fail fast, naming missing topics; returns partition counts for routing."""
        try:
            md = self._consumer.list_topics(timeout=10)
        except KafkaException as exc:
            raise KafkaRuntimeError(
                f"cannot reach the cluster at {self.settings.bootstrap_servers}: {exc}"
            ) from exc
        needed = [*self.topics, self.plan.failed_topic, *self.plan.tier_topics]
        missing = sorted({t for t in needed if t not in md.topics or md.topics[t].error})
        if missing:
            raise KafkaSetupError(
                f"missing topics: {', '.join(missing)} (create them with 'retryd topics create')"
            )
        return {t: len(md.topics[t].partitions) for t in set(needed)}

    def _set_fatal(self, exc: BaseException) -> None:
        if self._fatal is None:
            self._fatal = exc

    # ------------------------------------------------------------------ the loop
    def _loop(self, until_drained: bool) -> None:
        consumer, intake = self._consumer, self.intake
        settings = self.settings
        batch_size, poll_s = settings.batch_size, settings.poll_timeout_s
        scheduler = self.scheduler
        throttled_since: float | None = None
        while not self._stop.is_set() and self._fatal is None:
            started = time.monotonic()
            now_ms = _now_ms()
            intake.release_due(now_ms)
            self._dispatch()
            batch: list[Any] = []
            if scheduler.ready_items >= 2 * batch_size and not self.book.backlog_paused:
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
                    intake.take(batch, _now_ms(), self._stats())
                    self._dispatch()
            self._tick(started)
            if until_drained and self._drained(bool(batch)):
                log.info("drained: every assigned partition is at its end, nothing in flight")
                break

    def _stats(self) -> Any:
        assert self._settler is not None
        return self._settler.stats

    def _poll_timeout(self, poll_s: float) -> float:
        if self.pool.completions or (self._router is not None and self._router.blocked):
            return 0.0
        timeout = BUSY_POLL_S if self.pool.running() or len(self.scheduler) else poll_s
        due = self.intake.next_due_ms()
        if due is not None:
            timeout = min(timeout, max(0.0, (due - _now_ms()) / 1000))
        return timeout

    def _dispatch(self) -> None:
        works = self.intake.works()
        if works:
            self.scheduler.submit(works)
        self.pool.wake(len(self.scheduler))

    def _tick(self, started: float) -> None:
        """Everything after consume(): settle, flow control, store, publish, heartbeat."""
        router, settler, pool = self._router, self._settler, self.pool
        assert router is not None and settler is not None
        router.poll()
        pool.watchdog()
        settler.settle(pool.completions)
        router.poll()
        self._flow_control(router)
        self.book.store()
        self._flush_stats(started)
        self._publish_gauges()
        if pool.hung > self.settings.max_abandoned_handlers:
            self._set_fatal(
                HungHandlersError(
                    f"{pool.hung} handler calls are hung past their timeout "
                    f"(max_abandoned_handlers={self.settings.max_abandoned_handlers}); "
                    "exiting so the process is restarted"
                )
            )
        self._beat()

    def _flow_control(self, router: Router) -> None:
        s = self.settings
        flow_control(self.book, s.partition_buffer, s.tier_buffer, s.buffer_bytes, router.blocked)

    def _publish_gauges(self) -> None:
        running = self.pool.running()
        if running != self._inflight_seen:
            self._inflight_seen = running
            self.events.inflight(running)
        paused = self.book.paused_by_topic()
        if paused != self._paused_seen:
            self._paused_seen = paused
            self.events.paused(paused)

    def _route(self, w: Work, route: Route) -> None:
        assert self._settler is not None
        self._settler.route(w, route)

    def _consumer_error(self, raw: Any) -> None:
        """End-of-partition bookkeeping; anything else is logged (client errors carry no topic)."""
        err: KafkaError = raw.error()
        topic, partition, offset = raw.topic(), raw.partition(), raw.offset()
        if err.code() == KafkaError._PARTITION_EOF and topic is not None:
            st = self.book.parts.get((topic, partition))
            if st is not None:
                st.eof_at = offset
                if st.position is None:
                    st.position = offset
            return
        if err.fatal():
            self._set_fatal(KafkaRuntimeError(f"fatal consumer error: {err}"))
        where = f"{topic}[{partition}]" if topic is not None else "consumer"
        log.error("%s error: %s", where, err)

    # ------------------------------------------------------------------ settling
    def _settle_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Keep settling results (and writing heartbeats) until ``done()`` or the deadline."""
        router, settler = self._router, self._settler
        deadline = time.monotonic() + timeout_s
        while True:
            if router is not None and settler is not None:
                router.poll()
                self.pool.watchdog()
                settler.settle(self.pool.completions)
                router.poll()
            if done():
                return True
            if time.monotonic() >= deadline:
                return False
            self._beat()
            time.sleep(SETTLE_WAIT_S)  # a bounded settle wait (revoke, shutdown), not polling

    def _release(self, states: list[PartitionState], *, why: str) -> None:
        """Give partitions up cleanly: nothing new starts except queued main-topic records
        below one that already started (so the commit covers every started record), in-flight
        calls settle (bounded by the handler timeout), routed copies are acknowledged, offsets
        committed."""
        for st in states:
            if not st.is_tier:  # a tier's queued records may not be due yet
                st.run_below = st.started_end()
            st.revoked = True
            self.intake.forget(st)
        grace = self.settings.handler_timeout_s + 1.0

        def settled() -> bool:
            return self.pool.running(states) == 0 and all(st.gaps_done() for st in states)

        if not self._settle_until(settled, grace):
            log.warning("%s: calls still running after %.1fs; leaving them", why, grace)
        self._settle_until(lambda: not self.pool.completions, 1.0)
        if self._router is not None:
            remaining = self._router.flush(30)
            if remaining:
                log.error(
                    "%s: %d routed copies undelivered; their inputs stay uncommitted",
                    why,
                    remaining,
                )
        self.book.store(states)
        self.book.commit_sync(states)

    def _shutdown(self) -> None:
        try:
            if self._router is not None and (
                self._fatal is None or isinstance(self._fatal, HungHandlersError)
            ):
                self._finish_consumed()
            states = list(self.book.parts.values())
            self._release(states, why="shutdown")
            self._closing = True
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.error("error while closing the consumer: %s", exc)
        finally:
            self.pool.close(1.0)
            self._flush_stats()
            if self._heartbeat is not None:
                self._heartbeat.remove()
            self.events.paused({})
            self.events.inflight(0)

    def _flush_stats(self, started: float | None = None) -> None:
        """Collect the slots' counts and emit what this batch observed. Also called once at
        shutdown: a slot clears its claim before it records the call, so a call that ended
        just before the stop may not have reached a batch's collection yet."""
        settler = self._settler
        if settler is None:
            return
        self.pool.collect(settler.stats)
        stats = settler.take_stats()
        if stats:
            ended = time.monotonic()
            self.events.batch(stats, ended if started is None else started, ended)

    def _finish_consumed(self) -> None:
        """On a clean stop, finish the records already consumed (not the ones waiting for
        their due time), so a restart redoes as little as possible."""

        def finished() -> bool:
            for st in self.book.parts.values():
                for w in st.pending:
                    if Work.QUEUED <= w.state <= Work.ROUTING:
                        return False
            return True

        if not self._settle_until(finished, self.settings.shutdown_timeout_s):
            log.warning(
                "shutdown: records still unfinished after %gs; they are redone by the next owner",
                self.settings.shutdown_timeout_s,
            )

    # ------------------------------------------------------------------ rebalance
    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._joined = True
        self.events.rebalance("assign", len(partitions))
        self.book.assign(partitions)
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
            st.lost = st.revoked = True
            self.intake.forget(st)
        log.warning(
            "lost %s (session timed out); their uncommitted work will be redone", _fmt(partitions)
        )
        self.book.forget(states)
        self.events.forget([(st.topic, st.partition) for st in states])

    # ------------------------------------------------------------------ observability
    def _on_stats(self, raw: str) -> None:
        lags = {tp: lag for tp, lag in partition_lags(raw).items() if tp in self.book.parts}
        if lags:
            self.events.lag(lags)

    def _beat(self) -> None:
        hb = self._heartbeat
        now = time.monotonic()
        if hb is None or now - self._beat_at < hb.interval_s:
            return
        self._beat_at = now
        book, router = self.book, self._router
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
            produced={f"{t}/{p}": end for (t, p), end in router.produced_end.items()}
            if router
            else {},
        )

    def _idle(self) -> bool:
        """Nothing left to do right now on the partitions this process owns."""
        router = self._router
        busy = router is not None and (router.inflight or router.blocked)
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
        return now - self._idle_since >= self.drain_grace_s


def topics_for_role(settings: Settings, role: Role) -> list[str]:
    topics: list[str] = []
    if role in (Role.ALL, Role.MAIN):
        topics += settings.main_topics
    if role in (Role.ALL, Role.TIERS):
        topics += settings.plan.tier_topics
    return topics


def _fmt(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing"


__all__ = ["WAITING", "Worker", "topics_for_role"]
