"""librdkafka configuration of the worker's consumer and producer (built by ``retryd.kafka``)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from retryd.config import Role, Settings
from retryd.kafka.clients import common_config, group_consumer_config, producer_config


def worker_consumer_config(
    settings: Settings,
    role: Role,
    stats_cb: Callable[[str], None] | None = None,
    *,
    tiers_member: bool = False,
) -> dict[str, Any]:
    """The worker's group consumer (or, with ``tiers_member``, role ``all``'s tiers member:
    retryd.worker.split_consumer).

    Main topics keep librdkafka's default prefetch: they are read as fast as they are handled.
    A consumer of tiers alone uses ``tier_prefetch_kbytes``: not-yet-due records wait in
    memory (bounded by ``tier_buffer``), and when a tier's in-memory tail is full the
    partition is paused, which discards its prefetched data, so a large prefetch would only be
    memory spent twice. A consumer of both (``tier_consumer = shared``, or exactly-once) keeps
    the default, so deep tiers take a share of its fetch queue.
    """
    tuning: dict[str, Any] = {
        "session.timeout.ms": settings.session_timeout_ms,
        # A third of the session timeout at most (librdkafka's fixed 3 s default would let a
        # short session expire between two heartbeats).
        "heartbeat.interval.ms": min(3000, settings.session_timeout_ms // 3),
        "max.poll.interval.ms": settings.max_poll_interval_ms,
        # Tier precision: a fetch waits for new records at most this long. A broker answers a
        # fetch as soon as data arrives, but one that holds it for the whole wait (the embedded
        # test broker does) delivered records up to 500 ms (the default) after they came due;
        # 100 ms costs an idle consumer 10 small fetches a second per broker.
        "fetch.wait.max.ms": 100,
    }
    if settings.exactly_once:
        # Offsets are committed by the router's transactions, never by the consumer; every
        # reader already defaults to read_committed, fixed here because exactly-once needs it.
        tuning["enable.auto.commit"] = False
        tuning["isolation.level"] = "read_committed"
    if role is Role.TIERS or tiers_member:
        tuning["queued.max.messages.kbytes"] = settings.tier_prefetch_kbytes
        tuning["fetch.max.bytes"] = max(1024 * 1024, settings.tier_prefetch_kbytes * 1024)
    if stats_cb is not None:
        tuning["statistics.interval.ms"] = 5000
        tuning["stats_cb"] = stats_cb
    return group_consumer_config(
        common_config(settings),
        "worker-all-tiers" if tiers_member else f"worker-{role.value}",
        settings.group_id,
        protocol=settings.group_protocol.value,
        **tuning,
    )


def worker_producer_config(
    settings: Settings, transactional_id: str | None = None
) -> dict[str, Any]:
    """The router's producer: idempotent, acks=all (fixed), a short linger for batching;
    transactional with exactly-once routing."""
    conf = producer_config(common_config(settings), "router", **{"linger.ms": 5})
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
    return conf


def alone_producer_config(settings: Settings) -> dict[str, Any]:
    """A producer that never batches: a copy the broker refused as too large is sent again
    on it, alone. The broker refuses a whole batch when it is over a topic's
    ``max.message.bytes``, so a small copy batched with a big one is refused too; only a copy
    refused when alone is too large itself."""
    return producer_config(
        common_config(settings), "router-alone", **{"linger.ms": 0, "batch.num.messages": 1}
    )


def transactional_id(settings: Settings, role: Role, instance: int) -> str:
    """Stable across restarts of the same process slot (the supervisor restarts a child in its
    slot; a pod keeps its hostname in a StatefulSet), so ``init_transactions`` fences the
    instance it replaces: that zombie's open transaction is aborted and it cannot commit."""
    prefix = settings.transactional_id or (
        f"retryd-{settings.group_id}-{role.value}-{socket.gethostname()}"
    )
    return f"{prefix}-{instance}"
