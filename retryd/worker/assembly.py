"""Composition of a worker run: every collaborator built once, complete, in one place.

Like parallel-consumer's ``PCModule``: the engine receives finished parts and builds none.
Nothing is half-built (no ``Optional`` field filled in later), and no callback is wired back
through the engine: the settler is handed the router, the intake is handed the settler, and
faults are recorded in one ``Faults`` holder every part gets. Client factories are injected,
so tests run the same composition on the in-memory stub broker.

Building does I/O: it checks that every topic exists (naming the missing ones) and reads
their partition counts for routing, so a worker that cannot run fails here, before it joins
the group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException

from retryd.config import Role, Settings, TierConsumer
from retryd.errors import ConfigError, KafkaRuntimeError, KafkaSetupError
from retryd.handlers.base import (
    AsyncBatchHandler,
    AsyncHandler,
    Handler,
    SyncBatchHandler,
    SyncHandler,
    is_async_handler,
    is_batch_handler,
)
from retryd.handlers.quick import QuickCounts, quick_timeout_s, with_quick_retries
from retryd.kafka.clients import common_config, new_consumer, new_producer, reader_config
from retryd.policy.circuit import Breaker
from retryd.policy.routing import RoutePlanner
from retryd.runtime.circuit_control import CommandReader
from retryd.runtime.heartbeat import HeartbeatWriter
from retryd.tracing import NO_TRACING, Tracing, tracing_from_env
from retryd.worker.batch_loop_pool import BatchLoopPool
from retryd.worker.batch_pool import BatchThreadPool
from retryd.worker.book import ConsumerLike, PartitionBook
from retryd.worker.circuit import Circuit
from retryd.worker.clients import (
    alone_producer_config,
    transactional_id,
    worker_consumer_config,
    worker_producer_config,
)
from retryd.worker.engine import Worker
from retryd.worker.events import Events, Sink
from retryd.worker.faults import Faults
from retryd.worker.intake import Intake
from retryd.worker.lag import LagReporter
from retryd.worker.lifecycle import NO_HOOKS, Lifecycle, RaceHooks
from retryd.worker.loop_pool import ASYNC_CANCEL_GRACE_S
from retryd.worker.offsets import OffsetSink, StoredOffsets, TransactionalOffsets
from retryd.worker.partition import PartitionState
from retryd.worker.pools import LoopPool, Pool, ThreadPool
from retryd.worker.router import ProducerLike, Router
from retryd.worker.scheduler import Scheduler
from retryd.worker.settle import Settler
from retryd.worker.split_consumer import SplitConsumer
from retryd.worker.strict import StrictOrder
from retryd.worker.summary import RunSummary

log = logging.getLogger(__name__)

# A revoke's bound beyond two handler timeouts: the async cancel grace and settling (2 s) and
# the wait for routed copies' acknowledgements (30 s), plus a margin.
REVOKE_FIXED_S = 35

ConsumerFactory = Callable[[dict[str, Any]], ConsumerLike]
ProducerFactory = Callable[[dict[str, Any]], ProducerLike]


@dataclass(frozen=True, slots=True)
class WorkerParts:
    """Everything one worker run uses, complete."""

    settings: Settings
    role: Role
    topics: list[str]
    partition_counts: dict[str, int]
    consumer: ConsumerLike
    offsets: OffsetSink
    book: PartitionBook
    scheduler: Scheduler
    lifecycle: Lifecycle
    pool: Pool
    router: Router
    settler: Settler
    intake: Intake
    circuit: Circuit
    quick: QuickCounts
    events: Events
    summary: RunSummary
    faults: Faults
    heartbeat: HeartbeatWriter
    drain_grace_s: float
    strict: StrictOrder | None = None  # key_order = strict
    tracing: Tracing = NO_TRACING  # shut down (its spans flushed) when the run ends


def topics_for_role(settings: Settings, role: Role) -> list[str]:
    topics: list[str] = []
    if role in (Role.ALL, Role.MAIN):
        topics += settings.main_topics
    if role in (Role.ALL, Role.TIERS):
        topics += settings.plan.tier_topics
    return topics


def build_worker(
    settings: Settings,
    handler: Handler,
    *,
    role: Role | None = None,
    consumer_factory: ConsumerFactory = new_consumer,  # type: ignore[assignment]
    producer_factory: ProducerFactory = new_producer,
    sinks: Sequence[Sink] = (),
    hooks: RaceHooks = NO_HOOKS,
    drain_grace_s: float = 1.0,
    instance: int = 0,
    reader_factory: ConsumerFactory | None = None,
    tracing: Tracing | None = None,
    breaker: Breaker | None = None,
) -> Worker:
    """The worker for ``settings`` and ``handler``, with every part built and connected.
    ``instance`` is the process slot (``--processes``): part of the transactional id.
    ``tracing`` defaults to what the OTEL_* variables ask for (``retryd.tracing``).
    ``breaker``: the circuit this worker shares with the main topics' share reader of its
    process (share mode's role all, ``retryd.share.gate``), which counts their first calls,
    so this worker's tier calls do not count."""
    if tracing is None:
        tracing = tracing_from_env(install_global=True)  # handlers' own spans go along
    role = role or settings.role
    topics = topics_for_role(settings, role)
    if not topics:
        raise KafkaSetupError("nothing to consume: set main_topics (RETRYD_MAIN_TOPICS)")
    plan = settings.plan
    # a call's longest run: the handler timeout, or the whole quick-retry sequence's
    call_s = quick_timeout_s(settings.handler_timeout_s, plan.quick, plan.quick_delay_ms)
    revoke_bound_ms = int((2 * call_s + REVOKE_FIXED_S) * 1000)
    if revoke_bound_ms > settings.max_poll_interval_ms:
        log.warning(
            "a revoke may take up to %d ms (2 x the longest call, %gs with its quick retries, "
            "+ %d s) but max_poll_interval_ms is %d: a slow revoke can cost this member its "
            "membership",
            revoke_bound_ms,
            call_s,
            REVOKE_FIXED_S,
            settings.max_poll_interval_ms,
        )
    summary = RunSummary()
    events = Events([summary, *sinks])
    faults = Faults()
    heartbeat = HeartbeatWriter(settings.state_dir, role.value, settings.group_id)
    heartbeat.beat(0, 0, "starting", force=True)
    owned: dict[tuple[str, int], PartitionState] = {}
    lag = LagReporter(events, owned)
    consumer = _consumer(settings, role, consumer_factory, lag.on_stats)
    counts = _check_topics(consumer, settings, topics)
    offsets: OffsetSink
    if settings.exactly_once:
        txn_id = transactional_id(settings, role, instance)
        producer = producer_factory(worker_producer_config(settings, txn_id))
        txn = TransactionalOffsets(
            producer,  # type: ignore[arg-type]
            consumer,
            settings.transaction_interval_ms / 1000,
            faults,
        )
        txn.start()  # fences the previous instance of this transactional id
        log.info("exactly-once routing: transactional id %s", txn_id)
        offsets = txn
    else:
        producer = producer_factory(worker_producer_config(settings))
        offsets = StoredOffsets(consumer)
    floors = plan.tier_floors
    if plan.first_delay_ms and role is not Role.TIERS:
        # main-topic records wait in their partition's tail first: bounded like a tier's
        floors = {**floors, **dict.fromkeys(settings.main_topics, plan.first_delay_ms)}
    book = PartitionBook(consumer, plan.tier_bounds, owned, offsets, floors)
    scheduler = Scheduler()
    lifecycle = Lifecycle(hooks)
    planner = RoutePlanner(plan, settings.group_id)
    if is_batch_handler(handler) and plan.quick:
        raise ConfigError([f"a batch handler does not work with quick retries ({plan.quick})"])
    handler, quick = wrap_calls(settings, handler, planner, tracing)
    pool = _pool(settings, handler, scheduler, lifecycle, events)
    alone = None
    if not settings.exactly_once:  # (a transaction's copies go through its one producer)

        def alone() -> ProducerLike:
            return producer_factory(alone_producer_config(settings))

    router = Router(producer, counts, alone)
    circuit = Circuit(
        breaker or Breaker(settings.breaker_policy, int(time.time() * 1000)),
        scheduler,
        book,
        lifecycle,
        events,
        CommandReader(settings.state_dir, settings.group_id),
        count_tiers=role is Role.TIERS and breaker is None,
        # a probe's verdict comes within its longest call, the async cancel grace and a margin
        probe_timeout_s=pool.timeout_s + ASYNC_CANCEL_GRACE_S + 2.0,
    )
    strict = None
    if settings.strict_topics:
        reader = (reader_factory or new_consumer)(key_state_reader_config(settings))
        strict = StrictOrder(settings, plan, reader, counts[settings.key_state_topic], scheduler)
        log.info(
            "strict key order for %s: chain entries in %s (%d partitions)",
            ", ".join(sorted(settings.strict_topics)),
            settings.key_state_topic,
            counts[settings.key_state_topic],
        )
    settler = Settler(
        planner,
        book,
        router,
        lifecycle,
        faults,
        circuit,
        scheduler,
        exactly_once=settings.exactly_once,
        strict=strict,
        tracing=tracing,
    )
    intake = Intake(
        book, plan, settings.group_id, settings.ordering, settler, faults, scheduler, strict
    )
    return Worker(
        WorkerParts(
            settings=settings,
            role=role,
            topics=topics,
            partition_counts=counts,
            consumer=consumer,
            offsets=offsets,
            book=book,
            scheduler=scheduler,
            lifecycle=lifecycle,
            pool=pool,
            router=router,
            settler=settler,
            intake=intake,
            circuit=circuit,
            quick=quick,
            events=events,
            summary=summary,
            faults=faults,
            heartbeat=heartbeat,
            drain_grace_s=drain_grace_s,
            strict=strict,
            tracing=tracing,
        )
    )


def _consumer(
    settings: Settings,
    role: Role,
    factory: ConsumerFactory,
    stats_cb: Callable[[str], None],
) -> ConsumerLike:
    """The worker's consumer. Role ``all`` puts its tiers on a member of their own
    (retryd.worker.split_consumer), unless ``tier_consumer = shared`` or exactly-once routing
    (whose transaction commits the offsets of one member) asks for one."""
    tiers = settings.plan.tier_topics
    if (
        role is not Role.ALL
        or not tiers
        or settings.tier_consumer is TierConsumer.SHARED
        or settings.exactly_once
    ):
        return factory(worker_consumer_config(settings, role, stats_cb))
    main = factory(worker_consumer_config(settings, role, stats_cb))
    try:
        tier_member = factory(worker_consumer_config(settings, role, stats_cb, tiers_member=True))
    except BaseException:
        main.close()
        raise
    return SplitConsumer(main, tier_member, tiers)


def wrap_calls(
    settings: Settings, handler: Handler, planner: RoutePlanner, tracing: Tracing
) -> tuple[Handler, QuickCounts]:
    """Each call as every worker makes it (group and share mode): quick retries in place, one
    longer call to the engine (retryd.handlers.quick), then a span per call (with quick
    retries, the whole in-place sequence: one span, so a record without a traceparent stays
    one trace; its routed copy is stamped with the call's traceparent). Batch handler calls
    are not traced. Returns the handler to call and the quick retries' counts."""
    plan = settings.plan
    quick = QuickCounts()
    handler = with_quick_retries(
        handler,
        plan.quick,
        plan.quick_delay_ms,
        settings.handler_timeout_s,
        planner.terminal,
        quick,
    )
    if not is_batch_handler(handler):
        handler = tracing.wrap(handler, settings.group_id)
    elif tracing is not NO_TRACING:
        log.warning("tracing: batch handler calls are not traced (one span per record call)")
    return handler, quick


def key_state_reader_config(settings: Settings) -> dict[str, Any]:
    """The key-state view's reader: every state partition by assignment, from the start,
    committed records only, end-of-partition events (how the view knows it caught up)."""
    return reader_config(
        common_config(settings),
        "key-state",
        **{
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
            "enable.auto.commit": False,
        },
    )


def _pool(
    settings: Settings, handler: Handler, scheduler: Scheduler, lifecycle: Lifecycle, events: Events
) -> Pool:
    # the slot's timeout: the handler's, or the whole quick-retry sequence's
    timeout_s = max(settings.handler_timeout_s, handler.timeout_s)
    if is_batch_handler(handler):
        # up to max_in_flight records in flight: that many records' worth of batch calls
        assert isinstance(handler, SyncBatchHandler | AsyncBatchHandler)
        calls = max(1, settings.max_in_flight // max(1, handler.max_batch))
        if is_async_handler(handler):
            assert isinstance(handler, AsyncBatchHandler)
            return BatchLoopPool(handler, scheduler, lifecycle, calls, timeout_s, events.abandoned)  # type: ignore[arg-type]
        assert isinstance(handler, SyncBatchHandler)
        return BatchThreadPool(handler, scheduler, lifecycle, calls, timeout_s, events.abandoned)
    common = (scheduler, lifecycle, settings.max_in_flight, timeout_s)
    if is_async_handler(handler):
        assert isinstance(handler, AsyncHandler)
        return LoopPool(handler, *common, events.abandoned)
    assert isinstance(handler, SyncHandler)
    return ThreadPool(handler, *common, events.abandoned)


def _check_topics(consumer: ConsumerLike, settings: Settings, topics: list[str]) -> dict[str, int]:
    """Fail fast, naming missing topics; returns partition counts for routing."""
    plan = settings.plan
    try:
        md = consumer.list_topics(timeout=10)
    except KafkaException as exc:
        raise KafkaRuntimeError(
            f"cannot reach the cluster at {settings.bootstrap_servers}: {exc}"
        ) from exc
    needed = [*topics, plan.failed_topic, *plan.tier_topics, *plan.dlt_topics]
    if settings.strict_topics:
        needed.append(settings.key_state_topic)
    missing = sorted({t for t in needed if t not in md.topics or md.topics[t].error})
    if missing:
        raise KafkaSetupError(
            f"missing topics: {', '.join(missing)} (create them with 'retryd topics create')"
        )
    return {t: len(md.topics[t].partitions) for t in set(needed)}
