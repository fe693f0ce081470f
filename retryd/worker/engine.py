"""The worker loop: one consumer (main and/or tier topics), one idempotent producer.

Waiting for a due time is pause + seek + resume, never a sleep: the loop keeps calling
``consume()`` so group membership and rebalance callbacks keep running during long waits.
Offsets are stored (``enable.auto.offset.store=false``) only for the contiguous prefix of finished
messages of each partition; auto-commit ships them, and revoke/shutdown commit synchronously.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as KMessage

from retryd.config import Role, Settings
from retryd.errors import DeliveryError, HeaderError, KafkaSetupError
from retryd.handlers.base import Handler, HandlerShutdown, Message
from retryd.metrics import registry as m
from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.headers import Envelope, decode_tier_envelope, envelope_for_source
from retryd.policy.routing import Route, route_failure, route_malformed
from retryd.runtime.heartbeat import HeartbeatWriter
from retryd.worker.book import PartitionBook
from retryd.worker.clients import worker_consumer_config, worker_producer_config
from retryd.worker.partition import PartitionState, partition_lags
from retryd.worker.router import Router
from retryd.worker.schedule import TP
from retryd.worker.summary import RunSummary

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class _Work:
    """One consumed message on its way through the handler (or straight to a route)."""

    msg: KMessage
    tp: TP
    state: PartitionState
    offset: int
    headers: list[tuple[str, bytes | None]]
    env: Envelope | None  # decoded tier envelope; None on a main topic until it is needed
    route: Route | None  # decided without the handler (malformed headers)

    def envelope(self) -> Envelope:
        if self.env is None:
            self.env = envelope_for_source(
                self.tp[0], self.tp[1], self.offset, self.msg.timestamp()[1]
            )
        return self.env

    @property
    def where(self) -> str:
        return f"{self.tp[0]}[{self.tp[1]}]@{self.offset}"

    def handler_message(self) -> Message:
        env = self.env  # None: first delivery from a main topic, which is its own origin
        return Message(
            key=self.msg.key(),
            value=self.msg.value(),
            headers=self.headers,
            topic=self.tp[0],
            partition=self.tp[1],
            offset=self.offset,
            timestamp=self.msg.timestamp()[1],
            retry_number=env.retry_number if env else 0,
            original_topic=env.original_topic if env else self.tp[0],
            original_partition=env.original_partition if env else self.tp[1],
            original_offset=env.original_offset if env else self.offset,
        )


class Worker:
    """Consumes the topics of its role and moves failed messages along the retry plan."""

    def __init__(
        self,
        settings: Settings,
        handler: Handler,
        *,
        role: Role | None = None,
        drain_grace_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self.plan = settings.plan
        self.handler = handler
        self.role = role or settings.role
        self.drain_grace_s = drain_grace_s
        self.main_topics = list(settings.main_topics)
        self.tier_delays = self.plan.tier_delays
        self.topics = topics_for_role(settings, self.role)
        if not self.topics:
            raise KafkaSetupError("nothing to consume: set main_topics (RETRYD_MAIN_TOPICS)")
        self.summary = RunSummary()
        self._hot = m.HotPath()
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self._joined = False
        self._closing = False
        self._idle_since: float | None = None
        self._consumer = Consumer(worker_consumer_config(settings, self.role, self._on_stats))
        self._book = PartitionBook(self._consumer, self.tier_delays)
        self._router: Router | None = None
        self._total_partitions = 0
        self._heartbeat: HeartbeatWriter | None = None

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """Ask the loop to finish the current message, flush, commit and return (signal-safe)."""
        self._stop.set()

    def run(self, *, until_drained: bool = False) -> RunSummary:
        self._heartbeat = HeartbeatWriter(
            self.settings.state_dir, self.role.value, self.settings.group_id
        )
        self._heartbeat.beat(0, 0, "starting", force=True)
        try:
            counts = self._check_topics()
            self._total_partitions = sum(counts[t] for t in self.topics)
            self._router = Router(worker_producer_config(self.settings), counts)
            self._consumer.subscribe(
                self.topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            log.info(
                "worker role=%s group=%s topics=%s", self.role, self.settings.group_id, self.topics
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
            raise KafkaSetupError(
                f"cannot reach the cluster at {self.settings.bootstrap_servers}: {exc}"
            ) from exc
        needed = [*self.topics, self.plan.failed_topic, *self.tier_delays]
        missing = sorted({t for t in needed if t not in md.topics or md.topics[t].error})
        if missing:
            raise KafkaSetupError(
                f"missing topics: {', '.join(missing)} (create them with 'retryd topics create')"
            )
        return {t: len(md.topics[t].partitions) for t in set(needed)}

    def _loop(self, until_drained: bool) -> None:
        assert self._router is not None
        consumer, router, book = self._consumer, self._router, self._book
        poll_s = self.settings.poll_timeout_s
        budget_s = self.settings.max_poll_interval_ms / 1000 / 3
        while not self._stop.is_set() and self._fatal is None:
            book.resume_due(_now_ms())
            timeout = poll_s
            next_due = book.schedule.next_due_ms()
            if next_due is not None:
                timeout = max(0.0, min(poll_s, (next_due - _now_ms()) / 1000))
            batch = consumer.consume(self.settings.batch_size, timeout)
            router.poll()
            started = time.monotonic()
            work = self._prepare(batch)
            self._handle(work, started + budget_s)
            router.poll()
            if work:
                self.summary.batch_done(started, time.monotonic())
            book.store()
            self._beat()
            if until_drained and self._drained(bool(batch)):
                log.info("drained: every assigned partition is at its end, nothing in flight")
                break

    def _shutdown(self) -> None:
        router = self._router
        try:
            if router is not None:
                remaining = router.flush(30)
                if remaining:
                    log.error(
                        "%d routed copies undelivered at shutdown; their inputs stay uncommitted",
                        remaining,
                    )
            self._book.store()
            self._book.commit_sync()
            self._closing = True
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.error("error while closing the consumer: %s", exc)
        finally:
            if self._heartbeat is not None:
                self._heartbeat.remove()
            self._book.clear_paused_gauge()
            self.handler.close()

    # ------------------------------------------------------------------ per batch
    def _prepare(self, batch: list[KMessage]) -> list[_Work]:
        """Phase 1, no business code: bookkeeping, due checks (pause + seek), malformed routes."""
        work: list[_Work] = []
        now = _now_ms()
        for msg in batch:
            topic, partition, err = msg.topic(), msg.partition(), msg.error()
            if err is not None:
                self._consumer_error(err, topic, partition, msg.offset())
                continue
            assert topic is not None and partition is not None
            tp = (topic, partition)
            state = self._book.parts.get(tp)
            if state is None or state.paused:
                continue  # revoked, or behind a not-yet-due head: re-fetched after resume
            offset = msg.offset() or 0
            if state.position is not None and offset < state.position:
                continue  # stale prefetch from before a seek
            state.position = offset + 1
            headers = cast(list[tuple[str, bytes | None]], msg.headers() or [])
            if topic not in self.tier_delays:
                work.append(_Work(msg, tp, state, offset, headers, None, None))
                continue
            try:
                env = decode_tier_envelope(headers)
            except HeaderError as exc:
                log.warning(
                    "malformed retryd headers at %s[%d]@%d: %s", topic, partition, offset, exc
                )
                route = route_malformed(
                    self.plan, topic, partition, offset, msg.timestamp()[1], headers, str(exc), now
                )
                work.append(_Work(msg, tp, state, offset, headers, None, route))
                continue
            due = env.retry_timestamp or 0
            if due > now:
                self._book.pause_until(tp, state, offset, due)
                continue
            self._hot.lateness_seconds(topic, (now - due) / 1000)
            work.append(_Work(msg, tp, state, offset, headers, env, None))
        return work

    def _handle(self, work: list[_Work], deadline: float) -> None:
        """Phase 2: call the handler in order; stop at the budget, on stop, or on a fatal error,
        and give the unprocessed rest back to the consumer (seek)."""

        def cancel() -> bool:
            return self._stop.is_set() or self._fatal is not None or time.monotonic() > deadline

        calls = [w.handler_message() for w in work if w.route is None]
        results = self.handler.call_many(calls, cancel)
        done = 0
        try:
            for item in work:
                if item.route is None:
                    try:
                        result, seconds = next(results)
                    except StopIteration:
                        break
                    except HandlerShutdown as exc:
                        log.warning(
                            "handler asked to exit at %s: %s; stopping without acking it",
                            item.where,
                            exc,
                        )
                        self._stop.set()
                        return
                    self._hot.handler_seconds(item.tp[0], seconds)
                    item.state.tracker.begin(item.offset)
                    self._settle(item, result)
                else:
                    item.state.tracker.begin(item.offset)
                    self._route(item.tp, item.state, item.offset, item.route, item.msg)
                done += 1
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()  # a generator: stops the handler thread after its running call
        if self.handler.abandoned > self.settings.max_abandoned_handlers:
            self._fatal = KafkaSetupError(
                f"{self.handler.abandoned} handler calls are hung past their timeout "
                f"(max_abandoned_handlers={self.settings.max_abandoned_handlers}); "
                "exiting so the process is restarted"
            )
        if done < len(work) and not self._stop.is_set() and self._fatal is None:
            log.info("batch reached its time budget (a third of max.poll.interval.ms): polling")
            first: dict[TP, int] = {}
            for item in work[done:]:
                first.setdefault(item.tp, item.offset)
            self._book.rewind(first)

    def _settle(self, item: _Work, result: HandlerResult) -> None:
        topic, offset = item.tp[0], item.offset
        if result.outcome is Outcome.SUCCESS or result.outcome is Outcome.DROP:
            item.state.tracker.finish(offset)
            outcome = "success" if result.outcome is Outcome.SUCCESS else "dropped"
            self._hot.message(topic, outcome)
            self.summary.count(topic, outcome)
            return
        route = route_failure(self.plan, item.envelope(), item.headers, result, _now_ms())
        if route.is_dead:
            log.info("%s dead-lettered (%s): %s", item.where, route.dead_reason, result.error_class)
        else:
            log.debug(
                "%s failed (%s), retry %d via %s",
                item.where,
                result.error_class,
                route.retry_number,
                route.topic,
            )
        self._route(item.tp, item.state, offset, route, item.msg)

    def _consumer_error(
        self, err: KafkaError, topic: str | None, partition: int | None, offset: int | None
    ) -> None:
        """End-of-partition bookkeeping; anything else is logged (client errors carry no topic)."""
        if err.code() == KafkaError._PARTITION_EOF and topic is not None and partition is not None:
            state = self._book.parts.get((topic, partition))
            if state is not None:
                state.eof_at = offset
                if state.position is None:
                    state.position = offset
            return
        if err.fatal():
            self._fatal = KafkaSetupError(f"fatal consumer error: {err}")
        where = f"{topic}[{partition}]" if topic is not None else "consumer"
        log.error("%s error: %s", where, err)

    def _route(
        self, tp: TP, state: PartitionState, offset: int, route: Route, msg: KMessage
    ) -> None:
        assert self._router is not None
        source_topic = tp[0]

        def acked(partition: int, out_offset: int) -> None:
            state.tracker.finish(offset)  # the state captured at send time, even if since revoked
            target = self._book.parts.get((route.topic, partition))
            if target is not None:
                target.known_end = max(target.known_end, out_offset + 1)
            outcome = "dead" if route.is_dead else "retried"
            self._hot.message(source_topic, outcome)
            self.summary.count(source_topic, outcome)
            if route.dead_reason:
                m.DEAD_LETTERS.labels(reason=route.dead_reason).inc()
                self.summary.dead_reasons[route.dead_reason] += 1

        def failed(err: KafkaError) -> None:
            hint = ""
            if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                hint = (
                    " (the copy carries retryd headers on top of the original: raise the producer's"
                    " message.max.bytes and the tier/failed topics' max.message.bytes)"
                )
            self._fatal = DeliveryError(
                f"routed copy of {source_topic}[{tp[1]}]@{offset} to {route.topic} failed: "
                f"{err.str()}{hint}; the input stays uncommitted and is redone after a restart"
            )
            log.error("%s", self._fatal)

        self._router.send(route, msg.key(), msg.value(), tp[1], acked, failed)

    # ------------------------------------------------------------------ rebalance
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._joined = True
        m.REBALANCES.labels(kind="assign").inc()
        self.summary.rebalances["assign"] += 1
        self._book.assign(partitions)
        log.info("assigned %s", _fmt(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not self._closing:  # the revoke of a clean close is not a rebalance
            m.REBALANCES.labels(kind="revoke").inc()
            self.summary.rebalances["revoke"] += 1
        if self._router is not None:
            remaining = self._router.flush(30)
            if remaining:
                log.error(
                    "revoke: %d routed copies undelivered; their inputs stay uncommitted", remaining
                )
        self._book.commit_revoked(partitions)
        self._book.forget(partitions)
        log.info("revoked %s", _fmt(partitions))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        m.REBALANCES.labels(kind="lost").inc()
        self.summary.rebalances["lost"] += 1
        log.warning(
            "lost %s (session timed out); their uncommitted work will be redone", _fmt(partitions)
        )
        self._book.forget(partitions)

    # ------------------------------------------------------------------ observability
    def _on_stats(self, raw: str) -> None:
        for (topic, partition), lag in partition_lags(raw).items():
            if (topic, partition) in self._book.parts:
                m.CONSUMER_LAG.labels(topic=topic, partition=str(partition)).set(lag)

    def _beat(self) -> None:
        if self._heartbeat is not None:
            book, router = self._book, self._router
            self._heartbeat.beat(
                len(book.parts),
                len(book.schedule),
                drained=self._idle(),
                positions={
                    f"{t}/{p}": st.position
                    for (t, p), st in book.parts.items()
                    if st.position is not None
                },
                produced={f"{t}/{p}": end for (t, p), end in router.produced_end.items()}
                if router
                else {},
            )

    def _idle(self) -> bool:
        """Nothing left to do right now on the partitions this process owns."""
        return self._joined and not (self._router and self._router.inflight) and self._book.idle()

    def _drained(self, busy: bool) -> bool:
        """Single-process drain: idle *and* owning every partition (an empty assignment while a
        departed member is still being timed out is not "drained")."""
        now = time.monotonic()
        if busy or not self._idle() or len(self._book.parts) < self._total_partitions:
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
