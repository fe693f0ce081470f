"""Role ``all`` with the tiers on their own consumer: two group members behind one consumer.

Why two members. One consumer shares its prefetch and its assignment between the main topics
and the tiers. Deep tiers (a million records not yet due) then fill the shared fetch queue and
the process's memory grows with them; and on the classic protocol a member that joins late can
be given only tier partitions, so ``--processes 2`` barely beat one. A tiers consumer of its
own has its own small prefetch (``tier_prefetch_kbytes``, as a tiers-only worker has) and its
own assignment; the main consumer subscribes to the main topics alone, so every member gets
its share of them.

Why one facade. The engine drives one ``ConsumerLike``: its pauses, offsets, commits and
rebalance callbacks are keyed by topic, so this class sends each call to the member that owns
the topic and ``consume()`` serves both members. Everything above (scheduler, pool, breaker,
settler, partition book) stays one per process: a record is a record whichever member
fetched it.

Serving both members. ``consume()`` takes what the tiers member has without waiting, leaving a
quarter of the batch to the main member (``main_reserve``), then polls the main member on
every call, waiting at most ``TIERS_WAKE_S`` (or the caller's timeout): a tier record
fetched up to that late is never handed back late, since the engine's own timeout is bounded
by the next due time, and a record entering a tier is due one whole tier delay later. Each
member's rebalance callbacks run inside its own ``consume()``, on the poll thread, as before.

Not with exactly-once routing: a transaction commits input offsets under one member's group
metadata (the broker fences on that member's generation), so an exactly-once worker keeps one
consumer (``retryd.worker.assembly`` decides).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from retryd.worker.book import ConsumerLike

TIERS_WAKE_S = 0.1  # a wait on the main member is cut this short so the tiers member is served


def main_reserve(num_messages: int) -> int:
    """Room of each batch the tiers member may not take: a quarter, at least one record, so
    the main member is polled (and handed records) on every ``consume`` however deep the
    tiers are. Zero for a batch of one: one record cannot be split between two members;
    then the members take turns (``SplitConsumer.consume``)."""
    return max(1, num_messages // 4) if num_messages > 1 else 0


class SplitConsumer:
    """Main topics on one member, tier topics on another, driven as one consumer."""

    def __init__(self, main: ConsumerLike, tiers: ConsumerLike, tier_topics: Iterable[str]) -> None:
        self.main = main
        self.tiers = tiers
        self._tier_topics = frozenset(tier_topics)
        self._main_turn = False  # batches of one alternate which member is asked first

    def _split(
        self, partitions: Iterable[TopicPartition]
    ) -> tuple[list[TopicPartition], list[TopicPartition]]:
        main: list[TopicPartition] = []
        tiers: list[TopicPartition] = []
        for p in partitions:
            (tiers if p.topic in self._tier_topics else main).append(p)
        return main, tiers

    def _each(
        self, partitions: Iterable[TopicPartition], call: Callable[[ConsumerLike, list], Any]
    ) -> list[Any]:
        main, tiers = self._split(partitions)
        out: list[Any] = []
        if main:
            out.append(call(self.main, main))
        if tiers:
            out.append(call(self.tiers, tiers))
        return out

    # ------------------------------------------------------------------ membership
    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        main = [t for t in topics if t not in self._tier_topics]
        tiers = [t for t in topics if t in self._tier_topics]
        if main:
            self.main.subscribe(main, **callbacks)
        if tiers:
            self.tiers.subscribe(tiers, **callbacks)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        """Up to ``num_messages`` records from both members; **each call polls both**.

        The tiers member is served first and without waiting, but it may fill at most
        ``num_messages - main_reserve(num_messages)`` of the batch: the main member is then
        polled on every call, with the rest of the room (its own wait only when the tiers
        member had nothing). Without that reserve a tier full of due copies (an outage's
        backlog) took whole batches and the main member went unpolled until the drain ended:
        main records waited seconds, and a drain longer than ``max.poll.interval.ms`` would
        drop the main member from its group (issue 31, fault 9).
        """
        reserve = main_reserve(num_messages)
        if reserve == 0:
            # a batch of one: every other call asks the main member first
            self._main_turn = not self._main_turn
            if self._main_turn:
                out = list(self.main.consume(1, 0))
                if out:
                    return out
        tier_room = num_messages - reserve
        out = list(self.tiers.consume(tier_room, 0))
        room = num_messages - len(out)
        if room <= 0:
            return out
        tiers_full = len(out) == tier_room
        wait = 0.0 if out else (TIERS_WAKE_S if timeout < 0 else min(timeout, TIERS_WAKE_S))
        out += self.main.consume(room, wait)
        if tiers_full and len(out) < num_messages:
            # the main member left part of its quarter: the tiers may have it
            out += self.tiers.consume(num_messages - len(out), 0)
        return out

    def close(self) -> None:
        try:
            self.main.close()
        finally:
            self.tiers.close()

    # ------------------------------------------------------------------ per partition
    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._each(partitions, lambda c, ps: c.incremental_assign(ps))

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._each(partitions, lambda c, ps: c.incremental_unassign(ps))

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._each(partitions, lambda c, ps: c.pause(ps))

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._each(partitions, lambda c, ps: c.resume(ps))

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[Any]:
        out: list[Any] = []
        for part in self._each(partitions, lambda c, ps: c.committed(ps, timeout=timeout)):
            out += part
        return out

    def store_offsets(self, *args: Any, **kwargs: Any) -> None:
        offsets = kwargs.get("offsets")
        if args or offsets is None:
            raise TypeError("SplitConsumer.store_offsets takes offsets=[...] only")
        self._each(offsets, lambda c, ps: c.store_offsets(offsets=ps))

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        offsets = kwargs.pop("offsets", None)
        if args:
            raise TypeError("SplitConsumer.commit takes keyword arguments only")
        if offsets is None:
            # every stored offset, on both members; "nothing stored" only if on neither
            empty: list[KafkaException] = []
            for member in (self.main, self.tiers):
                try:
                    member.commit(**kwargs)
                except KafkaException as exc:
                    if not (exc.args and exc.args[0].code() == KafkaError._NO_OFFSET):
                        raise
                    empty.append(exc)
            if len(empty) == 2:
                raise empty[0]
            return None
        self._each(offsets, lambda c, ps: c.commit(offsets=ps, **kwargs))
        return None

    # ------------------------------------------------------------------ cluster
    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        return self.main.list_topics(*args, **kwargs)

    def consumer_group_metadata(self) -> Any:
        raise TypeError("a split consumer has two members: exactly-once keeps one consumer")


__all__ = ["TIERS_WAKE_S", "SplitConsumer", "main_reserve"]
