"""How a replayed copy is produced: producer settings, partition, headers, and the two-step
write (copy acknowledged, then its ledger entry) shared by sidecar jobs and Spark tasks.

The replayed copy keeps key, value and user headers byte for byte, loses every retryd header
(a fresh retry sequence) and gains ``retryd_replay_id`` and ``retryd_replayed_from``.

A copy the target cannot take because of its size is *skipped* (reason ``too_large``), never
a failure of the job: nothing was written and the ledger gets no entry. librdkafka batches the
copies of a partition, and a broker refusing a batch as too large (the topic's
``max.message.bytes``) fails every copy of it alike, so a copy refused so is sent once more
alone (``CopyProducer``) before it is judged: refused alone, it is too large itself.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from retryd.kafka.clients import producer_config
from retryd.policy.headers import replay_headers
from retryd.replay.ledger import LedgerEntry, ReplayLedger
from retryd.replay.records import FailedRecord
from retryd.tracing import NO_TRACING, Tracing

log = logging.getLogger(__name__)

TOO_LARGE = "too_large"  # the skip reason of a copy the target refuses for its size
# A batch the broker refuses for its size (the topic's max.message.bytes, or the segment
# size), and a copy larger than the producer's message.max.bytes (refused locally).
TOO_LARGE_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
# What the producer that resends a refused copy changes: a batch of one copy, sent at once.
SOLO_TUNING: dict[str, Any] = {"batch.num.messages": 1, "linger.ms": 0}


def is_too_large(err: object) -> bool:
    """Whether ``err`` (a delivery report's error) refuses a copy for its size."""
    return isinstance(err, KafkaError) and err.code() in TOO_LARGE_CODES


def refusal(exc: KafkaException) -> KafkaError | None:
    """The ``KafkaError`` a ``produce`` call raised (None if it carries none)."""
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


@dataclass(frozen=True, slots=True)
class CopyOutcome:
    """How one replayed copy ended: replayed (``skipped`` and ``error`` None), skipped
    (``skipped`` is the reason, ``error`` the sentence: nothing was written, no ledger entry,
    no failure) or failed (``error`` says why)."""

    skipped: str | None = None
    error: str | None = None

    @property
    def replayed(self) -> bool:
        return self.skipped is None and self.error is None


REPLAYED = CopyOutcome()


class CopyProducer:
    """The producer of replayed copies, and a second one, made when first needed, that sends a
    copy alone (``SOLO_TUNING``): a copy refused as too large in a batch is sent once more
    through it, so a small copy batched with a large one is not taken for too large. A batch
    the broker refused was not written at all, so the second send never duplicates a copy."""

    def __init__(self, factory: Callable[[dict[str, Any]], Any], conf: Mapping[str, Any]) -> None:
        self._factory = factory
        self._conf = dict(conf)
        self.main: Producer = factory(self._conf)
        self._solo: Producer | None = None
        self._lock = threading.Lock()  # single replays share one from request threads

    @property
    def solo(self) -> Producer:
        with self._lock:
            if self._solo is None:
                conf = {**self._conf, **SOLO_TUNING}
                conf["client.id"] = f"{conf.get('client.id', 'retryd-replay')}-alone"
                self._solo = self._factory(conf)
            return self._solo

    def poll(self, timeout_s: float) -> None:
        """Serve both producers' delivery reports (waiting at most ``timeout_s``)."""
        self.main.poll(timeout_s)
        if self._solo is not None:
            self._solo.poll(0)

    def flush(self, timeout_s: float) -> int:
        """Wait for every copy's report; how many are still without one."""
        left = self.main.flush(timeout_s)
        if self._solo is not None:
            left += self._solo.flush(timeout_s)
        return left


def copy_size(kwargs: Mapping[str, Any]) -> int:
    """Bytes of a copy's key, value and headers (what its size is judged on, near enough)."""
    size = len(kwargs.get("key") or b"") + len(kwargs.get("value") or b"")
    return size + sum(len(n) + len(v or b"") for n, v in kwargs.get("headers") or ())


def too_large_text(where: str, target: str, size: int, why: str) -> str:
    return (
        f"{where}: its copy ({size} bytes) is too large for {target} ({why}); skipped "
        f"({TOO_LARGE}): nothing was written, raise the topic's max.message.bytes (and the "
        "producer's message.max.bytes) to replay it"
    )


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
    producer: CopyProducer,
    ledger: ReplayLedger,
    rec: FailedRecord,
    target: str,
    partition_count: int,
    *,
    replay_id: str,
    forced: bool,
    by: str,
    on_done: Callable[[CopyOutcome], None],
    idle: Callable[[float], None],
    on_recorded: Callable[[LedgerEntry], None] | None = None,
    tracing: Tracing = NO_TRACING,
) -> None:
    """Produce one replayed copy asynchronously and, once the broker acknowledged it, record it in
    the ledger. ``on_done`` runs exactly once (maybe before this returns): ``REPLAYED`` when both
    are acknowledged, skipped ``too_large`` when the target refuses the copy alone for its size,
    else failed; ``on_recorded`` (optional) gets the ledger entry first, when both are
    acknowledged. Other local refusals of ``produce`` are raised as they were."""
    where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
    written: list[LedgerEntry] = []
    kwargs = replay_copy_kwargs(rec, target, partition_count, replay_id, tracing)

    def skip(why: str) -> None:
        text = too_large_text(where, target, copy_size(kwargs), why)
        log.warning("%s", text)
        on_done(CopyOutcome(skipped=TOO_LARGE, error=text))

    def ledger_done(err: KafkaError | None, offset: int | None) -> None:
        if err is None and on_recorded is not None and written:
            on_recorded(written[0])
        if err is None:
            on_done(REPLAYED)
            return
        on_done(CopyOutcome(error=f"{where}: replayed but the ledger write failed: {err.str()}"))

    def delivered(err: KafkaError | None, msg: Message, alone: bool = False) -> None:
        if is_too_large(err) and not alone:
            resend_alone()
            return
        if err is not None:
            if is_too_large(err):
                skip(err.str())
                return
            log.error("replaying %s to %s failed: %s", where, target, err.str())
            on_done(
                CopyOutcome(error=f"{where}: producing the copy to {target} failed: {err.str()}")
            )
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

    def resend_alone() -> None:
        """Refused in a batch: maybe for another copy's size. Alone, it is judged on its own."""
        try:
            producer.solo.produce(
                target, on_delivery=lambda e, m: delivered(e, m, alone=True), **kwargs
            )
        except KafkaException as exc:
            err = refusal(exc)
            if is_too_large(err):
                skip(err.str() if err is not None else str(exc))
            else:
                on_done(CopyOutcome(error=f"{where}: resending the copy to {target}: {exc}"))
        except BufferError as exc:  # a producer that sends one copy at a time cannot be full
            on_done(CopyOutcome(error=f"{where}: resending the copy to {target}: {exc}"))

    while True:
        try:
            producer.main.produce(target, on_delivery=delivered, **kwargs)
            break
        except BufferError:
            idle(0.05)  # local queue full: serve acknowledgements to make room
        except KafkaException as exc:
            err = refusal(exc)
            if err is None or not is_too_large(err):
                raise
            skip(err.str())  # larger than the producer's message.max.bytes: refused locally
            return
    idle(0)
