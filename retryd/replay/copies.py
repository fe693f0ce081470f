"""How a replayed copy is produced: producer settings, partition, headers, and the two-step
write (copy acknowledged, then its ledger entry) shared by sidecar jobs and Spark tasks.

The replayed copy keeps key, value and user headers byte for byte, loses every retryd header
(a fresh retry sequence) and gains ``retryd_replay_id`` and ``retryd_replayed_from``.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from retryd.kafka.clients import producer_config
from retryd.policy.headers import replay_headers
from retryd.replay.ledger import LedgerEntry, ReplayLedger
from retryd.replay.records import FailedRecord
from retryd.tracing import NO_TRACING, Tracing

log = logging.getLogger(__name__)


def replay_producer_config(
    common: dict[str, str], delivery_timeout_s: float | None = None
) -> dict[str, Any]:
    """Replayed copies are keyed like the original (librdkafka's default partitioner unless
    the user set one). ``delivery_timeout_s`` (``message.timeout.ms``) bounds how long a copy
    may stay without a definite outcome; None keeps librdkafka's default (5 minutes)."""
    tuning: dict[str, Any] = {
        "partitioner": common.get("partitioner", "murmur2_random"),
        "log_level": 3,
    }
    if delivery_timeout_s is not None:
        tuning["message.timeout.ms"] = int(delivery_timeout_s * 1000)
    return producer_config(common, "replay", **tuning)


def effective_delivery_timeout_s(conf: Mapping[str, Any]) -> float:
    """The ``message.timeout.ms`` a producer built from ``conf`` uses (a pass-through value
    wins over retryd's): every copy gets its delivery report within it."""
    raw = conf.get("message.timeout.ms", conf.get("delivery.timeout.ms", 300_000))
    try:
        value = float(raw) / 1000
    except (TypeError, ValueError):
        return 300.0
    return value if value > 0 else 300.0


def target_partition(rec: FailedRecord, topic: str, partition_count: int) -> int | None:
    """Same partition as the original when replaying into the original topic, else keyed."""
    original = rec.original_partition
    if topic == rec.original_topic and original is not None and original < partition_count:
        return original
    return None


def who() -> str:
    return f"{socket.gethostname()}"


def replay_copy_kwargs(
    rec: FailedRecord,
    target: str,
    partition_count: int,
    replay_id: str,
    tracing: Tracing = NO_TRACING,
) -> dict[str, Any]:
    """``Producer.produce`` arguments of a replayed copy: key and value as they were, a fresh
    retry sequence, the replay headers, the source's partition number where the target has it.
    With tracing on, a fresh ``traceparent`` in the dead letter's trace (``retryd.tracing``)."""
    headers = replay_headers(rec.kept_headers, replay_id=replay_id, replayed_from=str(rec.coord))
    kwargs: dict[str, Any] = {
        "key": rec.key,
        "value": rec.value,
        "headers": tracing.replay_headers(headers, target) if tracing.enabled else headers,
    }
    part = target_partition(rec, target, partition_count)
    if part is not None:
        kwargs["partition"] = part
    return kwargs


def send_replay_copy(
    producer: Producer,
    ledger: ReplayLedger,
    rec: FailedRecord,
    target: str,
    partition_count: int,
    *,
    replay_id: str,
    forced: bool,
    by: str,
    on_done: Callable[[str | None], None],
    idle: Callable[[float], None],
    on_recorded: Callable[[LedgerEntry], None] | None = None,
    tracing: Tracing = NO_TRACING,
) -> None:
    """Produce one replayed copy asynchronously and, once the broker acknowledged it, record it in
    the ledger. ``on_done`` runs exactly once: None when both are acknowledged, else why not;
    ``on_recorded`` (optional) gets the ledger entry first, when both are acknowledged."""
    where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
    written: list[LedgerEntry] = []

    def ledger_done(err: KafkaError | None, offset: int | None) -> None:
        if err is None and on_recorded is not None and written:
            on_recorded(written[0])
        on_done(
            None if err is None else f"{where}: replayed but the ledger write failed: {err.str()}"
        )

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            log.error("replaying %s to %s failed: %s", where, target, err.str())
            on_done(f"{where}: producing the copy to {target} failed: {err.str()}")
            return
        entry = LedgerEntry(
            replay_id=replay_id,
            target_topic=target,
            target_partition=msg.partition(),
            target_offset=msg.offset(),
            replayed_at_ms=int(time.time() * 1000),
            forced=forced,
            by=by,
        )
        written.append(entry)
        ledger.record_async(rec.coord, entry, ledger_done)

    kwargs = replay_copy_kwargs(rec, target, partition_count, replay_id, tracing)
    while True:
        try:
            producer.produce(target, on_delivery=delivered, **kwargs)
            break
        except BufferError:
            idle(0.05)  # local queue full: serve acknowledgements to make room
    idle(0)
