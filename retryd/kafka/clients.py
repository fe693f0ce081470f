"""The one place that configures and builds librdkafka clients.

Every consumer, producer and admin client retryd creates (worker, router, replay, ledger, lag
monitor, readiness, pipeline, dev) is configured here, so three things hold everywhere:

- the cluster options (``bootstrap.servers`` plus the user's pass-through, security included)
  reach every client;
- the options the at-least-once design depends on (``_GROUP_FIXED``, ``_READER_FIXED``,
  ``_PRODUCER_FIXED``) cannot be changed by pass-through: a conflicting user value is ignored
  with a warning, never silently;
- librdkafka's own log lines go through Python logging (``retryd.librdkafka``), and error
  messages built from a configuration never carry secrets (``redact``).

Precedence, lowest first: the purpose's tuning defaults < the user's pass-through < fixed keys.
Functions take ``common`` (a plain dict) rather than ``Settings`` because Spark executors only
receive the cluster options, not the whole settings object.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from retryd.config.settings import redact_kafka as redact
from retryd.errors import KafkaSetupError

if TYPE_CHECKING:
    from retryd.config import Settings

log = logging.getLogger(__name__)
# librdkafka's own log lines, routed through Python logging (served from poll/consume).
librdkafka_log = logging.getLogger("retryd.librdkafka")

# A group member that stores offsets itself, only once a message is finished.
_GROUP_FIXED: dict[str, Any] = {
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "partition.assignment.strategy": "cooperative-sticky",
}
# assign()-only readers: never commit anything for any group.
_READER_FIXED: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
}
_PRODUCER_FIXED: dict[str, Any] = {"acks": "all", "enable.idempotence": True}


def common_config(settings: Settings) -> dict[str, str]:
    """Cluster options shared by every client: bootstrap servers and the user's pass-through."""
    return settings.kafka_common()


def _merge(
    tuning: Mapping[str, Any], common: Mapping[str, Any], fixed: Mapping[str, Any], purpose: str
) -> dict[str, Any]:
    out: dict[str, Any] = {"client.id": f"retryd-{purpose}", **tuning, **common}
    for key, value in fixed.items():
        if key in common and str(common[key]).lower() != str(value).lower():
            log.warning(
                "ignoring kafka option %s=%s for the %s client: retryd requires %s",
                key,
                common[key],
                purpose,
                value,
            )
        out[key] = value
    out.setdefault("logger", librdkafka_log)
    return out


# The broker-driven protocol (KIP-848): the broker assigns, with the range assignor (each
# topic split evenly, partition i of every topic on one member); session and heartbeat timing
# are the broker's (group.consumer.*), and librdkafka refuses them client-side.
_CONSUMER_PROTOCOL_FIXED: dict[str, Any] = {
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "group.protocol": "consumer",
    "group.remote.assignor": "range",
}
_CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")


def group_consumer_config(
    common: Mapping[str, Any],
    purpose: str,
    group_id: str,
    *,
    protocol: str = "classic",
    **tuning: Any,
) -> dict[str, Any]:
    """A consumer-group member with at-least-once offset handling (offsets stored by hand),
    on the ``classic`` group protocol (cooperative-sticky) or the ``consumer`` one."""
    base: dict[str, Any] = {
        "enable.auto.commit": True,
        "auto.commit.interval.ms": 1000,
        "auto.offset.reset": "earliest",
        **tuning,
    }
    if protocol == "consumer":
        for key in _CLASSIC_ONLY:
            base.pop(key, None)
        shared = {k: v for k, v in common.items() if k not in _CLASSIC_ONLY}
        if len(shared) != len(common):
            log.warning(
                "ignoring %s for the %s client: with group_protocol=consumer the broker sets "
                "them (group.consumer.*)",
                ", ".join(sorted(set(common) - set(shared))),
                purpose,
            )
        conf = _merge(base, shared, _CONSUMER_PROTOCOL_FIXED, purpose)
    else:
        conf = _merge(base, common, _GROUP_FIXED, purpose)
    conf["group.id"] = group_id
    return conf


def reader_config(common: Mapping[str, Any], purpose: str, **tuning: Any) -> dict[str, Any]:
    """A consumer for explicit ``assign()`` reads: no group membership, no commits.

    librdkafka insists on a ``group.id`` for a Consumer; it is never used to join or commit.
    """
    base: dict[str, Any] = {
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,  # a read often ends at the log end: do not idle there
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 1000,
        **tuning,
    }
    conf = _merge(base, common, _READER_FIXED, purpose)
    # Never the worker's group (a pass-through group.id must not leak in): unique and unused.
    conf["group.id"] = f"retryd-{purpose}-{uuid.uuid4().hex[:8]}"
    return conf


def producer_config(common: Mapping[str, Any], purpose: str, **tuning: Any) -> dict[str, Any]:
    """An idempotent acks=all producer: a copy is acknowledged only once it is durable."""
    base: dict[str, Any] = {"linger.ms": 5, **tuning}
    return _merge(base, common, _PRODUCER_FIXED, purpose)


def admin_config(common: Mapping[str, Any], purpose: str, **tuning: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 1000,
        **tuning,
    }
    return _merge(base, common, {}, purpose)


def _built(kind: str, factory: Any, conf: Mapping[str, Any]) -> Any:
    try:
        return factory(dict(conf))
    except (KafkaException, ValueError, TypeError) as exc:
        shown = {k: v for k, v in redact(conf).items() if k not in ("logger", "stats_cb")}
        raise KafkaSetupError(f"cannot create a Kafka {kind}: {exc} (options: {shown})") from exc


def new_consumer(conf: Mapping[str, Any]) -> Consumer:
    return _built("consumer", Consumer, conf)


def new_producer(conf: Mapping[str, Any]) -> Producer:
    return _built("producer", Producer, conf)


def new_admin(conf: Mapping[str, Any]) -> AdminClient:
    return _built("admin client", AdminClient, conf)
