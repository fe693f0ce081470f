"""librdkafka configuration for the worker's consumer and producer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from retryd.config import Role, Settings

log = logging.getLogger(__name__)
# librdkafka's own log lines, routed through Python logging (served from poll/consume).
librdkafka_log = logging.getLogger("retryd.librdkafka")

# Options the at-least-once design depends on: user pass-through cannot change them.
_CONSUMER_FIXED = {
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "partition.assignment.strategy": "cooperative-sticky",
}
_PRODUCER_FIXED = {"acks": "all", "enable.idempotence": True}


def _merge(base: dict[str, Any], user: dict[str, str], fixed: dict[str, Any]) -> dict[str, Any]:
    out = {**base, **user}
    for key, value in fixed.items():
        if key in user and str(user[key]).lower() != str(value).lower():
            log.warning("ignoring kafka option %s=%s: retryd requires %s", key, user[key], value)
        out[key] = value
    return out


def consumer_config(
    settings: Settings, role: Role, stats_cb: Callable[[str], None] | None = None
) -> dict[str, Any]:
    base: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": settings.group_id,
        "client.id": f"retryd-{role.value}",
        "enable.auto.commit": True,
        "auto.commit.interval.ms": 1000,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": settings.session_timeout_ms,
        "max.poll.interval.ms": settings.max_poll_interval_ms,
        "logger": librdkafka_log,
    }
    if role is not Role.MAIN:
        # Tier partitions pause often and every seek re-fetches the queue: keep prefetch small.
        base["queued.max.messages.kbytes"] = settings.tier_prefetch_kbytes
        base["fetch.max.bytes"] = max(1024 * 1024, settings.tier_prefetch_kbytes * 1024)
    if stats_cb is not None:
        base["statistics.interval.ms"] = 5000
        base["stats_cb"] = stats_cb
    return _merge(base, settings.kafka, _CONSUMER_FIXED)


def producer_config(settings: Settings) -> dict[str, Any]:
    base: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": "retryd-router",
        "linger.ms": 5,
        "logger": librdkafka_log,
    }
    return _merge(base, settings.kafka, _PRODUCER_FIXED)
