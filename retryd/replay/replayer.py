"""Replay one failed record: pick and check the target, consult the ledger, produce, record.

How the copy itself is made lives in ``copies``; which topics may be targets in ``targets``.
A copy the target refuses for its size, sent alone, raises ``RecordTooLarge`` (422
``too_large``): nothing was written and the ledger gets no entry.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from retryd.replay import audit
from retryd.replay.copies import (
    CopyProducer,
    copy_size,
    effective_delivery_timeout_s,
    is_too_large,
    refusal,
    replay_copy_kwargs,
    too_large_text,
    who,
)

# Re-exported: callers (sidecar jobs, the Spark replay task) import them from here.
from retryd.replay.copies import replay_producer_config as replay_producer_config
from retryd.replay.copies import send_replay_copy as send_replay_copy
from retryd.replay.copies import target_partition as target_partition
from retryd.replay.errors import (
    AlreadyReplayed,
    BrokerUnavailable,
    RateLimited,
    RecordTooLarge,
    ReplayFailed,
)
from retryd.replay.fence import Fence
from retryd.replay.ledger import LedgerEntry, LedgerError, ReplayLedger
from retryd.replay.ratelimit import SharedRateLimit
from retryd.replay.records import FailedRecord
from retryd.replay.targets import TargetPolicy as TargetPolicy
from retryd.tracing import NO_TRACING, Tracing

log = logging.getLogger(__name__)


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
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self.common = common
        self.tracing = tracing  # a replayed copy's trace (retryd.tracing)
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
        self._producer: CopyProducer | None = None
        self._lock = threading.Lock()

    def _get_producer(self) -> CopyProducer:
        with self._lock:
            if self._producer is None:
                self._producer = CopyProducer(self.ledger.clients.producer, self.conf)
            return self._producer

    def replay(
        self,
        rec: FailedRecord,
        *,
        target: str | None = None,
        force: bool = False,
        actor: str = "cli",
    ) -> ReplayOutcome:
        """Replay ``rec`` once; raises TargetRefused, AlreadyReplayed, RecordTooLarge,
        ReplayFailed, BrokerUnavailable, RateLimited, ShuttingDown. Counts
        ``retryd_replayed_total{status}`` and writes one audit line naming ``actor``."""
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
        from retryd.metrics.registry import REPLAYED

        producer = self._get_producer()
        kwargs = replay_copy_kwargs(rec, topic, count, replay_id, self.tracing)
        where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
        err, msg = self._deliver(producer.main, topic, kwargs, where)
        if is_too_large(err):  # refused in a batch, maybe for another copy's size: alone now
            err, msg = self._deliver(producer.solo, topic, kwargs, where)
        if err is not None:
            if is_too_large(err):
                self._too_large(where, topic, kwargs, err.str())
            REPLAYED.labels(status="failed").inc()
            raise ReplayFailed(f"producing the copy to {topic} failed: {err.str()}")
        return msg.partition() or 0, msg.offset() or 0

    def _deliver(
        self, producer: Producer, topic: str, kwargs: dict[str, Any], where: str
    ) -> tuple[KafkaError | None, Message]:
        """Produce one copy and wait for its delivery report (error, message)."""
        result: list[tuple[KafkaError | None, Message]] = []
        try:
            producer.produce(topic, on_delivery=lambda e, m: result.append((e, m)), **kwargs)
        except KafkaException as exc:
            err = refusal(exc)
            if err is not None and is_too_large(err):  # over message.max.bytes: refused here
                self._too_large(where, topic, kwargs, err.str())
            raise ReplayFailed(f"cannot produce to {topic}: {exc}") from exc
        except BufferError as exc:
            raise ReplayFailed(f"cannot produce to {topic}: {exc}") from exc
        deadline = time.monotonic() + self.delivery_wait_s
        while not result and time.monotonic() < deadline:
            producer.poll(0.05)
        if not result:
            raise ReplayFailed(
                f"the copy to {topic} got no delivery report in {self.delivery_wait_s:g}s "
                "(outcome unknown: it may exist without a ledger entry)"
            )
        return result[0]

    @staticmethod
    def _too_large(where: str, topic: str, kwargs: dict[str, Any], why: str) -> NoReturn:
        from retryd.metrics.registry import REPLAYED

        text = too_large_text(where, topic, copy_size(kwargs), why)
        log.warning("%s", text)
        REPLAYED.labels(status="skipped").inc()
        raise RecordTooLarge(text)

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
