"""The share group's own configuration, read (and checked) when a share worker starts.

A record a share consumer acquires is locked to it for ``share.record.lock.duration.ms`` (a
group config, the broker's ``group.share.record.lock.duration.ms`` by default: 30 s, allowed
15-60 s). When the lock expires before the record is acknowledged, the broker hands it to
another consumer: the handler would run twice at once and this worker's acknowledgement would
be refused. The client (confluent-kafka 2.16) cannot renew a lock, so a call must end within
it: ``handler_timeout_s``, with the whole quick-retry sequence, plus ``LOCK_MARGIN_S`` for
routing the copy and acknowledging, must stay below the lock, or the worker refuses to start.

``share.delivery.count.limit`` (2-10, 5 by default) is how many times the broker hands out one
record; after the last delivery fails (released, or its lock expired) the broker archives it,
or dead-letters it headers-only (KIP-1191). retryd never lets it get there: the worker
dead-letters a record on its last delivery itself (``retryd.share.worker``).

A new share group starts at the end of its topics (``share.auto.offset.reset=latest``),
where a new consumer group of retryd starts at the beginning: when the group's value is the
broker's default, the worker sets it to ``earliest`` (and says so), so records produced before
the first worker joined are not skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from retryd.errors import ConfigError, KafkaRuntimeError

log = logging.getLogger(__name__)

LOCK = "share.record.lock.duration.ms"
LIMIT = "share.delivery.count.limit"
RESET = "share.auto.offset.reset"
# Routing a failed record's copy (acks=all) and sending the acknowledgement, after its call.
LOCK_MARGIN_S = 2.0
TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class ShareGroupConfig:
    group: str
    lock_ms: int
    delivery_limit: int
    reset: str
    reset_is_default: bool


def read_group_config(admin: AdminClient, group: str) -> ShareGroupConfig:
    """The group's lock duration, delivery limit and start position (the broker answers with
    its defaults for a group that sets none, or does not exist yet)."""
    resource = ConfigResource(ResourceType.GROUP, group)
    try:
        entries = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    except KafkaException as exc:
        raise KafkaRuntimeError(
            f"cannot read the configuration of share group {group} ({exc}); retryd needs "
            "DescribeConfigs on the group to check its record lock duration"
        ) from exc
    missing = [name for name in (LOCK, LIMIT) if name not in entries]
    if missing:
        raise ConfigError(
            [
                f"share group {group}: the broker reports no {', '.join(missing)}: share "
                "groups need Apache Kafka 4.2 or newer"
            ]
        )
    reset = entries.get(RESET)
    return ShareGroupConfig(
        group,
        int(entries[LOCK].value),
        int(entries[LIMIT].value),
        reset.value if reset is not None else "latest",
        bool(reset is None or reset.is_default),
    )


def check_lock(config: ShareGroupConfig, call_s: float, handler_timeout_s: float) -> None:
    """Refuse a call bound that may outlast the record lock (module docstring)."""
    lock_s = config.lock_ms / 1000
    if call_s + LOCK_MARGIN_S < lock_s:
        return
    quick = "" if call_s == handler_timeout_s else f" ({call_s:g}s with its quick retries)"
    raise ConfigError(
        [
            f"handler_timeout_s={handler_timeout_s:g}{quick} plus {LOCK_MARGIN_S:g}s to route "
            f"and acknowledge must stay below share group {config.group}'s record lock, "
            f"{LOCK}={config.lock_ms}: a call that outlasts the lock is handed to another "
            "consumer while it still runs. Lower handler_timeout_s, or raise the group's "
            f"{LOCK} (kafka-configs --alter --entity-type groups --entity-name "
            f"{config.group} --add-config {LOCK}=<ms>; at most the broker's "
            "group.share.max.record.lock.duration.ms, 60000 by default)"
        ]
    )


def start_from_earliest(admin: AdminClient, config: ShareGroupConfig) -> None:
    """Set ``share.auto.offset.reset=earliest`` on a group that has the broker's default."""
    if not config.reset_is_default or config.reset == "earliest":
        return
    resource = ConfigResource(
        ResourceType.GROUP,
        config.group,
        incremental_configs=[
            ConfigEntry(RESET, "earliest", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    try:
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(TIMEOUT_S)
    except KafkaException as exc:
        log.warning(
            "share group %s starts at the end of its topics (%s=%s) and retryd could not set "
            "it to earliest (%s): records produced before its first member joined are skipped",
            config.group,
            RESET,
            config.reset,
            exc,
        )
        return
    log.info(
        "share group %s: %s set to earliest (it had the broker's default, %s), so it reads "
        "the main topics from their beginning like a new consumer group",
        config.group,
        RESET,
        config.reset,
    )
