"""Role ``all`` with the tiers on their own member (retryd.worker.split_consumer): every call
reaches the member that owns the topic, and a worker built with the default settings runs its
tiers on a member of their own (own prefetch), while exactly-once and ``tier_consumer=shared``
keep one consumer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from retryd.config import load_settings
from retryd.handlers.python_handler import PythonHandler
from retryd.worker.assembly import build_worker
from retryd.worker.split_consumer import SplitConsumer
from tests.stub_kafka import StubBroker

MAIN, TIER = "orders", "retry_1s"


def _split(broker: StubBroker) -> SplitConsumer:
    for topic in (MAIN, TIER):
        broker.create(topic, 2)
    main = broker.consumer({"group.id": "g", "stub.manual_assign": True})
    tiers = broker.consumer({"group.id": "g", "stub.manual_assign": True})
    return SplitConsumer(main, tiers, [TIER])


def _tps(*pairs: tuple[str, int], offset: int = -1001) -> list[TopicPartition]:
    return [TopicPartition(t, p, offset) for t, p in pairs]


def test_subscribe_gives_each_member_its_own_topics() -> None:
    split = _split(StubBroker())
    calls: list[Any] = []
    split.subscribe([MAIN, TIER], on_assign=lambda c, p: calls.append(p))
    assert split.main.topics == [MAIN]  # type: ignore[attr-defined]
    assert split.tiers.topics == [TIER]  # type: ignore[attr-defined]


def test_partition_calls_reach_the_member_that_owns_the_topic() -> None:
    split = _split(StubBroker())
    main, tiers = split.main, split.tiers
    split.incremental_assign(_tps((MAIN, 0), (TIER, 1)))
    assert main.assigned == [(MAIN, 0)] and tiers.assigned == [(TIER, 1)]  # type: ignore[attr-defined]
    split.pause(_tps((TIER, 1)))
    assert tiers.paused == {(TIER, 1)} and not main.paused  # type: ignore[attr-defined]
    split.resume(_tps((TIER, 1), (MAIN, 0)))
    assert not tiers.paused  # type: ignore[attr-defined]
    split.store_offsets(offsets=_tps((MAIN, 0), (TIER, 1), offset=5))
    assert main.stored == {(MAIN, 0): 5} and tiers.stored == {(TIER, 1): 5}  # type: ignore[attr-defined]
    split.commit(asynchronous=False)
    assert split.committed(_tps((MAIN, 0), (TIER, 1))) == _tps((MAIN, 0), (TIER, 1), offset=5)
    split.commit(offsets=_tps((TIER, 1), offset=7), asynchronous=False)
    assert [tp.offset for tp in split.committed(_tps((TIER, 1)))] == [7]
    split.incremental_unassign(_tps((MAIN, 0), (TIER, 1)))
    assert main.assigned == [] and tiers.assigned == []  # type: ignore[attr-defined]


def test_consume_serves_both_members_up_to_the_count() -> None:
    broker = StubBroker()
    split = _split(broker)
    split.incremental_assign(_tps((MAIN, 0), (TIER, 0)))
    for i in range(3):
        broker.append(MAIN, b"k", b"m%d" % i, partition=0)
        broker.append(TIER, b"k", b"t%d" % i, partition=0)
    got = split.consume(4, 0)
    assert [m.value() for m in got] == [b"t0", b"t1", b"t2", b"m0"]  # tiers first: cheap
    assert [m.value() for m in split.consume(10, 0)] == [b"m1", b"m2"]
    assert split.consume(10, 0.01) == []


def test_a_deep_tier_never_starves_the_main_member() -> None:
    """Issue 31 fault 9: while the tiers member returned full batches the main member was not
    polled at all (3 main polls against 123 tier polls in a 60,000-copy drain). The bound:
    every ``consume`` polls the main member, and a quarter of each batch is the main
    member's, so main records come out at that rate however deep the tiers are."""
    broker = StubBroker()
    split = _split(broker)
    split.incremental_assign(_tps((MAIN, 0), (TIER, 0)))
    for i in range(1000):
        broker.append(TIER, b"k", b"t%d" % i, partition=0)
    for i in range(6):
        broker.append(MAIN, b"k", b"m%d" % i, partition=0)
    polls = {"main": 0, "tiers": 0}
    for name in polls:
        member = getattr(split, name)
        member.consume = _counting(member.consume, polls, name)
    per_call: list[tuple[int, int]] = []
    for _ in range(3):
        got = [m.value() for m in split.consume(8, 0)]
        per_call.append((sum(v.startswith(b"m") for v in got), len(got)))
    assert polls["main"] == 3
    assert per_call == [(2, 8), (2, 8), (2, 8)]  # the main member's quarter, every call
    # main drained: the tiers get what the main member left of the batch
    assert [m.value() for m in split.consume(8, 0)] == [b"t%d" % i for i in range(18, 26)]


