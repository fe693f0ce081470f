"""Strict key order composed with revokes, dead-letter markers, lookups that fail, other groups
and orphaned entries, on the stub broker (issue 23, items 7 to 11)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from retryd.config import load_settings
from retryd.handlers.base import Message
from retryd.handlers.python_handler import PythonHandler
from retryd.policy import headers as h
from retryd.policy import key_order as ko
from retryd.worker import strict as strict_module
from retryd.worker.assembly import build_worker
from retryd.worker.engine import Worker
from retryd.worker.lifecycle import NO_HOOKS, RaceHooks
from tests.stub_kafka import LateAcksProducer, StubBroker, StubReader, members
from tests.support import wait_for
from tests.unit.test_engine_strict import GROUP, MAIN, STATE, Log, send, state_entries

PARTITIONS = 2


@pytest.fixture
def broker() -> StubBroker:
    return StubBroker()


def _worker(
    broker: StubBroker,
    tmp_path: Path,
    func: Callable[[Message], Any],
    *,
    sequence: str = "50ms,50ms,50ms",
    manual: bool = False,
    hooks: RaceHooks = NO_HOOKS,
    reader: Callable[[dict[str, Any]], Any] | None = None,
    producer: Callable[[dict[str, Any]], Any] | None = None,
    create: bool = True,
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
        key_order="strict",
        max_in_flight=8,
        **overrides,
    )
    if create:
        broker.create(MAIN, PARTITIONS)
        for tier in settings.plan.tier_topics:
            broker.create(tier, PARTITIONS)
        broker.create(settings.failed_topic, 1)
        broker.create(STATE, 3)

    def consumer(conf: dict[str, Any]) -> Any:
        return broker.consumer({**conf, "stub.manual_assign": True} if manual else conf)

    return build_worker(
        settings,
        PythonHandler(func, timeout_s=settings.handler_timeout_s),
        drain_grace_s=0.2,
        consumer_factory=consumer,
        producer_factory=producer or broker.producer,
        reader_factory=reader or (lambda conf: StubReader(broker, conf)),
        hooks=hooks,
    )


def _start(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    return t


def _origin(rec: Any) -> tuple[int, int]:
    return (
        int(h.header_value(rec.headers, h.ORIGINAL_PARTITION) or b"-1"),
        int(h.header_value(rec.headers, h.ORIGINAL_OFFSET) or b"-1"),
    )


def test_a_revoke_waits_for_every_write_of_a_strict_record(
    broker: StubBroker, tmp_path: Path
) -> None:
    """Item 7: a strict failure settles through two acknowledged writes (its chain entry,
    then its copy). A revoke that starts while the first is unacknowledged waits for both, so
    the input is committed with its copy; it never releases the record between the two (the
    copy in the tier and the input redone by the next owner: two places)."""

    def fail(m: Message) -> None:
        raise RuntimeError("down")

    worker = _worker(
        broker,
        tmp_path,
        fail,
        manual=True,
        producer=lambda conf: LateAcksProducer(broker, conf, delay=lambda: 0.2),
    )
    send(broker, [b"a", b"a", b"a"], PARTITIONS)
    part = ko.murmur2(b"a") % PARTITIONS
    stub = members(worker)
    thread = _start(worker)
    tps = [(t, p) for t in (MAIN, "retry_50ms") for p in range(PARTITIONS)]
    try:
        stub.trigger_assign(tps)
        wait_for(lambda: broker.records(STATE), 10, what="the chain entry written, unacked")
        stub.trigger_revoke(tps)  # the entry's acknowledgement arrives during the revoke
        wait_for(lambda: not stub.assigned, 40, what="the revoke to end")
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    committed = broker.committed_offset(GROUP, MAIN, part) or 0
    copies = [_origin(r) for r in broker.records("retry_50ms")]
    assert copies, "the failure was never routed"
    for origin_part, origin_offset in copies:
        assert origin_part == part
        assert origin_offset < committed, (
            f"the copy of {MAIN}[{part}]@{origin_offset} is in the tier but its input is not "
            f"committed ({committed}): the next owner would handle it again"
        )


def test_two_followers_of_a_dead_head_leave_no_dead_marker(
    broker: StubBroker, tmp_path: Path
) -> None:
    """Item 8: with ``key_order_on_dead_letter=dead_letter`` the head is dead-lettered with
    two parked followers that come due together; they are decided one after the other, so the
    last one removes the head's marker, and a later record of the key that fails once is
    retried and succeeds (never dead-lettered as blocked_by_dead_letter)."""
    log = Log({0: 100, 3: 1})

    def handler(m: Message) -> None:
        if m.value == b"v0" and m.retry_number >= 1:
            time.sleep(0.1)  # the head's last attempt is slow: its followers come due meanwhile
        log(m)

    worker = _worker(
        broker, tmp_path, handler, sequence="50ms", key_order_on_dead_letter="dead_letter"
    )
    send(broker, [b"a", b"a", b"a"], PARTITIONS)
    thread = _start(worker)
    try:
        wait_for(
            lambda: len(broker.records("failed_topic")) == 3,
            20,
            what="the head and its two followers dead-lettered",
        )
        wait_for(lambda: not state_entries(broker), 10, what="the dead marker removed")
        part = ko.murmur2(b"a") % PARTITIONS
        broker.append(MAIN, b"a", b"v3", partition=part)
        wait_for(lambda: (b"a", 3) in log.successes, 20, what="record 3 to succeed")
    finally:
        worker.stop()
        thread.join(30)
    reasons = [h.header_value(r.headers, h.DEAD_REASON) for r in broker.records("failed_topic")]
    assert sorted(reasons) == sorted([b"exhausted", *[ko.DEAD_BLOCKED.encode()] * 2])
    assert b"v3" not in {r.value for r in broker.records("failed_topic")}
    assert state_entries(broker) == {}


def test_a_stale_dead_marker_is_removed_by_the_next_record_that_enters_the_chain(
    broker: StubBroker, tmp_path: Path
) -> None:
    """Item 8, the other way a marker can stay behind (left by an earlier run): the record
    that runs past it and fails removes it with its own entry, so its copy is retried."""
    chain = ko.chain_id(GROUP, MAIN, b"a")
    part_state = ko.state_partition(chain, 3)
    broker.create(STATE, 3)
    now = int(time.time() * 1000)
    broker.append(
        STATE, ko.entry_key(chain, 0), ko.encode_entry(now, ko.KIND_DEAD), partition=part_state
    )
    log = Log({1: 1})
    worker = _worker(broker, tmp_path, log, key_order_on_dead_letter="dead_letter")
    part = ko.murmur2(b"a") % PARTITIONS
    broker.append(MAIN, b"x", b"v0", partition=part)
    broker.append(MAIN, b"a", b"v1", partition=part)
    worker.run(until_drained=True)
    assert (b"a", 1) in log.successes
    assert broker.records("failed_topic") == []
    assert state_entries(broker) == {}


class _FlakyWatermarks(StubReader):
    """A key-state reader whose first watermark lookups fail (a broker that is moving)."""

    failures = 0

    def get_watermark_offsets(self, tp: Any, **kwargs: Any) -> tuple[int, int]:
        if _FlakyWatermarks.failures < 3:
            _FlakyWatermarks.failures += 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "watermarks timed out"))
        return super().get_watermark_offsets(tp, **kwargs)


def test_a_failed_watermark_lookup_is_asked_again(broker: StubBroker, tmp_path: Path) -> None:
    """Item 9: the state topic's end cannot be read at assignment; it is read again a moment
    later, and the keys run (they never freeze for the rest of the assignment)."""
    _FlakyWatermarks.failures = 0
    log = Log()
    worker = _worker(broker, tmp_path, log, reader=lambda conf: _FlakyWatermarks(broker, conf))
    send(broker, [b"a", b"b", b"a", b"c"], PARTITIONS)
    thread = threading.Thread(target=worker.run, kwargs={"until_drained": True}, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the keys froze after a failed watermark lookup"
    assert sorted(i for _, i in log.successes) == [0, 1, 2, 3]
    assert _FlakyWatermarks.failures == 3


def test_another_groups_entries_never_block_or_count_here(
    broker: StubBroker, tmp_path: Path
) -> None:
    """Item 10: five entries of another group sharing the state topic, more than this
    worker's limit: they are not in its view, its gauges or its limit, and its records run."""
    broker.create(STATE, 3)
    now = int(time.time() * 1000)
    for i in range(5):
        chain = ko.chain_id("other-group", MAIN, b"a")
        broker.append(
            STATE,
            ko.entry_key(chain, i),
            ko.encode_entry(now, ko.KIND_FAILED),
            partition=ko.state_partition(chain, 3),
        )
    log = Log()
    worker = _worker(broker, tmp_path, log, key_order_max_entries=3)
    send(broker, [b"a", b"a", b"b"], PARTITIONS)
    worker.run(until_drained=True)
    assert sorted(i for _, i in log.successes) == [0, 1, 2]
    assert worker.strict is not None
    assert worker.strict.gauges(now)[:2] == (0, 0)
    assert worker.strict.view.foreign == 5


