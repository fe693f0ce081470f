"""librdkafka configuration of the worker's consumer and producer (built by ``retryd.kafka``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from retryd.config import Role, Settings
from retryd.kafka.clients import common_config, group_consumer_config, producer_config


def worker_consumer_config(
    settings: Settings, role: Role, stats_cb: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The worker's group consumer.

    Main topics keep librdkafka's default prefetch whatever the role: the worker keeps
    not-yet-due tier records in memory instead of seeking, so a large prefetch is not thrown
    away on every due time. A tiers-only worker still uses ``tier_prefetch_kbytes``: when a
    tier's in-memory tail is full the partition is paused, which discards its prefetched data.
    """
    tuning: dict[str, Any] = {
        "session.timeout.ms": settings.session_timeout_ms,
        "max.poll.interval.ms": settings.max_poll_interval_ms,
    }
    if role is Role.TIERS:
        tuning["queued.max.messages.kbytes"] = settings.tier_prefetch_kbytes
        tuning["fetch.max.bytes"] = max(1024 * 1024, settings.tier_prefetch_kbytes * 1024)
    if stats_cb is not None:
        tuning["statistics.interval.ms"] = 5000
        tuning["stats_cb"] = stats_cb
    return group_consumer_config(
        common_config(settings), f"worker-{role.value}", settings.group_id, **tuning
    )


def worker_producer_config(settings: Settings) -> dict[str, Any]:
    """The router's producer: idempotent, acks=all (fixed), a short linger for batching."""
    return producer_config(common_config(settings), "router", **{"linger.ms": 5})
