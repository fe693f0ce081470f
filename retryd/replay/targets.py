"""Which topics a replay may write to (the allow-list, and the topics that are never targets)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from confluent_kafka import Consumer

from retryd.config import Settings
from retryd.errors import SequenceError
from retryd.kafka.clients import reader_config
from retryd.policy.sequence import validate_topic_name
from retryd.replay.clients import KAFKA, ReplayClients
from retryd.replay.errors import InvalidTarget, NothingToReplay, TargetRefused, TargetReserved
from retryd.replay.records import FailedRecord
from retryd.replay.scan import partitions_of


def reserved_topics(settings: Settings) -> dict[str, str]:
    """retryd's own topics, never a replay target whatever the allow-list says: a copy in a
    named dead-letter topic (an error route's ``dlt:<topic>``, or another system's in
    ``foreign_dead_letters``) would be dead on arrival, like one in ``failed_topic``."""
    plan = settings.plan
    reserved = {tier: "a retry tier of this deployment" for tier in plan.tier_topics}
    for dlt in plan.dlt_topics:
        reserved[dlt] = "a dead-letter topic of an error route (dlt:)"
    for topic in settings.foreign_dead_letters:
        reserved[topic] = "another system's dead-letter topic (foreign_dead_letters)"
    reserved[settings.failed_topic] = "this deployment's failed_topic"
    reserved[settings.ledger_topic] = "the replay ledger"
    # strict key order's chain entries: a replayed record there would be read as an entry
    # (or skipped as malformed) by every worker's view, never handled
    reserved[settings.key_state_topic] = "the key-state topic (key_order = strict)"
    return reserved


class TargetPolicy:
    """Which topics a replay may write to: ``replay_allowlist``, or the main topics if empty.

    Never a target, whatever the allow-list says: ``reserved`` topics (retryd's own: the
    ledger, ``failed_topic``, the error routes' dead-letter topics, the tiers; name -> what it
    is) and Kafka-internal topics (names starting with ``__``). A copy replayed into a tier or
    into a dead-letter topic would skip the retry sequence or loop; one in the ledger or
    ``__consumer_offsets`` corrupts state.

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
        clients: ReplayClients = KAFKA,
    ) -> None:
        self.reserved = dict(reserved or {})
        self.clients = clients
        self.allowed = frozenset(t for t in allowlist if self.refusal(t) is None)
        self.ttl_s = ttl_s
        self._meta: Consumer | None = None
        self._common = common
        self._cache: dict[str, tuple[float, int | None]] = {}
        self._lock = threading.Lock()

    def choose(self, rec: FailedRecord, target: str | None) -> str:
        """The target topic for ``rec``; raises TargetRefused with the reason (and
        NothingToReplay for a dead letter that holds no record)."""
        empty = rec.nothing_to_replay
        if empty is not None:
            raise NothingToReplay(empty)
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
                self._meta = self.clients.consumer(reader_config(self._common, "meta"))
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
