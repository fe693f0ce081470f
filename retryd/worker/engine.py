"""The worker loop: one consumer (main and/or tier topics), one idempotent producer.

Waiting for a due time is pause + seek + resume, never a sleep: the loop keeps calling
``consume()`` so group membership and rebalance callbacks keep running during long waits.
Offsets are stored (``enable.auto.offset.store=false``) only for the contiguous prefix of finished
messages of each partition; auto-commit ships them, and revoke/shutdown commit synchronously.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka import Message as KMessage

from retryd.config import Role, Settings
from retryd.errors import DeliveryError, HeaderError, KafkaSetupError
from retryd.handlers.base import Handler, HandlerShutdown, Message
from retryd.metrics import registry as m
from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.headers import Envelope, decode_tier_envelope, envelope_for_source
from retryd.policy.routing import Route, route_failure, route_malformed, target_partition
from retryd.runtime.heartbeat import HeartbeatWriter
from retryd.worker.clients import consumer_config, producer_config
from retryd.worker.offsets import OffsetTracker
from retryd.worker.schedule import TP, PauseSchedule
from retryd.worker.summary import RunSummary

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Partition:
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    paused: bool = False
    position: int | None = None  # next offset to consume
    eof_at: int | None = None  # high watermark reported by the last end-of-partition event
    known_end: int = 0  # one past the highest offset we know exists (from our own deliveries)

    def drained(self) -> bool:
        """At the end of the partition as far as we know, with nothing in progress."""
        if self.paused or self.tracker.pending or self.eof_at is None:
            return False
        position = self.eof_at if self.position is None else self.position
        return position >= max(self.eof_at, self.known_end)


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
        self._parts: dict[TP, _Partition] = {}
        self._schedule = PauseSchedule()
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self._inflight = 0
        self._joined = False
        self._closing = False
        self._idle_since: float | None = None
        self._partition_counts: dict[str, int] = {}
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
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
        self._producer = Producer(producer_config(self.settings))
        self._consumer = Consumer(consumer_config(self.settings, self.role, self._on_stats))
        try:
            self._check_topics()
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

    def _check_topics(self) -> None:
        assert self._consumer is not None
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
        self._partition_counts = {t: len(md.topics[t].partitions) for t in set(needed)}

    def _loop(self, until_drained: bool) -> None:
        assert self._consumer is not None and self._producer is not None
        consumer, producer = self._consumer, self._producer
        poll_s = self.settings.poll_timeout_s
        while not self._stop.is_set() and self._fatal is None:
            self._resume_due()
            timeout = poll_s
            next_due = self._schedule.next_due_ms()
            if next_due is not None:
                timeout = max(0.0, min(poll_s, (next_due - _now_ms()) / 1000))
            batch = consumer.consume(self.settings.batch_size, timeout)
            producer.poll(0)
            for msg in batch:
                if self._stop.is_set() or self._fatal is not None:
                    break
                self._dispatch(msg)
            producer.poll(0)
            self._store_offsets()
            self._beat()
            if until_drained and self._drained(bool(batch)):
                log.info("drained: every assigned partition is at its end, nothing in flight")
                break

    def _shutdown(self) -> None:
        consumer, producer = self._consumer, self._producer
        try:
            if producer is not None:
                remaining = producer.flush(30)
                if remaining:
                    log.error(
                        "%d routed copies undelivered at shutdown; their inputs stay uncommitted",
                        remaining,
                    )
            if consumer is not None:
                self._store_offsets()
                self._commit_sync(None)
                self._closing = True
                consumer.close()
        except KafkaException as exc:
            log.error("error while closing the consumer: %s", exc)
        finally:
            self._consumer = None
            if self._heartbeat is not None:
                self._heartbeat.remove()
            for topic in self._schedule.topics():
                m.PAUSED_PARTITIONS.labels(topic=topic).set(0)
            self.handler.close()

    # ------------------------------------------------------------------ per message
    def _dispatch(self, msg: KMessage) -> None:
        topic, partition = msg.topic(), msg.partition()
        assert topic is not None and partition is not None
        tp = (topic, partition)
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                state = self._parts.get(tp)
                if state is not None:
                    state.eof_at = msg.offset()
                    if state.position is None:
                        state.position = msg.offset()
                return
            if err.fatal():
                self._fatal = KafkaSetupError(f"fatal consumer error: {err}")
            log.error("consumer error on %s[%s]: %s", topic, partition, err)
            return
        state = self._parts.get(tp)
        if state is None or state.paused:
            return  # revoked, or behind a not-yet-due head: re-fetched after resume
        offset = msg.offset()
        assert offset is not None
        if state.position is not None and offset < state.position:
            return  # stale prefetch from before a seek
        state.position = offset + 1
        headers = cast(list[tuple[str, bytes | None]], list(msg.headers() or []))
        now = _now_ms()
        if topic in self.tier_delays:
            try:
                env = decode_tier_envelope(headers)
            except HeaderError as exc:
                log.warning(
                    "malformed retryd headers at %s[%d]@%d: %s", topic, partition, offset, exc
                )
                state.tracker.begin(offset)
                route = route_malformed(
                    self.plan, topic, partition, offset, msg.timestamp()[1], headers, str(exc), now
                )
                self._produce(tp, offset, route, msg)
                return
            due = env.retry_timestamp or 0
            if due > now:
                self._pause_until(tp, state, offset, due)
                return
            m.DUE_LATENESS.labels(topic=topic).observe((now - due) / 1000)
        else:
            env = envelope_for_source(topic, partition, offset, msg.timestamp()[1])
        state.tracker.begin(offset)
        result = self._call_handler(msg, env, headers)
        if result is None:
            return  # shutdown requested by business code: offset stays unfinished
        if result.outcome is Outcome.SUCCESS or result.outcome is Outcome.DROP:
            state.tracker.finish(offset)
            outcome = "success" if result.outcome is Outcome.SUCCESS else "dropped"
            m.MESSAGES.labels(topic=topic, outcome=outcome).inc()
            self.summary.count(topic, outcome)
            return
        route = route_failure(self.plan, env, headers, result, _now_ms())
        if not route.is_dead:
            log.debug(
                "%s[%d]@%d failed (%s), retry %d via %s",
                topic,
                partition,
                offset,
                result.error_class,
                route.retry_number,
                route.topic,
            )
        else:
            log.info(
                "%s[%d]@%d dead-lettered (%s): %s",
                topic,
                partition,
                offset,
                route.dead_reason,
                result.error_class,
            )
        self._produce(tp, offset, route, msg)

    def _call_handler(self, msg: KMessage, env: Envelope, headers: list) -> HandlerResult | None:
        topic = msg.topic() or ""
        message = Message(
            key=msg.key(),
            value=msg.value(),
            headers=headers,
            topic=topic,
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            timestamp=msg.timestamp()[1],
            retry_number=env.retry_number,
            original_topic=env.original_topic,
            original_partition=env.original_partition,
            original_offset=env.original_offset,
        )
        started = time.perf_counter()
        try:
            result = self.handler(message)
        except HandlerShutdown as exc:
            log.warning(
                "handler asked to exit at %s[%d]@%d: %s; stopping without acking it",
                topic,
                message.partition,
                message.offset,
                exc,
            )
            self._stop.set()
            return None
        finally:
            m.HANDLER_DURATION.labels(topic=topic).observe(time.perf_counter() - started)
        if self.handler.abandoned > self.settings.max_abandoned_handlers:
            self._fatal = KafkaSetupError(
                f"{self.handler.abandoned} handler calls are hung past their timeout "
                f"(max_abandoned_handlers={self.settings.max_abandoned_handlers}); "
                "exiting so the process is restarted"
            )
        return result

    def _produce(self, tp: TP, offset: int, route: Route, msg: KMessage) -> None:
        assert self._producer is not None
        partition = target_partition(tp[1], self._partition_counts.get(route.topic))
        source_topic = tp[0]

        def delivered(err: KafkaError | None, out: KMessage) -> None:
            self._inflight -= 1
            if err is not None:
                self._fatal = DeliveryError(
                    f"routed copy of {source_topic}[{tp[1]}]@{offset} "
                    f"to {route.topic} failed: {err}"
                )
                log.error("%s", self._fatal)
                return
            state = self._parts.get(tp)
            if state is not None:
                state.tracker.finish(offset)
            target = self._parts.get((route.topic, out.partition() or 0))
            if target is not None:
                target.known_end = max(target.known_end, (out.offset() or 0) + 1)
            outcome = "dead" if route.is_dead else "retried"
            m.MESSAGES.labels(topic=source_topic, outcome=outcome).inc()
            self.summary.count(source_topic, outcome)
            if route.dead_reason:
                m.DEAD_LETTERS.labels(reason=route.dead_reason).inc()
                self.summary.dead_reasons[route.dead_reason] += 1

        kwargs: dict = {
            "key": msg.key(),
            "value": msg.value(),
            "headers": route.headers,
            "timestamp": route.timestamp_ms,
            "on_delivery": delivered,
        }
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(route.topic, **kwargs)
                break
            except BufferError:
                self._producer.poll(0.05)  # local queue full: serve delivery reports to make room
        self._inflight += 1

    # ------------------------------------------------------------------ waiting
    def _pause_until(self, tp: TP, state: _Partition, offset: int, due_ms: int) -> None:
        assert self._consumer is not None
        self._store_offsets(only=tp)  # store before seeking the same partition
        part = TopicPartition(tp[0], tp[1], offset)
        self._consumer.pause([part])
        self._consumer.seek(part)
        state.paused = True
        state.position = offset
        self._schedule.add(tp, offset, due_ms)
        self._update_paused_gauge()

    def _resume_due(self) -> None:
        if not len(self._schedule):
            return
        waits = self._schedule.pop_due(_now_ms())
        if not waits:
            return
        assert self._consumer is not None
        parts = []
        for wait in waits:
            state = self._parts.get(wait.tp)
            if state is not None and state.paused:
                state.paused = False
                parts.append(TopicPartition(wait.tp[0], wait.tp[1]))
        if parts:
            self._consumer.resume(parts)
        self._update_paused_gauge()

    def _update_paused_gauge(self) -> None:
        counts = self._schedule.topics()
        for topic in self.tier_delays:
            m.PAUSED_PARTITIONS.labels(topic=topic).set(counts.get(topic, 0))

    # ------------------------------------------------------------------ offsets
    def _store_offsets(self, only: TP | None = None) -> None:
        if self._consumer is None:
            return
        items = [(only, self._parts[only])] if only in self._parts else self._parts.items()
        offsets = []
        for tp, state in items:
            if tp is None:
                continue
            nxt = state.tracker.take_store()
            if nxt is not None:
                offsets.append(TopicPartition(tp[0], tp[1], nxt))
        if offsets:
            try:
                self._consumer.store_offsets(offsets=offsets)
            except KafkaException as exc:
                log.warning("storing offsets failed (partition no longer assigned?): %s", exc)

    def _commit_sync(self, parts: list[TopicPartition] | None) -> None:
        assert self._consumer is not None
        try:
            if parts is None:
                self._consumer.commit(asynchronous=False)
            else:
                self._consumer.commit(offsets=parts, asynchronous=False)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                return  # nothing new to commit
            log.warning("synchronous commit failed: %s", exc)

    # ------------------------------------------------------------------ rebalance
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._joined = True
        m.REBALANCES.labels(kind="assign").inc()
        self.summary.rebalances["assign"] += 1
        for p in partitions:
            self._parts[(p.topic, p.partition)] = _Partition()
            self._schedule.drop((p.topic, p.partition))
        consumer.incremental_assign(partitions)
        if partitions:
            # Pauses survive a revoke/re-assign inside librdkafka: start from a known state.
            consumer.resume(partitions)
        log.info("assigned %s", _fmt(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not self._closing:  # the revoke of a clean close is not a rebalance
            m.REBALANCES.labels(kind="revoke").inc()
            self.summary.rebalances["revoke"] += 1
        if self._producer is not None and self._inflight:
            remaining = self._producer.flush(30)
            if remaining:
                log.error(
                    "revoke: %d routed copies undelivered; their inputs stay uncommitted", remaining
                )
        to_commit = []
        for p in partitions:
            state = self._parts.get((p.topic, p.partition))
            if state is not None and state.tracker.committable is not None:
                to_commit.append(TopicPartition(p.topic, p.partition, state.tracker.committable))
        if to_commit:
            try:
                consumer.store_offsets(offsets=to_commit)
            except KafkaException as exc:
                log.warning("revoke: storing offsets failed: %s", exc)
            self._commit_sync(to_commit)
        self._forget(partitions)
        log.info("revoked %s", _fmt(partitions))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        m.REBALANCES.labels(kind="lost").inc()
        self.summary.rebalances["lost"] += 1
        log.warning(
            "lost %s (session timed out); their uncommitted work will be redone", _fmt(partitions)
        )
        self._forget(partitions)

    def _forget(self, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            self._parts.pop(tp, None)
            self._schedule.drop(tp)
            m.CONSUMER_LAG.labels(topic=p.topic, partition=str(p.partition)).set(0)
        self._update_paused_gauge()

    # ------------------------------------------------------------------ observability
    def _on_stats(self, raw: str) -> None:
        try:
            stats = json.loads(raw)
        except ValueError:
            return
        for topic, tdata in stats.get("topics", {}).items():
            for pid, pdata in tdata.get("partitions", {}).items():
                if pid == "-1" or (topic, int(pid)) not in self._parts:
                    continue
                lag = pdata.get("consumer_lag", -1)
                if lag >= 0:
                    m.CONSUMER_LAG.labels(topic=topic, partition=pid).set(lag)

    def _beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.beat(len(self._parts), len(self._schedule), drained=self._idle())

    def _idle(self) -> bool:
        """Nothing left to do right now on the partitions this process owns."""
        return (
            self._joined
            and not self._inflight
            and not len(self._schedule)
            and all(state.drained() for state in self._parts.values())
        )

    def _drained(self, busy: bool) -> bool:
        now = time.monotonic()
        if busy or not self._idle():
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