def test_a_full_view_stops_parking_not_running(broker: StubBroker, tmp_path: Path) -> None:
    """Item 10: at ``key_order_max_entries`` no new record is parked, but keys without an
    entry keep running."""
    broker.create(STATE, 3)
    now = int(time.time() * 1000)
    for key in (b"x", b"y"):
        chain = ko.chain_id(GROUP, MAIN, key)
        broker.append(
            STATE,
            ko.entry_key(chain, 10_000),
            ko.encode_entry(now, ko.KIND_FAILED),
            partition=ko.state_partition(chain, 3),
        )
    log = Log()
    worker = _worker(broker, tmp_path, log, key_order_max_entries=2)
    send(broker, [b"a", b"b", b"a", b"c"], PARTITIONS)
    worker.run(until_drained=True)
    assert sorted(i for _, i in log.successes) == [0, 1, 2, 3]


def test_orphaned_entries_past_the_cap_are_removed(
    broker: StubBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 11: an entry past ``key_order_max_blocked_s`` whose record this worker's partition
    has settled (an orphan: its record ended without removing it) is tombstoned by the sweep,
    leaves every gauge, and is counted."""
    monkeypatch.setattr(strict_module, "SWEEP_S", 0.2)
    broker.create(STATE, 3)
    part = ko.murmur2(b"ghost") % PARTITIONS
    chain = ko.chain_id(GROUP, MAIN, b"ghost")
    old = int(time.time() * 1000) - 3_600_000
    broker.append(
        STATE,
        ko.entry_key(chain, 0),
        ko.encode_entry(old, ko.KIND_FAILED, part),
        partition=ko.state_partition(chain, 3),
    )
    log = Log()
    worker = _worker(broker, tmp_path, log, key_order_max_blocked_s=60)
    for i in range(3):  # offsets 0..2 of the ghost's partition: settled, stored past 0
        broker.append(MAIN, b"x%d" % i, b"v%d" % i, partition=part)
    thread = _start(worker)
    try:
        wait_for(lambda: not state_entries(broker), 10, what="the orphan tombstoned")
        assert worker.strict is not None
        wait_for(lambda: worker.strict.gauges(0)[1] == 0, 5, what="the gauge to drop it")
        wait_for(
            lambda: worker.summary.key_order_events.get("orphan_removed") == 1,
            5,
            what="the removal counted",
        )
    finally:
        worker.stop()
        thread.join(30)


def test_a_copy_whose_entry_was_removed_as_an_orphan_runs() -> None:
    """Item 11: a copy coming back after its entry was removed as an orphan (older than the
    cap) runs; a copy of a recent entry that was removed is a duplicate."""
    now = 10_000_000
    cap = 60_000
    assert (
        ko.decide(
            None, 5, now, is_copy=True, removed=True, max_blocked_ms=cap, entered_ms=now - 2 * cap
        )
        is ko.Verdict.RUN_RELEASED
    )
    assert (
        ko.decide(
            None, 5, now, is_copy=True, removed=True, max_blocked_ms=cap, entered_ms=now - 1000
        )
        is ko.Verdict.DUPLICATE
    )