def test_batches_of_one_alternate_between_the_members() -> None:
    broker = StubBroker()
    split = _split(broker)
    split.incremental_assign(_tps((MAIN, 0), (TIER, 0)))
    for i in range(3):
        broker.append(MAIN, b"k", b"m%d" % i, partition=0)
        broker.append(TIER, b"k", b"t%d" % i, partition=0)
    got = [m.value() for _ in range(4) for m in split.consume(1, 0)]
    assert sorted(got) == [b"m0", b"m1", b"t0", b"t1"]


def _counting(consume: Any, polls: dict[str, int], name: str) -> Any:
    def wrapped(n: int, timeout: float) -> Any:
        polls[name] += 1
        return consume(n, timeout)

    return wrapped


class _Member:
    """A member whose commit says "nothing stored" (librdkafka's _NO_OFFSET) or succeeds."""

    def __init__(self, stored: bool) -> None:
        self.stored, self.commits = stored, 0

    def commit(self, **kwargs: Any) -> None:
        if not self.stored:
            raise KafkaException(KafkaError(KafkaError._NO_OFFSET))
        self.commits += 1


def test_commit_says_nothing_stored_only_when_neither_member_has_offsets() -> None:
    main, tiers = _Member(False), _Member(True)
    SplitConsumer(main, tiers, [TIER]).commit(asynchronous=False)  # type: ignore[arg-type]
    assert tiers.commits == 1  # the main member's empty store did not skip the tiers'
    with pytest.raises(KafkaException):
        SplitConsumer(_Member(False), _Member(False), [TIER]).commit()  # type: ignore[arg-type]


def _worker(broker: StubBroker, tmp_path: Path, **overrides: Any) -> Any:
    settings = load_settings(
        bootstrap_servers="stub:9092",
        main_topics=MAIN,
        retry_sequence="1s",
        group_id="g",
        state_dir=tmp_path / "state",
        handler="python:tests.unit.test_split_consumer:unused",
        **overrides,
    )
    for topic in (MAIN, *settings.plan.tier_topics, settings.failed_topic):
        broker.create(topic, 1)
    return build_worker(
        settings,
        PythonHandler(lambda m: None, timeout_s=1.0),
        consumer_factory=broker.consumer,
        producer_factory=broker.producer,
    )


def test_role_all_reads_its_tiers_on_a_member_with_its_own_small_prefetch(
    tmp_path: Path,
) -> None:
    broker = StubBroker()
    worker = _worker(broker, tmp_path, tier_prefetch_kbytes=2048)
    assert isinstance(worker.parts.consumer, SplitConsumer)
    main, tiers = broker.consumers
    assert main.conf["client.id"] == "retryd-worker-all"
    assert "queued.max.messages.kbytes" not in main.conf  # librdkafka's default for main topics
    assert tiers.conf["client.id"] == "retryd-worker-all-tiers"
    assert tiers.conf["queued.max.messages.kbytes"] == 2048
    assert main.conf["group.id"] == tiers.conf["group.id"] == "g"


@pytest.mark.parametrize(
    "overrides",
    [{"tier_consumer": "shared"}, {"exactly_once": True}, {"role": "main"}, {"role": "tiers"}],
)
def test_one_consumer_when_asked_for_with_exactly_once_and_for_other_roles(
    tmp_path: Path, overrides: dict[str, Any]
) -> None:
    broker = StubBroker()
    worker = _worker(broker, tmp_path, **overrides)
    assert not isinstance(worker.parts.consumer, SplitConsumer)
    assert len(broker.consumers) == 1
