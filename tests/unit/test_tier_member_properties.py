"""Role ``all``'s two group members behind one consumer (retryd.worker.split_consumer), as a
property: however deep the tiers are, the main member is polled and served (issue 31 fault 9,
the starvation: a tier full of due copies took whole batches and main records waited until
the drain ended), and nothing is lost or handed out twice between the two members.

Hypothesis draws the tiers' starting depths (up to a drain's worth), the batch size the
engine asks for (fixed per example, as the engine's is), whether end-of-partition events are
on, how the stub interleaves partitions inside a batch, and a sequence of steps: main or tier
records arriving, consumes, pauses and resumes of a partition (the engine pauses for its
buffers and its circuit). Per consume, with ``n`` asked for:

- **the main member is polled**: on every consume when ``n >= 2``; with ``n == 1`` (one record
  cannot be split) on at least one of any two consecutive consumes;
- **main's share**: when ``n >= 2`` the batch holds at least ``min(main ready, max(1, n // 4))``
  messages of the main member (a quarter, at least one record, while it has them); with
  ``n == 1``, a poll of a main member with a record ready hands it out;
- **no waste**: the batch holds ``min(n, main ready + tiers ready)`` messages at least (an
  end-of-partition event takes room as a record does), never more than ``n``;
- **nothing lost or duplicated**: per partition, records come out in offset order with no gap
  and no repeat; once everything is resumed and drained, every record came out exactly once.

Single-threaded and with zero (or 1 ms) waits: nothing here depends on the machine's speed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from confluent_kafka import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retryd.worker.split_consumer import SplitConsumer
from tests.stub_kafka import Serve, StubBroker, StubConsumer

MAIN, TIER = "orders", "retry_1s"
PARTITIONS = 2
TPS = [(t, p) for t in (MAIN, TIER) for p in range(PARTITIONS)]

_tp = st.sampled_from(TPS)
STEP = st.one_of(
    st.tuples(st.just("main"), st.integers(0, PARTITIONS - 1), st.integers(1, 40)),
    st.tuples(st.just("tier"), st.integers(0, PARTITIONS - 1), st.integers(1, 300)),
    st.tuples(st.just("consume"), st.integers(1, 6), st.sampled_from([0.0, 0.001])),
    st.tuples(st.just("pause"), _tp),
    st.tuples(st.just("resume"), _tp),
)


class Members:
    """A split consumer over two stub members, and what each consume did."""

    def __init__(self, n: int, eof: bool, interleave: int) -> None:
        self.n = n
        self.broker = StubBroker(interleave=interleave)
        for topic in (MAIN, TIER):
            self.broker.create(topic, PARTITIONS)
        conf = {"group.id": "g", "stub.manual_assign": True, "enable.partition.eof": eof}
        self.main: StubConsumer = self.broker.consumer(dict(conf))
        self.tiers: StubConsumer = self.broker.consumer(dict(conf))
        self.main.serves, self.tiers.serves = [], []
        self.split = SplitConsumer(self.main, self.tiers, [TIER])
        self.split.incremental_assign([TopicPartition(t, p) for t, p in TPS])
        self.appended = 0
        self.next_offset: dict[tuple[str, int], int] = defaultdict(int)  # next expected
        self.main_polled_last = True

    def append(self, topic: str, partition: int, count: int) -> None:
        for _ in range(count):
            self.broker.append(topic, b"k", b"v%d" % self.appended, partition=partition)
            self.appended += 1

    def consume(self, timeout: float) -> list[Any]:
        n = self.n
        # counted up to n: every bound below is at most n
        main_ready, tiers_ready = self.main.ready(n), self.tiers.ready(n)
        main_before = len(self.main.serves or [])
        out = self.split.consume(n, timeout)
        main_serves: list[Serve] = (self.main.serves or [])[main_before:]
        batch = [(m.topic(), m.partition(), "eof" if m.error() else m.offset()) for m in out]
        what = f"n={n} main ready={main_ready} tiers ready={tiers_ready}: {batch}"
        assert len(out) <= n, what
        records = [m for m in out if m.error() is None]
        # an end-of-partition event takes room as a record does (the client's too)
        assert len(out) >= min(n, main_ready + tiers_ready), f"room wasted: {what}"
        from_main = sum(1 for m in out if m.topic() == MAIN)
        if n >= 2:
            assert main_serves, f"the main member was not polled: {what}"
            quarter = max(1, n // 4)
            assert from_main >= min(main_ready, quarter), f"main starved: {what}"
        else:
            polled = bool(main_serves)
            assert polled or self.main_polled_last, f"main unpolled twice in a row: {what}"
            self.main_polled_last = polled
            if polled and main_ready:
                assert from_main == 1, f"a polled main member kept its record: {what}"
        for m in records:
            tp = (m.topic(), m.partition())
            assert m.offset() == self.next_offset[tp], f"gap or repeat on {tp}: {what}"
            self.next_offset[tp] += 1
        return out

    def drain(self) -> None:
        self.split.resume([TopicPartition(t, p) for t, p in TPS])
        total = self.main.ready() + self.tiers.ready()
        # each consume hands out a record while any is ready, or an end-of-partition event
        for _ in range(total + 2 * len(TPS)):
            if not self.main.ready(1) + self.tiers.ready(1):
                break
            self.consume(0.0)
        for t, p in TPS:
            end = len(self.broker.logs[t][p])
            assert self.next_offset[(t, p)] == end, f"{(t, p)}: {self.next_offset[(t, p)]}/{end}"


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
@given(
    n=st.sampled_from([2, 3, 4, 5, 7, 8, 13, 64, 500, 1]),
    eof=st.booleans(),
    interleave=st.integers(0, 3),
    depths=st.lists(st.integers(0, 2000), min_size=PARTITIONS, max_size=PARTITIONS),
    main=st.lists(st.integers(0, 40), min_size=PARTITIONS, max_size=PARTITIONS),
    steps=st.lists(STEP, max_size=25),
)
def test_a_deep_tier_never_starves_the_main_member_and_nothing_is_lost(
    n: int,
    eof: bool,
    interleave: int,
    depths: list[int],
    main: list[int],
    steps: list[tuple[Any, ...]],
) -> None:
    members = Members(n, eof, interleave)
    for partition, depth in enumerate(depths):
        members.append(TIER, partition, depth)
    for partition, depth in enumerate(main):
        members.append(MAIN, partition, depth)
    for step in steps:
        kind = step[0]
        if kind == "main":
            members.append(MAIN, step[1], step[2])
        elif kind == "tier":
            members.append(TIER, step[1], step[2])
        elif kind == "consume":
            for _ in range(step[1]):
                members.consume(step[2])
        else:
            tp = [TopicPartition(*step[1])]
            (members.split.pause if kind == "pause" else members.split.resume)(tp)
    members.drain()


def test_the_checks_see_a_starved_main_member(monkeypatch: Any) -> None:
    """Not vacuous: with no room reserved for the main member (the fault), a deep tier takes
    the whole batch and the share check fails."""
    from retryd.worker import split_consumer

    monkeypatch.setattr(split_consumer, "main_reserve", lambda n: 0)
    members = Members(8, False, 0)
    members.append(TIER, 0, 100)
    members.append(MAIN, 0, 5)
    try:
        members.consume(0.0)
    except AssertionError as exc:
        assert "main" in str(exc)
    else:
        raise AssertionError("a batch of tier records only passed the checks")
