"""Composition of a share worker: clients, checks and parts built once, complete.

Building does I/O, like the group worker's assembly: it reads the share group's configuration
and refuses a handler timeout that may outlast the record lock (``retryd.share.group``), or a
delay before the first attempt that the lock cannot hold with a call (``retryd.share.delay``),
and checks that every topic exists, before it joins the group.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaException, ShareConsumer

from retryd.config import Settings
from retryd.errors import ConfigError, KafkaRuntimeError, KafkaSetupError
from retryd.handlers.base import Handler, is_batch_handler
from retryd.kafka.clients import (
    admin_config,
    common_config,
    librdkafka_log,
    new_admin,
    new_producer,
)
from retryd.policy.circuit import Breaker
from retryd.policy.routing import RoutePlanner
from retryd.runtime.circuit_control import CommandReader
from retryd.runtime.heartbeat import HeartbeatWriter
from retryd.share.calls import Calls
from retryd.share.delay import check_first_delay
from retryd.share.gate import ShareGate
from retryd.share.group import (
    GroupConfigWatch,
    check_lock,
    read_group_config,
    start_from_earliest,
)
from retryd.share.worker import ShareParts, ShareWorker
from retryd.tracing import NO_TRACING, Tracing
from retryd.worker.assembly import wrap_calls
from retryd.worker.clients import worker_producer_config
from retryd.worker.events import Events
from retryd.worker.router import Router

log = logging.getLogger(__name__)

POLL_ROUNDS = 4  # max.poll.records = POLL_ROUNDS x max_in_flight


def share_consumer_config(settings: Settings) -> dict[str, Any]:
    """The share consumer: explicit acknowledgement (a record is accepted only once it is
    done), and a poll of about ``POLL_ROUNDS`` rounds of ``max_in_flight`` calls. A share
    consumer polls again only once every record of its last poll is acknowledged, so each
    poll costs a round trip to the broker: one round per poll made a 20 ms handler run at
    30 records/s on one call at a time, four rounds at 42 (50 is the ceiling). A record that
    waits so long for a free call that its call could outlast its lock is released rather
    than run (``retryd.share.worker``). ``max.poll.records`` is best-effort: the broker
    acquires whole producer batches, so a poll may return more."""
    return {
        "client.id": "retryd-share-main",
        "max.poll.records": settings.max_in_flight * POLL_ROUNDS,
        **common_config(settings),
        "group.id": settings.share_group_id,
        "share.acknowledgement.mode": "explicit",
        "max.poll.interval.ms": settings.max_poll_interval_ms,
        "logger": librdkafka_log,
    }


def build_share_worker(
    settings: Settings,
    handler: Handler,
    events: Events,
    *,
    heartbeat: bool = True,
    tracing: Tracing = NO_TRACING,
    breaker: Breaker | None = None,
) -> ShareWorker:
    """The share worker for ``settings``; ``heartbeat=False`` when another part of the process
    (role all's tiers worker) writes this process's heartbeat, and then applies the circuit
    orders and publishes the circuit it shares with it (``breaker``: ``retryd.share.gate``).
    ``tracing`` is shut down by whoever made it (``retryd.share.run``)."""
    if is_batch_handler(handler):
        raise ConfigError(["consumer_mode=share calls the handler with one record at a time"])
    plan = settings.plan
    planner = RoutePlanner(plan, settings.group_id)
    handler, quick = wrap_calls(settings, handler, planner, tracing)  # as in group mode
    call_s = max(settings.handler_timeout_s, handler.timeout_s)
    admin = new_admin(admin_config(common_config(settings), "share-check"))
    group = read_group_config(admin, settings.share_group_id)
    check_lock(group, call_s, settings.handler_timeout_s)
    check_first_delay(group, call_s, plan.first_delay_ms)  # delay= waits under the lock too
    counts = _check_topics(admin, settings)
    start_from_earliest(admin, group)
    producer = new_producer(worker_producer_config(settings))
    try:
        consumer = ShareConsumer(share_consumer_config(settings))
    except (KafkaException, ValueError, TypeError) as exc:
        raise KafkaSetupError(f"cannot create a share consumer: {exc}") from exc
    beat = None
    if heartbeat:
        beat = HeartbeatWriter(settings.state_dir, "main", settings.group_id)
        beat.beat(0, 0, "starting", force=True)
    calls = Calls(handler, settings.max_in_flight, call_s, settings.max_abandoned_handlers)
    gate = ShareGate(
        breaker or Breaker(settings.breaker_policy, int(time.time() * 1000)),
        events,
        CommandReader(settings.state_dir, settings.group_id),
        owner=heartbeat,
        # librdkafka's share consumer leaves the group past max.poll.interval.ms without a poll
        keepalive_s=settings.max_poll_interval_ms / 2000,
    )
    watch = GroupConfigWatch(admin, group, call_s, settings.handler_timeout_s)
    return ShareWorker(
        ShareParts(
            settings=settings,
            consumer=consumer,
            router=Router(producer, counts),
            planner=planner,
            calls=calls,
            group=group,
            events=events,
            heartbeat=beat,
            quick=quick,
            gate=gate,
            watch=watch,
            tracing=tracing,
        )
    )


def _check_topics(admin: Any, settings: Settings) -> dict[str, int]:
    """Fail fast, naming missing topics; returns partition counts for routing."""
    plan = settings.plan
    try:
        md = admin.list_topics(timeout=10)
    except KafkaException as exc:
        raise KafkaRuntimeError(
            f"cannot reach the cluster at {settings.bootstrap_servers}: {exc}"
        ) from exc
    needed = [*settings.main_topics, plan.failed_topic, *plan.tier_topics, *plan.dlt_topics]
    missing = sorted({t for t in needed if t not in md.topics or md.topics[t].error})
    if missing:
        raise KafkaSetupError(
            f"missing topics: {', '.join(missing)} (create them with 'retryd topics create')"
        )
    return {t: len(md.topics[t].partitions) for t in set(needed)}
