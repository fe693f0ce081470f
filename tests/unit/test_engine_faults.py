"""The six engine faults of issue 15 and the bad-input gaps behind them, each reproduced on the
stub broker with the worker built as production builds it (``build_worker``). Every test here
failed on the engine before the life-cycle recomposition; the races are widened by injected
``RaceHooks``, never by sleeps in product code."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from retryd.handlers.base import Message
from retryd.policy import headers as h
from retryd.worker import loop_pool
from retryd.worker.engine import Worker
from retryd.worker.lifecycle import RaceHooks
from retryd.worker.scheduler import Scheduler
from tests.stub_kafka import StubBroker, members
from tests.support import wait_for
from tests.unit.test_engine_loop import GROUP, MAIN, broker, make_worker, running, send

__all__ = ["broker", "running"]  # fixtures shared with the loop tests

# ------------------------------------------------------------------ helpers


class Log:
    """Handler calls of several members: (member, key, offset, retry, start, end)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, bytes | None, int, int, float, float]] = []

    def add(self, member: str, m: Message, start: float, end: float) -> None:
        with self.lock:
            self.calls.append((member, m.key, m.offset, m.retry_number, start, end))

    def of(self, member: str) -> list[tuple[str, bytes | None, int, int, float, float]]:
        with self.lock:
            return [c for c in self.calls if c[0] == member]


