"""Replay one failed record: pick and check the target, consult the ledger, produce, record.

The replayed copy keeps key, value and user headers byte for byte, loses every retryd header
(a fresh retry sequence) and gains ``retryd_replay_id`` and ``retryd_replayed_from``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from retryd.errors import SequenceError
from retryd.kafka.clients import new_consumer, new_producer, producer_config, reader_config
from retryd.policy.headers import replay_headers
from retryd.policy.sequence import validate_topic_name
from retryd.replay import audit
from retryd.replay.errors import (
    AlreadyReplayed,
    BrokerUnavailable,
    InvalidTarget,
    RateLimited,
    ReplayFailed,
    TargetRefused,
    TargetReserved,
)
from retryd.replay.fence import Fence
from retryd.replay.ledger import LedgerEntry, LedgerError, ReplayLedger
from retryd.replay.ratelimit import SharedRateLimit
from retryd.replay.records import FailedRecord
from retryd.replay.scan import partitions_of

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


def new_replay_id(prefix: str = "r") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    replay_id: str
    coordinate: str
    target_topic: str
    target_partition: int
    target_offset: int
    forced: bool
    previous: LedgerEntry | None
    concurrent: tuple[LedgerEntry, ...] = ()


class TargetPolicy:
    """Which topics a replay may write to: ``replay_allowlist``, or the main topics if empty.

    Never a target, whatever the allow-list says: ``reserved`` topics (retryd's own: the
    ledger, ``failed_topic``, the tiers; name -> what it is) and Kafka-internal topics (names
    starting with ``__``). A copy replayed into a tier or into ``failed_topic`` would skip the
    retry sequence or loop; one in the ledger or ``__consumer_offsets`` corrupts state.

    Topic existence is looked up once per topic and cached briefly (metadata requests are not
    free, and a bulk job asks for every record).
    """

    def __init__(
        self,
        common: dict[str, str],
        allowlist: list[str],
        ttl_s: float = 30.0,
        *,
        reserved: Mapping[str, str] | None = None,
    ) -> None:
        self.reserved = dict(reserved or {})
        self.allowed = frozenset(t for t in allowlist if self.refusal(t) is None)
        self.ttl_s = ttl_s
        self._meta: Consumer | None = None
        self._common = common
        self._cache: dict[str, tuple[float, int | None]] = {}
        self._lock = threading.Lock()

    def choose(self, rec: FailedRecord, target: str | None) -> str:
        """The target topic for ``rec``; raises TargetRefused with the reason."""
        topic = target or rec.original_topic
        if not topic:
            raise InvalidTarget(
                f"record {rec.coord} has no readable retryd_original_topic header: "
                "give an explicit target"
            )
        try:
            validate_topic_name(topic)
        except SequenceError as exc:
            raise InvalidTarget(str(exc)) from exc
        self.require_allowed(topic)
        return topic

    def refusal(self, topic: str) -> str | None:
        """Why ``topic`` can never be a replay target, or None."""
        kind = self.reserved.get(topic)
        if kind is not None:
            return f"target topic {topic} is {kind}"
        if topic.startswith("__"):
            return f"target topic {topic} is a Kafka-internal topic (its name starts with __)"
        return None

    def require_allowed(self, topic: str) -> None:
        reason = self.refusal(topic)
        if reason is not None:
            raise TargetReserved(
                f"{reason}: replaying into it is refused whatever replay_allowlist says"
            )
        if topic not in self.allowed:
            allowed = ", ".join(sorted(self.allowed)) or "(empty: set replay_allowlist)"
            raise TargetRefused(f"target topic {topic} is not in the replay allow-list ({allowed})")

    def partitions(self, topic: str, timeout_s: float = 5.0) -> int | None:
        """Partition count of ``topic`` (None when it does not exist)."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(topic)
            if hit is not None and now - hit[0] < self.ttl_s:
                return hit[1]
            if self._meta is None:  # a consumer: asking never auto-creates the topic
                self._meta = new_consumer(reader_config(self._common, "meta"))
            meta = self._meta
        parts = partitions_of(meta, topic, timeout_s)
        count = len(parts) if parts is not None else None
        with self._lock:
            self._cache[topic] = (now, count)
        return count

    def close(self) -> None:
        with self._lock:
            if self._meta is not None:
                self._meta.close()
                self._meta = None

    def require_existing(self, topic: str) -> int:
        count = self.partitions(topic)
        if count is None:
            raise InvalidTarget(f"target topic {topic} does not exist")
        return count


