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

A running worker reads both again every ``REFRESH_S`` (``GroupConfigWatch``), so an
``--alter`` of the group's configuration is honoured without a restart.

A new share group starts at the end of its topics (``share.auto.offset.reset=latest``),
where a new consumer group of retryd starts at the beginning: when the group's value is the
broker's default, the worker sets it to ``earliest`` (and says so), so records produced before
the first worker joined are not skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from retryd.errors import ConfigError, KafkaRuntimeError, RetrydError

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
    except (KafkaException, TimeoutError) as exc:  # a future's result() times out with the latter
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
    if lock_holds(config, call_s):
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
    except (KafkaException, TimeoutError) as exc:
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


REFRESH_S = 60.0  # how often a running worker reads the group's configuration again


class GroupConfigWatch:
    """The group's lock and delivery limit, read again every ``REFRESH_S`` by a thread of its
    own, so a ``kafka-configs --alter`` of ``share.record.lock.duration.ms`` or
    ``share.delivery.count.limit`` is honoured without a restart.

    The poll thread never waits for the broker: it ``take``\\ s a changed configuration between
    two batches (a record's lock is the one in force when it was acquired, so a batch in hand
    keeps the values it was polled with). A read that fails keeps the values in force and is
    logged once, until a read works again. A lock shortened below what a call needs
    (``check_lock``) is logged as an error, and the worker carries on: it does not exit
    (``retryd.share.worker`` then starts a record while half its lock is left, rather than
    release every record until its delivery limit)."""

    def __init__(
        self,
        admin: AdminClient,
        config: ShareGroupConfig,
        call_s: float,
        handler_timeout_s: float,
        *,
        interval_s: float = REFRESH_S,
        read: Callable[[AdminClient, str], ShareGroupConfig] = read_group_config,
    ) -> None:
        self.admin = admin
        self.current = config
        self.call_s = call_s
        self.handler_timeout_s = handler_timeout_s
        self.interval_s = interval_s
        self._read = read
        self._lock = threading.Lock()
        self._changed: ShareGroupConfig | None = None
        self.failing = False  # the last read failed (logged once)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="retryd-share-config", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.refresh()

    def refresh(self) -> ShareGroupConfig | None:
        """Read the configuration once; returns it when it changed (else None)."""
        group = self.current.group
        try:
            fresh = self._read(self.admin, group)
        except (RetrydError, KafkaException, TimeoutError) as exc:
            if not self.failing:
                self.failing = True
                log.warning(
                    "share group %s: cannot read its configuration again (%s); the worker "
                    "keeps %s=%d and %s=%d",
                    group,
                    exc,
                    LOCK,
                    self.current.lock_ms,
                    LIMIT,
                    self.current.delivery_limit,
                )
            return None
        if self.failing:
            self.failing = False
            log.info("share group %s: its configuration is read again", group)
        old = self.current
        if (fresh.lock_ms, fresh.delivery_limit) == (old.lock_ms, old.delivery_limit):
            return None
        log.warning(
            "share group %s: %s %d -> %d, %s %d -> %d (from the next poll)",
            group,
            LOCK,
            old.lock_ms,
            fresh.lock_ms,
            LIMIT,
            old.delivery_limit,
            fresh.delivery_limit,
        )
        if not lock_holds(fresh, self.call_s):
            log.error(
                "share group %s: %s=%d no longer holds a handler call (handler_timeout_s=%g, "
                "%gs with its quick retries, plus %gs): a call that outlasts it is handed to "
                "another consumer while it runs. The worker carries on, starting a record "
                "while half its lock is left; raise the lock again or lower handler_timeout_s",
                group,
                LOCK,
                fresh.lock_ms,
                self.handler_timeout_s,
                self.call_s,
                LOCK_MARGIN_S,
            )
        self.current = fresh
        with self._lock:
            self._changed = fresh
        return fresh

    def take(self) -> ShareGroupConfig | None:
        """The configuration read since the last ``take``, if it changed (the poll thread)."""
        with self._lock:
            changed, self._changed = self._changed, None
        return changed


def lock_holds(config: ShareGroupConfig, call_s: float) -> bool:
    """Does the group's lock hold a whole call, its routing and its acknowledgement?"""
    return call_s + LOCK_MARGIN_S < config.lock_ms / 1000


def start_budget_s(config: ShareGroupConfig, call_s: float) -> float:
    """How much of its lock a record must have left to start: a whole call and the margin,
    or (a lock shortened below that while running) half the lock."""
    if lock_holds(config, call_s):
        return call_s + LOCK_MARGIN_S
    return config.lock_ms / 2000
