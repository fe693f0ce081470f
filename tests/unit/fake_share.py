"""A fake share consumer (KIP-932, explicit acknowledgement) and a share worker wired to it as
``retryd.share.build`` wires one, for unit tests of the share worker's loop without a broker.

``FakeShareConsumer`` keeps what the worker relies on and what the reviews found it getting
wrong: a poll acquires records and locks each to this consumer for ``lock_s`` from the moment
it was *acquired* (``acquired_at``), a poll refuses to run while records of the last poll are
unacknowledged (as the client's ``IllegalStateException``), a lock that runs out hands the
record out again with its delivery count up, an acknowledgement after the lock is refused and
recorded in ``refused``. ``background`` stages librdkafka's fetch in flight between two polls:
records it acquired after one poll returned empty, handed out by the next.
Routed copies go to the in-memory ``StubProducer`` (``tests.stub_kafka``).

``crash`` stages a worker that died holding a record: the fake forgets that acquisition (the
dead worker's acknowledgement of it is refused, recorded in ``stale``), the record stays
locked until its lock runs out, then is handed out again with its delivery count up, or
archived when that was its last delivery. A REJECT archives its record at once; a RELEASE
makes it available again (its next acquisition counts a delivery).
``built_share_worker`` composes a worker as ``retryd.share.build`` does (its checks, the call
wrapper, the breaker from the settings), minus the admin client.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import AcknowledgeType, IllegalStateException

from retryd.config import Settings, load_settings
from retryd.handlers.base import Handler
from retryd.handlers.quick import QuickCounts
from retryd.policy.circuit import Breaker, BreakerPolicy
from retryd.policy.routing import RoutePlanner
from retryd.runtime.circuit_control import CommandReader
from retryd.runtime.heartbeat import HeartbeatWriter
from retryd.share.calls import Calls
from retryd.share.delay import check_first_delay
from retryd.share.gate import ShareGate
from retryd.share.group import ShareGroupConfig, check_lock
from retryd.share.worker import ShareParts, ShareWorker
from retryd.tracing import NO_TRACING
from retryd.worker.assembly import wrap_calls
from retryd.worker.clients import worker_producer_config
from retryd.worker.events import Events, NullSink
from retryd.worker.router import Router
from tests.stub_kafka import StubBroker, StubMessage, StubRecord

MAIN = "orders"
GROUP = "g"


class FakeShareMessage(StubMessage):
    __slots__ = ("_count",)

    def __init__(self, rec: StubRecord, count: int) -> None:
        super().__init__(rec)
        self._count = count

    def delivery_count(self) -> int:
        return self._count


@dataclass
class Held:
    msg: FakeShareMessage
    acquired_at: float  # monotonic


@dataclass
class FakeShareConsumer:
    lock_s: float
    limit: int = 5
    max_records: int = 8
    log: list[StubRecord] = field(default_factory=list)
    available: deque[int] = field(default_factory=deque)  # offsets to hand out, in order
    counts: dict[int, int] = field(default_factory=dict)  # offset -> deliveries so far
    inflight: dict[int, Held] = field(default_factory=dict)
    acks: list[tuple[int, AcknowledgeType]] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)  # acknowledged after their lock ran out
    archived: list[int] = field(default_factory=list)  # out of deliveries
    background: list[Held] = field(default_factory=list)  # acquired between two polls
    poll_errors: list[BaseException] = field(default_factory=list)  # raised by the next polls
    commit_errors: list[BaseException] = field(default_factory=list)
    on_poll: Callable[[FakeShareConsumer], None] | None = None  # after each poll returns
    ghosts: dict[int, Held] = field(default_factory=dict)  # forgotten by a crash, still locked
    stale: list[int] = field(default_factory=list)  # acknowledged by a crashed worker: refused
    rejected: list[int] = field(default_factory=list)  # REJECTed (archived too)
    _forgotten: list[FakeShareMessage] = field(default_factory=list)
    polls: int = 0  # polls that returned
    attempts: int = 0  # poll calls, raising or not
    commits: int = 0
    closed: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)

    # ------------------------------------------------------------------ the test's side
    def add(self, key: bytes | None, value: bytes = b"{}", timestamp: int | None = None) -> int:
        with self.cond:
            offset = len(self.log)
            ts = timestamp if timestamp is not None else int(time.time() * 1000)
            self.log.append(StubRecord(MAIN, 0, offset, key, value, [], ts))
            self.available.append(offset)
            self.cond.notify_all()
            return offset

    def acquire_in_background(self) -> None:
        """Acquire what is available now, as librdkafka's fetch still in flight after an empty
        poll does: the next poll hands these records out, their locks already running."""
        with self.cond:
            self.background.extend(self._acquire(time.monotonic()))

    def accepted(self) -> list[int]:
        with self.cond:
            return [o for o, kind in self.acks if kind == AcknowledgeType.ACCEPT]

    def released(self) -> list[int]:
        with self.cond:
            return [o for o, kind in self.acks if kind == AcknowledgeType.RELEASE]

    def crash(self, offset: int) -> bool:
        """The worker holding ``offset`` died: its acquisition is forgotten (the record stays
        locked until its lock runs out, then comes back, a delivery used). False when the
        record was not acquired."""
        with self.cond:
            held = self.inflight.pop(offset, None)
            if held is None:
                return False
            self.ghosts[offset] = held
            self._forgotten.append(held.msg)
            self.cond.notify_all()
            return True

    def delivery_count(self, offset: int) -> int:
        """How many times ``offset`` was handed out so far."""
        with self.cond:
            return self.counts.get(offset, 0)

    # ------------------------------------------------------------------ the client's side
    def set_acknowledgement_commit_callback(self, cb: Any) -> None:
        self.callback = cb

    def subscribe(self, topics: list[str]) -> None:
        assert topics == [MAIN]

    def poll(self, timeout: float = -1) -> list[FakeShareMessage]:
        self.attempts += 1
        if self.poll_errors:
            raise self.poll_errors.pop(0)
        with self.cond:
            self.polls += 1
            now = time.monotonic()
            self._expire(now)
            if self.inflight:
                raise IllegalStateException(
                    "not all records from the previous poll have been acknowledged"
                )
            if self.background:
                batch, self.background = self.background, []
            else:
                self.cond.wait_for(lambda: bool(self.available), timeout)
                batch = self._acquire(time.monotonic())
            for held in batch:
                self.inflight[held.msg.offset()] = held  # type: ignore[index]
        if self.on_poll is not None:
            self.on_poll(self)
        return [h.msg for h in batch]

    def acknowledge(self, msg: FakeShareMessage, kind: AcknowledgeType) -> None:
        offset = msg.offset()
        with self.cond:
            held = self.inflight.get(offset)  # type: ignore[arg-type]
            if held is None or held.msg is not msg:
                if any(m is msg for m in self._forgotten):
                    self.stale.append(offset)  # type: ignore[arg-type]
                raise IllegalStateException("the message is no longer in-flight")
            del self.inflight[offset]  # type: ignore[arg-type]
            if time.monotonic() > held.acquired_at + self.lock_s:
                self.refused.append(offset)  # type: ignore[arg-type]
                self._back(offset)  # type: ignore[arg-type]
                raise IllegalStateException("the record's acquisition lock expired")
            self.acks.append((offset, kind))  # type: ignore[arg-type]
            if kind == AcknowledgeType.RELEASE:
                self._back(offset)  # type: ignore[arg-type]
            elif kind == AcknowledgeType.REJECT:
                self.rejected.append(offset)  # type: ignore[arg-type]
                self.archived.append(offset)  # type: ignore[arg-type]
            self.cond.notify_all()

    def commit_async(self) -> None:
        if self.commit_errors:
            raise self.commit_errors.pop(0)
        self.commits += 1

    def close(self) -> None:
        with self.cond:
            self.closed = True
            for offset in list(self.inflight):
                del self.inflight[offset]
                self._back(offset)

    # ------------------------------------------------------------------ internals
    def _acquire(self, now: float) -> list[Held]:
        out = []
        while self.available and len(out) < self.max_records:
            offset = self.available.popleft()
            count = self.counts.get(offset, 0) + 1
            self.counts[offset] = count
            out.append(Held(FakeShareMessage(self.log[offset], count), now))
        return out

    def _expire(self, now: float) -> None:
        for offset, held in list(self.inflight.items()):
            if now > held.acquired_at + self.lock_s:
                del self.inflight[offset]
                self._back(offset)
        for offset, held in list(self.ghosts.items()):
            if now > held.acquired_at + self.lock_s:
                del self.ghosts[offset]
                self._back(offset)

    def _back(self, offset: int) -> None:
        if self.counts.get(offset, 0) >= self.limit:
            self.archived.append(offset)
        else:
            self.available.appendleft(offset)


def share_worker(
    handler: Handler,
    consumer: FakeShareConsumer,
    tmp_path: Path,
    *,
    sequence: str = "5m",
    max_in_flight: int = 2,
    max_abandoned: int = 8,
    breaker: Breaker | None = None,
    heartbeat: bool = False,
    events: NullSink | None = None,
    **overrides: Any,
) -> tuple[ShareWorker, StubBroker]:
    """A share worker as ``build_share_worker`` composes one, on ``consumer`` and a stub
    producer (the group's lock is the consumer's)."""
    settings = load_settings(
        consumer_mode="share",
        ordering="none",
        group_id=GROUP,
        main_topics=[MAIN],
        retry_sequence=sequence,
        handler_timeout_s=handler.timeout_s,
        max_in_flight=max_in_flight,
        max_abandoned_handlers=max_abandoned,
        poll_timeout_s=0.05,
        state_dir=tmp_path,
        **overrides,
    )
    plan = settings.plan
    broker = StubBroker()
    topics = [MAIN, plan.failed_topic, *plan.tier_topics]
    for topic in topics:
        broker.create(topic)
    group = ShareGroupConfig(
        settings.share_group_id, int(consumer.lock_s * 1000), consumer.limit, "earliest", False
    )
    worker = ShareWorker(
        ShareParts(
            settings=settings,
            consumer=consumer,
            router=Router(broker.producer({}), dict.fromkeys(topics, 1)),
            planner=RoutePlanner(plan, settings.group_id),
            calls=Calls(handler, max_in_flight, handler.timeout_s, max_abandoned),
            group=group,
            events=Events([events or NullSink()]),
            heartbeat=HeartbeatWriter(tmp_path, "main", GROUP) if heartbeat else None,
            quick=QuickCounts(),
            gate=ShareGate(
                breaker or Breaker(BreakerPolicy(enabled=False), int(time.time() * 1000)),
                NullSink(),
                None,
                owner=True,
                keepalive_s=150.0,
            ),
        )
    )
    return worker, broker


def built_share_worker(
    handler: Handler,
    consumer: FakeShareConsumer,
    settings: Settings,
    *,
    breaker: Breaker | None = None,
) -> tuple[ShareWorker, StubBroker]:
    """A share worker composed as ``build_share_worker`` composes one: the call wrapper
    (``wrap_calls``), the start-up checks of the lock and of the first delay against the
    group's configuration (here the consumer's lock and delivery limit), the call bound, the
    breaker from ``settings``' policy, the orders reader; a stub producer, no admin client and
    no configuration watch."""
    plan = settings.plan
    planner = RoutePlanner(plan, settings.group_id)
    handler, quick = wrap_calls(settings, handler, planner, NO_TRACING)
    call_s = max(settings.handler_timeout_s, handler.timeout_s)
    group = ShareGroupConfig(
        settings.share_group_id, int(consumer.lock_s * 1000), consumer.limit, "earliest", False
    )
    check_lock(group, call_s, settings.handler_timeout_s)
    check_first_delay(group, call_s, plan.first_delay_ms)
    broker = StubBroker()
    topics = [*settings.main_topics, plan.failed_topic, *plan.tier_topics, *plan.dlt_topics]
    for topic in topics:
        broker.create(topic)
    events = Events([NullSink()])
    gate = ShareGate(
        breaker or Breaker(settings.breaker_policy, int(time.time() * 1000)),
        events,
        CommandReader(settings.state_dir, settings.group_id),
        owner=True,
        keepalive_s=settings.max_poll_interval_ms / 2000,
    )
    worker = ShareWorker(
        ShareParts(
            settings=settings,
            consumer=consumer,
            router=Router(
                broker.producer(worker_producer_config(settings)), dict.fromkeys(topics, 1)
            ),
            planner=planner,
            calls=Calls(handler, settings.max_in_flight, call_s, settings.max_abandoned_handlers),
            group=group,
            events=events,
            heartbeat=None,
            quick=quick,
            gate=gate,
        )
    )
    return worker, broker


class Running:
    """``worker.run()`` on a daemon thread (a worker frozen by a fault must not keep the test
    process alive); ``failure`` is what it raised."""

    def __init__(self, worker: ShareWorker) -> None:
        self.worker = worker
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="share-worker-test", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:
            self.failure = exc

    def stop(self, timeout: float) -> bool:
        """Ask it to stop; True when ``run`` returned within ``timeout``."""
        self.worker.stop()
        self.thread.join(timeout)
        return not self.thread.is_alive()
