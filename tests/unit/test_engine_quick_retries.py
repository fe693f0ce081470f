"""Quick retries in place (``quick=<n>@<delay>`` in ``retry_sequence``) on the stub broker: a
failing main-topic record is called again in the same worker before any copy goes to a tier,
and its key's later records wait behind it (one longer call to the engine)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from retryd.handlers.base import Message
from retryd.policy.classify import NonRetryableError
from tests.stub_kafka import StubBroker
from tests.unit.test_engine_loop import GROUP, MAIN, make_worker, send


class Attempts:
    """Calls per (topic, offset) and their times (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, int, int, float]] = []  # topic, offset, retry, monotonic

    def note(self, m: Message) -> int:
        with self.lock:
            self.calls.append((m.topic, m.offset, m.retry_number, time.monotonic()))
            return sum(1 for t, o, _, _ in self.calls if t == m.topic and o == m.offset)

    def per_offset(self, topic: str = MAIN) -> Counter[int]:
        return Counter(o for t, o, _, _ in self.calls if t == topic)


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_a_blip_shorter_than_the_quick_retries_never_leaves_the_main_topic(
    tmp_path: Path, kind: str
) -> None:
    broker = StubBroker()
    seen = Attempts()

    def blip(m: Message) -> None:
        if seen.note(m) <= 2:  # fails twice, then the service is back
            raise ConnectionError("blip")

    async def async_blip(m: Message) -> None:
        await asyncio.sleep(0.001)
        blip(m)

    handler = blip if kind == "def" else async_blip
    worker = make_worker(broker, tmp_path, handler, sequence="1s, quick=2@50ms")
    send(broker, 20)
    summary = worker.run(until_drained=True)

    assert seen.per_offset() == Counter({o: 3 for o in range(20)})
    assert broker.records("retry_1s") == [] and broker.records("failed_topic") == []
    assert broker.committed_offset(GROUP, MAIN) == 20
    assert summary.total("success") == 20
    assert (summary.quick_retries, summary.quick_rescued) == (40, 20)
    for offset in range(20):  # each retry waited its delay (no sleep in the poll loop)
        times = [at for t, o, _, at in seen.calls if t == MAIN and o == offset]
        assert all(b - a >= 0.045 for a, b in itertools.pairwise(times)), times


def test_quick_retries_spent_the_record_goes_to_its_first_tier(tmp_path: Path) -> None:
    broker = StubBroker()
    seen = Attempts()

    def down(m: Message) -> None:
        seen.note(m)
        if m.retry_number == 0:
            raise ConnectionError("still down")

    worker = make_worker(broker, tmp_path, down, sequence="fixed(1s, n=2, quick=3@10ms)")
    send(broker, 5)
    summary = worker.run(until_drained=True)

    assert seen.per_offset() == Counter({o: 4 for o in range(5)})  # 1 call + 3 quick retries
    assert seen.per_offset("retry_1s") == Counter({o: 1 for o in range(5)})  # no quick there
    tier = broker.records("retry_1s")
    assert [dict(r.headers)["retry_number"] for r in tier] == [b"1"] * 5
    assert summary.total("retried") == 5


def test_a_non_retryable_failure_is_not_retried_in_place(tmp_path: Path) -> None:
    broker = StubBroker()
    seen = Attempts()

    def poison(m: Message) -> None:
        seen.note(m)
        raise NonRetryableError("bad payload")

    worker = make_worker(broker, tmp_path, poison, sequence="1s, quick=2@10ms")
    send(broker, 3)
    summary = worker.run(until_drained=True)

    assert seen.per_offset() == Counter({0: 1, 1: 1, 2: 1})
    assert len(broker.records("failed_topic")) == 3
    assert summary.total("dead") == 3


def test_a_key_s_later_records_wait_behind_its_quick_retries(tmp_path: Path) -> None:
    broker = StubBroker()
    seen = Attempts()

    def flaky(m: Message) -> None:
        if seen.note(m) == 1 and m.offset % 3 == 0:
            raise ConnectionError("blip")

    worker = make_worker(broker, tmp_path, flaky, sequence="1s, quick=1@30ms", max_in_flight=8)
    send(broker, 60, keys=4)  # keys 0-3: offsets 0, 4, 8 ... share key 0
    worker.run(until_drained=True)

    starts: dict[int, list[tuple[float, int]]] = {}
    for t, o, _, at in seen.calls:
        assert t == MAIN
        starts.setdefault(o % 4, []).append((at, o))
    for key, calls in starts.items():
        offsets = [o for _, o in sorted(calls)]
        assert offsets == sorted(offsets), f"key {key} out of order: {offsets}"
    assert broker.records("retry_1s") == []
    assert broker.committed_offset(GROUP, MAIN) == 60


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_a_failure_an_error_route_dead_letters_is_not_retried_in_place(
    tmp_path: Path, kind: str
) -> None:
    broker = StubBroker()
    broker.create("orders.denied", 1)
    seen = Attempts()

    def denied(m: Message) -> None:
        seen.note(m)
        raise PermissionError("denied")

    async def async_denied(m: Message) -> None:
        denied(m)

    worker = make_worker(
        broker,
        tmp_path,
        denied if kind == "def" else async_denied,
        sequence="1s, quick=3@10ms",
        error_routes={"PermissionError": "dlt:orders.denied"},
    )
    send(broker, 4)
    worker.run(until_drained=True)

    assert seen.per_offset() == Counter({o: 1 for o in range(4)})  # one call each
    assert len(broker.records("orders.denied")) == 4
    assert broker.records("retry_1s") == []