def run_in_thread(worker: Worker, **kwargs: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run(**kwargs)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, errors


def tier_headers(due_ms: int, *, group: str = GROUP, **extra: bytes) -> list[tuple[str, bytes]]:
    out = [
        (h.RETRY_NUMBER, b"1"),
        (h.RETRY_TIMESTAMP, b"%d" % due_ms),
        (h.ORIGINAL_TOPIC, MAIN.encode()),
        (h.ORIGINAL_PARTITION, b"0"),
        (h.ORIGINAL_OFFSET, b"0"),
        (h.ORIGINAL_TIMESTAMP, b"0"),
        (h.GROUP, group.encode()),
    ]
    out += list(extra.items())
    return out


def manual(broker: StubBroker) -> Any:
    """A consumer factory whose consumers join with no partitions (the test assigns them)."""

    def make(conf: dict[str, Any]) -> Any:
        return broker.consumer({**conf, "stub.manual_assign": True})

    return make


# ------------------------------------------------------------------ fault 1
def _revoke_scenario(broker: StubBroker, tmp_path: Path, log: Log) -> float:
    """Key K: 10 records of 0.25 s, then a record of another key that starts at once, so the
    revoke must run K's whole chain below it; the handler timeout (0.5 s) cuts that short.
    Returns the time the old member's revoke completed."""

    def handler_of(member: str) -> Any:
        def handler(m: Message) -> None:
            start = time.perf_counter()
            if m.key == b"K":
                time.sleep(0.25)
            log.add(member, m, start, time.perf_counter())

        return handler

    a = make_worker(
        broker,
        tmp_path / "a",
        handler_of("a"),
        handler_timeout_s=0.5,
        max_in_flight=4,
        consumer_factory=manual(broker),
    )
    for i in range(10):
        broker.append(MAIN, b"K", b"k%d" % i, partition=0)
    broker.append(MAIN, b"X", b"x", partition=0)
    thread, errors = run_in_thread(a)
    consumer_a = members(a)
    consumer_a.trigger_assign([(MAIN, 0)])
    wait_for(lambda: any(c[1] == b"X" for c in log.calls), 5, what="the other key to run")
    consumer_a.trigger_revoke([(MAIN, 0)])
    wait_for(lambda: (MAIN, 0) not in consumer_a.assigned, 10, what="the revoke to finish")
    revoked_at = time.perf_counter()
    b = make_worker(
        broker,
        tmp_path / "b",
        handler_of("b"),
        handler_timeout_s=0.5,
        max_in_flight=4,
        create_topics=False,
    )
    b.run(until_drained=True)
    a.stop()
    thread.join(10)
    assert not errors, errors
    return revoked_at


def test_a_revoke_that_runs_out_of_time_stops_handling_the_partition(
    broker: StubBroker, tmp_path: Path
) -> None:
    log = Log()
    revoked_at = _revoke_scenario(broker, tmp_path, log)
    a_after = [c for c in log.calls if c[0] == "a" and c[4] >= revoked_at]
    assert a_after == [], f"the old member kept handling after its revoke: {a_after}"
    # every record handled, none left behind, and no copy anywhere: nothing failed
    assert {c[2] for c in log.calls} == set(range(11))
    assert broker.records("retry_1s") == []
    # per key, the two owners' calls never overlap in time
    k_calls = sorted((c[4], c[5]) for c in log.calls if c[1] == b"K")
    for (_, e1), (s2, _) in itertools.pairwise(k_calls):
        assert s2 >= e1 - 1e-6, "two calls of key K overlapped"


@pytest.mark.parametrize("iteration", range(5))
def test_revoke_timeout_stress(broker: StubBroker, tmp_path: Path, iteration: int) -> None:
    log = Log()
    revoked_at = _revoke_scenario(broker, tmp_path, log)
    assert not [c for c in log.calls if c[0] == "a" and c[4] >= revoked_at]
    k_calls = sorted((c[4], c[5]) for c in log.calls if c[1] == b"K")
    assert all(s2 >= e1 - 1e-6 for (_, e1), (s2, _) in itertools.pairwise(k_calls))


# ------------------------------------------------------------------ fault 2
class SlowClaim(RaceHooks):
    """Widens the window between a slot taking a record and claiming it."""

    def before_claim(self) -> None:
        time.sleep(0.001)


def _abandon_scenario(broker: StubBroker, tmp_path: Path, monkeypatch: Any) -> Worker:
    monkeypatch.setattr(loop_pool, "ASYNC_CANCEL_GRACE_S", 0.1)
    handoff = Scheduler.handoff

    def slow_handoff(self: Scheduler, w: Any) -> Any:
        nxt = handoff(self, w)
        time.sleep(0.001)  # the widening: a slot caught between two records
        return nxt

    monkeypatch.setattr(Scheduler, "handoff", slow_handoff)

    async def handler(m: Message) -> None:
        if m.offset == 3 and m.retry_number == 0:
            end = time.monotonic() + 5
            while time.monotonic() < end:  # ignores its cancellation
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    continue
            return
        await asyncio.sleep(0.002)

    worker = make_worker(
        broker, tmp_path, handler, handler_timeout_s=0.2, max_in_flight=8, hooks=SlowClaim()
    )
    send(broker, 400, keys=8)
    return worker


@pytest.mark.parametrize("iteration", range(5))
def test_a_slot_between_two_records_never_strands_one_on_an_abandoned_loop(
    broker: StubBroker, tmp_path: Path, monkeypatch: Any, iteration: int
) -> None:
    worker = _abandon_scenario(broker, tmp_path, monkeypatch)
    thread, errors = run_in_thread(worker, until_drained=True)
    thread.join(30)
    assert not thread.is_alive(), "a record stayed RUNNING: the worker never drained"
    assert not errors, errors
    assert broker.committed_offset(GROUP, MAIN) == 400


# ------------------------------------------------------------------ fault 3
def test_one_async_call_ignoring_cancellation_does_not_stop_the_worker(
    broker: StubBroker, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(loop_pool, "ASYNC_CANCEL_GRACE_S", 0.1)
    started: set[int] = set()

    async def handler(m: Message) -> None:
        started.add(m.offset)
        if m.offset == 0 and m.retry_number == 0:
            end = time.monotonic() + 5
            while time.monotonic() < end:  # swallows every cancellation
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    continue
            return
        await asyncio.sleep(0.25)

    worker = make_worker(
        broker,
        tmp_path,
        handler,
        handler_timeout_s=0.3,
        max_in_flight=16,
        max_abandoned_handlers=8,
    )
    # Offset 0 ignores its cancellation; when its loop is given up on (0.4 s), the second wave
    # (offsets 16-30, started at 0.25 s) is in flight: 16 calls on the abandoned loop.
    send(broker, 31)
    summary = worker.run(until_drained=True)  # raised HungHandlersError (exit 5) before
    tier = broker.records("retry_1s")
    # only the call that ignored its cancellation timed out; the 15 healthy calls ran again
    assert [dict(r.headers)[h.ORIGINAL_OFFSET] for r in tier] == [b"0"]
    assert summary.total("success") == 31  # offsets 1-30, and offset 0 on its retry
    assert broker.committed_offset(GROUP, MAIN) == 31


@pytest.mark.parametrize("iteration", range(3))
def test_ignored_cancellation_stress(
    broker: StubBroker, tmp_path: Path, monkeypatch: Any, iteration: int
) -> None:
    test_one_async_call_ignoring_cancellation_does_not_stop_the_worker(
        broker, tmp_path, monkeypatch
    )


# ------------------------------------------------------------------ fault 4 (poll thread side)
def test_a_header_with_thousands_of_digits_is_malformed_not_an_exit(
    broker: StubBroker, tmp_path: Path
) -> None:
    calls: list[int] = []
    worker = make_worker(broker, tmp_path, lambda m: calls.append(m.offset), sequence="1s")
    now = int(time.time() * 1000)
    broker.append("retry_1s", b"k", b"v", tier_headers(now, **{h.ORIGINAL_OFFSET: b"9" * 5000}))
    broker.append("retry_1s", b"k", b"v", tier_headers(now, **{h.RETRY_NUMBER: b"7" * 5000}))
    send(broker, 3)
    worker.run(until_drained=True)
    dead = broker.records(worker.settings.failed_topic)
    assert len(dead) == 2
    assert all(dict(r.headers)[h.DEAD_REASON] == b"malformed" for r in dead)
    assert sorted(calls) == [0, 1, 2]
    assert broker.committed_offset(GROUP, "retry_1s") == 2


# ------------------------------------------------------------------ fault 5
def test_not_yet_due_tier_records_never_pause_the_main_topic(
    broker: StubBroker, tmp_path: Path, running: Any
) -> None:
    calls: list[int] = []
    worker = make_worker(
        broker,
        tmp_path,
        lambda m: calls.append(m.offset),
        sequence="1h",
        buffer_bytes=64 * 1024,
    )
    later = int(time.time() * 1000) + 3_600_000
    for _ in range(40):  # 80 KB waiting an hour: more than buffer_bytes
        broker.append("retry_1h", b"k", b"x" * 2048, tier_headers(later))
    running(worker)
    wait_for(
        lambda: len(worker.book.parts) == 2 and worker.book.parts[("retry_1h", 0)].tail,
        5,
        what="the tier's tail to fill",
    )
    wait_for(lambda: len(worker.book.parts[("retry_1h", 0)].tail) == 40, 5, what="40 waiting")
    send(broker, 10)
    wait_for(lambda: len(calls) == 10, 5, what="main-topic records handled while tiers wait")
    assert not worker.book.parts[(MAIN, 0)].paused


# ------------------------------------------------------------------ fault 6
def test_a_routing_host_a_day_ahead_cannot_freeze_a_tier_partition(
    broker: StubBroker, tmp_path: Path
) -> None:
    handled: dict[int, float] = {}
    worker = make_worker(
        broker, tmp_path, lambda m: handled.setdefault(m.offset, time.time()), sequence="1s"
    )
    now = int(time.time() * 1000)
    day = 86_400_000
    broker.append("retry_1s", b"k", b"ahead", tier_headers(now + day), timestamp=now + day)
    for _ in range(5):
        broker.append("retry_1s", b"k", b"due", tier_headers(now), timestamp=now)
    started = time.time()
    thread, errors = run_in_thread(worker, until_drained=True)
    thread.join(10)
    assert not thread.is_alive() and not errors
    assert sorted(handled) == list(range(6))
    assert max(handled.values()) - started < 3.0  # one tier delay past first seen, not a day


# ------------------------------------------------------------------ too-large copies
def test_a_copy_too_large_for_the_broker_is_dead_lettered_without_payload(
    broker: StubBroker, tmp_path: Path
) -> None:
    def fail(m: Message) -> None:
        if m.offset == 3:
            raise ValueError("route me")

    worker = make_worker(broker, tmp_path, fail, max_in_flight=1)
    broker.max_bytes["retry_1s"] = 1  # every copy is over the tier's max.message.bytes
    send(broker, 10, keys=1)
    summary = worker.run(until_drained=True)  # exited 3 and restarted into it forever before
    dead = broker.records(worker.settings.failed_topic)
    assert len(dead) == 1
    hdrs = dict(dead[0].headers)
    assert hdrs[h.DEAD_REASON] == b"too_large"
    assert hdrs[h.ORIGINAL_OFFSET] == b"3" and hdrs[h.ORIGINAL_TOPIC] == MAIN.encode()
    assert dead[0].value is None
    assert summary.dead_reasons["too_large"] == 1
    assert broker.committed_offset(GROUP, MAIN) == 10


def test_a_dead_letter_too_large_even_without_payload_stops_with_input_uncommitted(
    broker: StubBroker, tmp_path: Path
) -> None:
    from retryd.errors import DeliveryError

    def fail(m: Message) -> None:
        if m.offset == 3:
            raise ValueError("route me")

    worker = make_worker(broker, tmp_path, fail, max_in_flight=1)
    broker.max_bytes["retry_1s"] = 1
    broker.max_bytes[worker.settings.failed_topic] = 0  # not even the envelope fits
    send(broker, 10, keys=1)
    with pytest.raises(DeliveryError, match=r"max\.message\.bytes"):
        worker.run(until_drained=True)
    assert broker.committed_offset(GROUP, MAIN) == 3


def test_a_small_copy_refused_with_a_big_one_in_its_batch_is_routed_intact(
    broker: StubBroker, tmp_path: Path
) -> None:
    """The broker refuses a whole batch over a topic's max.message.bytes: the small copies
    batched with a big one are sent again alone and routed with their payload; only the big
    one becomes a ``too_large`` dead letter."""
    worker = make_worker(broker, tmp_path, _fail_first_attempt, max_in_flight=4)
    broker.max_bytes["retry_1s"] = 1000
    for i in range(6):
        value = b"x" * 5000 if i == 2 else b"v%d" % i
        broker.append(MAIN, b"k%d" % i, value)
    worker.run(until_drained=True)
    dead = broker.records(worker.settings.failed_topic)
    assert [dict(d.headers)[h.ORIGINAL_OFFSET] for d in dead] == [b"2"]
    assert dict(dead[0].headers)[h.DEAD_REASON] == b"too_large"
    tier = [r for r in broker.records("retry_1s") if not r.aborted]
    assert sorted(r.value for r in tier) == sorted(b"v%d" % i for i in range(6) if i != 2)
    assert broker.committed_offset(GROUP, MAIN) == 6


def _fail_first_attempt(m: Message) -> None:
    if m.retry_number == 0:
        raise ValueError("route me")


# ------------------------------------------------------------------ header names
def test_header_names_the_client_cannot_decode_dead_letter_the_record(
    broker: StubBroker, tmp_path: Path
) -> None:
    """The client decodes header names as UTF-8 when ``headers()`` is called and raises on
    a non-UTF-8 one. On the poll thread that used to end the worker."""

    def fail(m: Message) -> None:
        raise ValueError("always")

    worker = make_worker(broker, tmp_path, fail, sequence="1s")
    now = int(time.time() * 1000)
    broker.append(MAIN, b"k", b"main", [(b"\xff\xfe", b"v")])  # type: ignore[list-item]
    broker.append("retry_1s", b"k", b"tier", [*tier_headers(now), (b"\xc3(", b"v")])  # type: ignore[list-item]
    summary = worker.run(until_drained=True)
    dead = broker.records(worker.settings.failed_topic)
    assert len(dead) == 2
    assert all(dict(r.headers)[h.DEAD_REASON] == b"malformed" for r in dead)
    assert summary.dead_reasons["malformed"] == 2
    assert broker.committed_offset(GROUP, MAIN) == 1
    assert broker.committed_offset(GROUP, "retry_1s") == 1