def target_partition(rec: FailedRecord, topic: str, partition_count: int) -> int | None:
    """Same partition as the original when replaying into the original topic, else keyed."""
    original = rec.original_partition
    if topic == rec.original_topic and original is not None and original < partition_count:
        return original
    return None


def who() -> str:
    return f"{socket.gethostname()}"


class Replayer:
    """Single-record replays for the API and the CLI. Thread-safe.

    Each replay runs inside ``fence`` (``close`` waits for it) and takes a token of the shared
    ``ceiling`` (the sidecar-wide replay rate) before producing.
    """

    def __init__(
        self,
        common: dict[str, str],
        ledger: ReplayLedger,
        policy: TargetPolicy,
        *,
        by: str = "sidecar",
        timeout_s: float = 10.0,
        delivery_timeout_s: float | None = None,
        ceiling: SharedRateLimit | None = None,
    ) -> None:
        self.common = common
        self.ledger = ledger
        self.policy = policy
        self.by_prefix = by
        self.timeout_s = timeout_s
        self.conf = replay_producer_config(common, delivery_timeout_s)
        # Wait for the delivery report itself (it comes within message.timeout.ms), so a copy
        # is never left with an unknown outcome.
        self.delivery_wait_s = effective_delivery_timeout_s(self.conf) + timeout_s
        self.ceiling = ceiling
        self.fence = Fence()
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def _get_producer(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = new_producer(self.conf)
            return self._producer

    def replay(
        self,
        rec: FailedRecord,
        *,
        target: str | None = None,
        force: bool = False,
        actor: str = "cli",
    ) -> ReplayOutcome:
        """Replay ``rec`` once; raises TargetRefused, AlreadyReplayed, ReplayFailed,
        BrokerUnavailable, RateLimited, ShuttingDown. Counts ``retryd_replayed_total{status}``
        and writes one audit line naming ``actor``."""
        with self.fence.enter("replay"):
            return self._replay(rec, target, force, actor)

    def _replay(
        self, rec: FailedRecord, target: str | None, force: bool, actor: str
    ) -> ReplayOutcome:
        from retryd.metrics.registry import REPLAYED

        topic = self.policy.choose(rec, target)
        count = self.policy.require_existing(topic)
        coord = rec.coord
        try:
            with self.ledger.claim(coord, self.timeout_s):
                try:
                    self.ledger.refresh()
                except LedgerError as exc:
                    raise BrokerUnavailable(f"cannot read the replay ledger: {exc}") from exc
                previous = self.ledger.get(coord)
                if previous is not None and not force:
                    REPLAYED.labels(status="skipped").inc()
                    raise AlreadyReplayed(
                        f"record {coord} was already replayed (replay_id={previous.replay_id}, "
                        f"to {previous.target_topic}); use force=true to replay it again",
                        previous,
                    )
                if self.ceiling is not None and not self.ceiling.acquire(self.timeout_s):
                    raise RateLimited(
                        f"the sidecar's replay rate ceiling ({self.ceiling.rate:g}/s, "
                        "replay_max_per_second) is reached; try again shortly"
                    )
                replay_id = new_replay_id()
                part, offset = self._produce(rec, topic, count, replay_id)
                entry = LedgerEntry(
                    replay_id=replay_id,
                    target_topic=topic,
                    target_partition=part,
                    target_offset=offset,
                    replayed_at_ms=int(time.time() * 1000),
                    forced=previous is not None,
                    by=f"{self.by_prefix}:{actor}@{who()}",
                )
                try:
                    self.ledger.record(coord, entry)
                except LedgerError as exc:
                    REPLAYED.labels(status="failed").inc()
                    log.error(
                        "%s[%d]@%d replayed to %s[%d]@%d but %s",
                        rec.topic,
                        rec.partition,
                        rec.offset,
                        topic,
                        part,
                        offset,
                        exc,
                    )
                    raise ReplayFailed(
                        f"the copy was written to {topic}[{part}]@{offset} but the ledger write "
                        f"failed ({exc}); the record may be replayed again"
                    ) from exc
                concurrent = tuple(self._competing(coord, entry))
        except LedgerError as exc:  # claim timeout
            raise ReplayFailed(str(exc)) from exc
        REPLAYED.labels(status="replayed").inc()
        audit.replayed(
            actor=actor,
            record=str(coord),
            target=topic,
            partition=part,
            offset=offset,
            replay_id=replay_id,
            forced=previous is not None,
        )
        return ReplayOutcome(
            replay_id, str(coord), topic, part, offset, previous is not None, previous, concurrent
        )

    def _competing(self, coord: Any, entry: LedgerEntry) -> list[LedgerEntry]:
        try:
            found = self.ledger.competing_writes(coord, entry)
        except (LedgerError, BrokerUnavailable) as exc:
            log.warning("could not re-read the ledger after replaying %s: %s", coord, exc)
            return []
        for other in found:
            log.warning(
                "record %s was replayed concurrently by %s (replay_id=%s)",
                coord,
                other.by,
                other.replay_id,
            )
        return found

    def _produce(
        self, rec: FailedRecord, topic: str, count: int, replay_id: str
    ) -> tuple[int, int]:
        producer = self._get_producer()
        result: list[tuple[KafkaError | None, Message]] = []
        kwargs = replay_copy_kwargs(rec, topic, count, replay_id)
        kwargs["on_delivery"] = lambda err, msg: result.append((err, msg))
        try:
            producer.produce(topic, **kwargs)
        except (BufferError, KafkaException) as exc:
            raise ReplayFailed(f"cannot produce to {topic}: {exc}") from exc
        deadline = time.monotonic() + self.delivery_wait_s
        while not result and time.monotonic() < deadline:
            producer.poll(0.05)
        if not result:
            raise ReplayFailed(
                f"the copy to {topic} got no delivery report in {self.delivery_wait_s:g}s "
                "(outcome unknown: it may exist without a ledger entry)"
            )
        err, msg = result[0]
        if err is not None:
            from retryd.metrics.registry import REPLAYED

            REPLAYED.labels(status="failed").inc()
            raise ReplayFailed(f"producing the copy to {topic} failed: {err.str()}")
        return msg.partition() or 0, msg.offset() or 0

    def close(self, timeout_s: float | None = None) -> int:
        """Refuse new replays, wait for those in progress (each is bounded by its delivery
        and ledger waits), then close the producer. Returns how many were still running."""
        left = self.fence.close(timeout_s if timeout_s is not None else self.shutdown_bound_s())
        with self._lock:
            if self._producer is not None:
                self._producer.flush(self.delivery_wait_s)
                self._producer = None
        return left

    def shutdown_bound_s(self) -> float:
        """The longest a replay in progress can take: ledger read, copy, ledger write."""
        return self.timeout_s * 3 + self.delivery_wait_s * 2


def replay_copy_kwargs(
    rec: FailedRecord, target: str, partition_count: int, replay_id: str
) -> dict[str, Any]:
    """``Producer.produce`` arguments of a replayed copy: key and value as they were, a fresh
    retry sequence, the replay headers, the source's partition number where the target has it."""
    kwargs: dict[str, Any] = {
        "key": rec.key,
        "value": rec.value,
        "headers": replay_headers(rec.headers, replay_id=replay_id, replayed_from=str(rec.coord)),
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

    kwargs = replay_copy_kwargs(rec, target, partition_count, replay_id)
    while True:
        try:
            producer.produce(target, on_delivery=delivered, **kwargs)
            break
        except BufferError:
            idle(0.05)  # local queue full: serve acknowledgements to make room
    idle(0)
