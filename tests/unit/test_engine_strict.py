"""key_order = strict on the in-memory stub broker: a key's later records wait behind a failing
one across tiers (parked in the chain) and succeed in offset order; restarts keep the order
from the key-state topic; a dead letter releases the key (or, by option, dead-letters the
records behind it); the cap releases followers of a head blocked too long."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from retryd.config import load_settings
from retryd.errors import NonRetryableError
from retryd.handlers.base import Message
from retryd.handlers.python_handler import PythonHandler
from retryd.policy import headers as h
from retryd.policy import key_order as ko
from retryd.worker.assembly import build_worker
from retryd.worker.engine import Worker
from tests.stub_kafka import StubBroker, StubReader

MAIN = "orders"
GROUP = "g"
STATE = "retryd_key_state"


@pytest.fixture
def broker() -> StubBroker:
    return StubBroker()


def strict_worker(
    broker: StubBroker,
    tmp_path: Path,
    func: Callable[[Message], Any],
    *,
    partitions: int = 2,
    sequence: str = "50ms,50ms,50ms",
    create_topics: bool = True,
    **overrides: Any,
) -> Worker:
    settings = load_settings(
        bootstrap_servers="stub:9092",
        main_topics=MAIN,
        retry_sequence=sequence,
        group_id=GROUP,
        state_dir=tmp_path / "state",
        handler=f"python:{__name__}:unused",
        handler_timeout_s=2.0,
        max_poll_interval_ms=30_000,
        session_timeout_ms=6_000,
        poll_timeout_s=0.02,
        circuit_breaker=False,
        key_order=overrides.pop("key_order", "strict"),
        max_in_flight=overrides.pop("max_in_flight", 8),
        **overrides,
    )
    if create_topics:
        broker.create(MAIN, partitions)
        for tier in settings.plan.tier_topics:
            broker.create(tier, partitions)
        broker.create(settings.failed_topic, 1)
        broker.create(STATE, 3)
    return build_worker(
        settings,
        PythonHandler(func, timeout_s=settings.handler_timeout_s),
        drain_grace_s=0.2,
        consumer_factory=broker.consumer,
        producer_factory=broker.producer,
        reader_factory=lambda conf: StubReader(broker, conf),
    )


class Log:
    """Every successful call: (key, index of the record), in call order; failures planned
    per record index."""

    def __init__(self, failures: dict[int, int] | None = None) -> None:
        self.lock = threading.Lock()
        self.successes: list[tuple[bytes, int]] = []
        self.calls: Counter[int] = Counter()
        self.failures = failures or {}

    def __call__(self, m: Message) -> None:
        index = int((m.value or b"v-1")[1:])
        with self.lock:
            self.calls[index] += 1
            if self.calls[index] <= self.failures.get(index, 0):
                raise RuntimeError(f"transient failure of {index}")
            assert m.key is not None
            self.successes.append((m.key, index))

    def per_key(self) -> dict[bytes, list[int]]:
        out: dict[bytes, list[int]] = defaultdict(list)
        for key, index in self.successes:
            out[key].append(index)
        return out


def send(broker: StubBroker, keys: list[bytes], partitions: int = 2) -> None:
    for i, key in enumerate(keys):
        broker.append(MAIN, key, b"v%d" % i, partition=ko.murmur2(key) % partitions)


def state_entries(broker: StubBroker) -> dict[bytes, bytes | None]:
    """The key-state topic as compaction would leave it: entry key -> last value."""
    out: dict[bytes, bytes | None] = {}
    for rec in broker.records(STATE):
        assert rec.key is not None
        out[rec.key] = rec.value
    return {k: v for k, v in out.items() if v is not None}


@pytest.mark.parametrize("kind", ["def", "async def"])  # thread slots; event-loop slots (HTTP too)
def test_later_records_of_a_key_wait_behind_a_failing_one_across_tiers(
    broker: StubBroker, tmp_path: Path, kind: str
) -> None:
    keys = [b"a", b"b", b"a", b"a", b"b", b"c", b"a", b"b"]
    # record 0 (key a) fails three times: it crosses every tier before it succeeds; record 1
    # (key b) fails once; the others never fail but must wait behind their key's chain
    log = Log({0: 3, 1: 1})

    async def async_log(m: Message) -> None:
        log(m)

    worker = strict_worker(broker, tmp_path, log if kind == "def" else async_log)
    send(broker, keys)
    summary = worker.run(until_drained=True)
    per_key = log.per_key()
    assert per_key[b"a"] == [0, 2, 3, 6]
    assert per_key[b"b"] == [1, 4, 7]
    assert per_key[b"c"] == [5]
    assert sorted(i for _, i in log.successes) == list(range(len(keys)))  # once each
    assert not summary.dead_reasons
    # the records behind a failing one waited (set aside in memory while its retry ran, or
    # parked in the chain when that took longer)
    events = summary.key_order_events
    assert events["waited"] + events["parked"] >= 5
    assert state_entries(broker) == {}  # every chain ended: every entry removed
    assert not broker.records("failed_topic")


def test_key_order_none_leaves_no_state_and_does_not_wait(
    broker: StubBroker, tmp_path: Path
) -> None:
    log = Log({0: 1})
    worker = strict_worker(broker, tmp_path, log, key_order="none")
    broker.create(STATE, 1)
    send(broker, [b"a", b"a", b"a"])
    worker.run(until_drained=True)
    assert log.per_key()[b"a"] == [1, 2, 0]  # record 0 came back from its tier last
    assert broker.records(STATE) == []


def test_a_dead_letter_releases_the_key(broker: StubBroker, tmp_path: Path) -> None:
    def func(m: Message) -> None:
        if m.value == b"v0":
            raise NonRetryableError("never")
        log(m)

    log = Log({1: 1})  # record 0 dead at once on a tier? no: on its first call
    worker = strict_worker(broker, tmp_path, func)
    send(broker, [b"a", b"a", b"a"])
    worker.run(until_drained=True)
    assert log.per_key()[b"a"] == [1, 2]
    dead = broker.records("failed_topic")
    assert [d.value for d in dead] == [b"v0"]
    assert state_entries(broker) == {}


def test_exhausted_head_releases_or_dead_letters_its_followers(
    broker: StubBroker, tmp_path: Path
) -> None:
    log = Log({0: 10, 1: 1})  # record 0 never succeeds: exhausted after 3 retries
    worker = strict_worker(
        broker, tmp_path, log, sequence="50ms,50ms", key_order_on_dead_letter="dead_letter"
    )
    send(broker, [b"a", b"a", b"a", b"b"])
    worker.run(until_drained=True)
    reasons = {
        d.value: h.header_value(d.headers, h.DEAD_REASON) for d in broker.records("failed_topic")
    }
    assert reasons[b"v0"] == b"exhausted"
    # record 1 failed once and record 2 was parked: both in the chain when 0 died
    assert reasons[b"v1"] == ko.DEAD_BLOCKED.encode()
    assert reasons[b"v2"] == ko.DEAD_BLOCKED.encode()
    assert log.per_key() == {b"b": [3]}
    # a later record of the key runs (dead markers alone never block) and ends the chain
    log.successes.clear()
    second = strict_worker(broker, tmp_path, log, sequence="50ms,50ms", create_topics=False)
    broker.append(MAIN, b"a", b"v9", partition=ko.murmur2(b"a") % 2)
    second.run(until_drained=True)
    assert log.per_key() == {b"a": [9]}
    assert state_entries(broker) == {}


def test_restart_keeps_the_order_from_the_state_topic(broker: StubBroker, tmp_path: Path) -> None:
    """A first worker routes the failing head and parks the followers, then stops; a second
    one (new process: nothing in memory) handles the chain in order from the state topic."""
    gate = threading.Event()
    log = Log({0: 1})  # its first call fails; on the tier it fails until the gate opens

    def func(m: Message) -> None:
        if m.retry_number >= 1 and m.value == b"v0" and not gate.is_set():
            raise RuntimeError("still down")
        log(m)

    first = strict_worker(broker, tmp_path, func, sequence="300ms,300ms,300ms")
    send(broker, [b"a", b"a", b"a"])
    t = threading.Thread(target=first.run, daemon=True)
    t.start()
    # wait until the head is in the chain and its followers wait behind it (set aside, or
    # parked once that took longer than its retry)
    from tests.support import wait_for

    wait_for(
        lambda: (
            state_entries(broker)
            and first.summary.key_order_events["waited"] + len(state_entries(broker)) >= 3
        ),
        10,
        what="the head in the chain and its followers waiting",
    )
    first.stop()
    t.join(10)
    assert state_entries(broker)
    assert log.successes == []
    gate.set()
    second = strict_worker(
        broker, tmp_path, func, sequence="300ms,300ms,300ms", create_topics=False
    )
    second.run(until_drained=True)
    assert log.per_key()[b"a"] == [0, 1, 2]
    assert state_entries(broker) == {}


def test_a_new_record_of_a_blocked_key_is_parked_behind_the_chain(
    broker: StubBroker, tmp_path: Path
) -> None:
    """An entry left by another worker (read from the state topic at assignment) holds a new
    record back until it is removed."""
    broker.create(STATE, 3)
    chain = ko.chain_id(GROUP, MAIN, b"k")
    p = ko.state_partition(chain, 3)
    import time

    now = int(time.time() * 1000)
    entry = ko.entry_key(chain, 0)
    broker.append(STATE, entry, ko.encode_entry(now, ko.KIND_FAILED), partition=p)
    log = Log()
    worker = strict_worker(broker, tmp_path, log, sequence="50ms,50ms,50ms,50ms,50ms")
    # offset 0 of key k is "in the chain" elsewhere: send a record of k that lands at offset 1
    part = ko.murmur2(b"k") % 2
    broker.append(MAIN, b"x", b"v99", partition=part)  # offset 0 of that partition
    broker.append(MAIN, b"k", b"v1", partition=part)

    def release() -> None:
        time.sleep(0.5)
        broker.append(STATE, entry, None, partition=p)  # the chain of offset 0 ends

    threading.Thread(target=release, daemon=True).start()
    started = time.monotonic()
    worker.run(until_drained=True)
    assert log.per_key()[b"k"] == [1]
    assert time.monotonic() - started >= 0.5
    assert state_entries(broker) == {}


def test_the_cap_releases_followers_of_a_head_blocked_too_long(
    broker: StubBroker, tmp_path: Path
) -> None:
    broker.create(STATE, 3)
    chain = ko.chain_id(GROUP, MAIN, b"k")
    p = ko.state_partition(chain, 3)
    old = ko.encode_entry(1000, ko.KIND_FAILED)  # added long ago, never removed (orphan)
    broker.append(STATE, ko.entry_key(chain, 0), old, partition=p)
    log = Log()
    worker = strict_worker(broker, tmp_path, log, key_order_max_blocked_s=60)
    part = ko.murmur2(b"k") % 2
    broker.append(MAIN, b"x", b"v99", partition=part)
    broker.append(MAIN, b"k", b"v1", partition=part)
    summary = worker.run(until_drained=True)
    assert log.per_key()[b"k"] == [1]
    assert summary is not None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_failures_and_restarts_keep_every_key_in_order(
    broker: StubBroker, tmp_path: Path, seed: int
) -> None:
    """20 keys x 15 records, 30 % of calls fail (transient), the worker is stopped and a new
    one started every few hundred milliseconds: per key the first success of each record comes
    in offset order, and every record succeeds."""
    import random
    import time

    rng = random.Random(seed)
    lock = threading.Lock()
    firsts: list[tuple[bytes, int]] = []
    seen: set[int] = set()

    def func(m: Message) -> None:
        if rng.random() < 0.3:
            raise RuntimeError("transient")
        index = int((m.value or b"v-1")[1:])
        with lock:
            if index not in seen:
                seen.add(index)
                assert m.key is not None
                firsts.append((m.key, index))

    keys = [b"k%d" % rng.randrange(20) for _ in range(300)]
    sequence = ",".join(["30ms"] * 12)  # 30 % failures: 12 retries never run out
    make = lambda first: strict_worker(  # noqa: E731
        broker, tmp_path, func, sequence=sequence, create_topics=first
    )
    worker = make(True)
    send(broker, keys)
    for round_ in range(4):
        if round_:
            worker = make(False)
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        time.sleep(rng.uniform(0.2, 0.5))
        worker.stop()
        t.join(20)
        assert not t.is_alive()
    make(False).run(until_drained=True)
    assert len(seen) == len(keys), sorted(set(range(len(keys))) - seen)
    per_key: dict[bytes, list[int]] = defaultdict(list)
    for key, index in firsts:
        per_key[key].append(index)
    for key, indexes in per_key.items():
        assert indexes == sorted(indexes), (key, indexes)
    assert not broker.records("failed_topic")
    assert state_entries(broker) == {}


def test_a_replayed_dead_letter_reenters_behind_the_live_chain_of_its_key(
    broker: StubBroker, tmp_path: Path
) -> None:
    """Record 0 of key a is dead-lettered (exhausted); record 1 of key a then fails into the
    chain; the dead letter, replayed onto the main topic the way the sidecar and the CLI do it
    (``replay_copy_kwargs``), waits behind record 1's chain: key a succeeds 1, then 0."""
    from retryd.replay.copies import replay_copy_kwargs
    from retryd.replay.records import FailedRecord
    from tests.support import wait_for

    log = Log({0: 5, 1: 3})  # 0: the first call and 4 retries fail (exhausted)
    worker = strict_worker(broker, tmp_path, log, sequence="300ms,300ms,300ms,300ms")
    send(broker, [b"a", b"a"])
    thread = threading.Thread(target=worker.run, kwargs={"until_drained": True}, daemon=True)
    thread.start()
    [dead] = wait_for(lambda: broker.records("failed_topic"), 30, what="record 0 dead-lettered")
    rec = FailedRecord(
        dead.topic, dead.partition, dead.offset, dead.timestamp, dead.key, dead.value, dead.headers
    )
    wait_for(lambda: log.calls[1] >= 1, 10, what="record 1's first (failing) call")
    kwargs = replay_copy_kwargs(rec, MAIN, 2, "r-1")
    broker.append(MAIN, kwargs["key"], kwargs["value"], kwargs["headers"], kwargs.get("partition"))
    thread.join(60)
    assert not thread.is_alive()
    assert log.per_key()[b"a"] == [1, 0]  # the replay ran after the chain it met
    assert state_entries(broker) == {}
