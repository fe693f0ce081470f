"""The outage circuit breaker inside the worker loop, on the stub broker: records failing
during an outage stay in place (never moved on because of it), a probe closes the circuit
once the service answers, a poison key never opens it, and orders from the sidecar apply.
(The same runs on a real broker with an HTTP service in tests/integration.)"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from retryd.handlers.base import Message
from retryd.policy.circuit import CircuitAction, CircuitState
from retryd.runtime.circuit_control import write_command
from retryd.worker.engine import Worker
from tests.stub_kafka import StubBroker
from tests.support import wait_for
from tests.unit.test_engine_loop import GROUP, MAIN, make_worker, send

OPEN, CLOSED = CircuitState.OPEN, CircuitState.CLOSED


class Service:
    """A downstream service that can be down; counts calls and successes per offset."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.down = threading.Event()
        self.calls = 0
        self.calls_while_down = 0
        self.ok: Counter[int] = Counter()

    def __call__(self, m: Message) -> None:
        with self.lock:
            self.calls += 1
            if self.down.is_set():
                self.calls_while_down += 1
                raise ConnectionError("service unavailable")
            origin = m.original_offset
            self.ok[m.offset if origin is None else origin] += 1


def _run(worker: Worker, until_drained: bool = True) -> threading.Thread:
    t = threading.Thread(target=worker.run, kwargs={"until_drained": until_drained}, daemon=True)
    t.start()
    return t


def _state(worker: Worker) -> CircuitState:
    return worker.circuit.breaker.state


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_an_outage_holds_records_in_place_and_a_probe_resumes(tmp_path: Path, kind: str) -> None:
    broker = StubBroker()
    service = Service()
    service.down.set()

    async def async_service(m: Message) -> None:
        await asyncio.sleep(0)
        service(m)

    handler: Any = service if kind == "def" else async_service
    worker = make_worker(
        broker,
        tmp_path,
        handler,
        sequence="1s,1s",
        circuit_probe_s=0.2,
        max_in_flight=4,
        circuit_breaker=True,
    )
    send(broker, 300, keys=50)
    thread = _run(worker)
    wait_for(lambda: _state(worker) is not CLOSED, 10, what="the circuit to open")
    routed_while_detecting = len(broker.records("retry_1s"))
    wait_for(lambda: worker.circuit.breaker.probes >= 2, 10, what="two failed probes")
    assert _state(worker) is not CLOSED
    assert len(broker.records("retry_1s")) == routed_while_detecting  # nothing moved on
    assert (
        broker.committed_offset(GROUP, MAIN) is None
        or (broker.committed_offset(GROUP, MAIN) or 0) < 300
    )

    service.down.clear()
    thread.join(30)
    assert not thread.is_alive()
    assert _state(worker) is CLOSED
    # every record handled once it came back; the ones routed before detection too
    assert set(service.ok) == set(range(300))
    assert broker.records("failed_topic") == []
    assert routed_while_detecting <= 20 + 4  # the detection window and the calls in flight
    assert broker.committed_offset(GROUP, MAIN) == 300
    snap = worker.circuit.snapshot()
    assert snap.held >= 1 and snap.transitions["open"] >= 1 and snap.transitions["closed"] == 1


def test_a_poison_key_goes_its_way_and_never_opens_the_circuit(tmp_path: Path) -> None:
    broker = StubBroker()

    def handler(m: Message) -> None:
        if m.key == b"0":
            raise ValueError("poison")

    worker = make_worker(broker, tmp_path, handler, sequence="50ms,50ms", circuit_breaker=True)
    send(broker, 400, keys=8)  # 50 poison records among 400: every one fails three times
    summary = worker.run(until_drained=True)

    assert worker.circuit.breaker.snapshot().transitions == {}
    assert len(broker.records("failed_topic")) == 50
    assert summary.total("dead") == 50


def test_records_held_at_shutdown_stay_uncommitted_for_the_next_owner(tmp_path: Path) -> None:
    broker = StubBroker()
    service = Service()
    service.down.set()
    worker = make_worker(
        broker, tmp_path, service, circuit_probe_s=60, max_in_flight=2, circuit_breaker=True
    )
    send(broker, 100, keys=20)
    thread = _run(worker, until_drained=False)
    wait_for(lambda: _state(worker) is OPEN, 10, what="the circuit to open")
    routed = {r.key for r in broker.records("retry_1s")}
    worker.stop()
    thread.join(10)
    assert not thread.is_alive()
    committed = broker.committed_offset(GROUP, MAIN) or 0
    assert committed < 100

    # the next owner (service back) finishes everything from the committed offset
    service.down.clear()
    nxt = make_worker(broker, tmp_path, service, create_topics=False)
    nxt.run(until_drained=True)
    assert broker.committed_offset(GROUP, MAIN) == 100
    assert set(range(committed, 100)) <= set(service.ok)
    assert len(broker.records("retry_1s")) == len(routed)  # nothing routed by the outage


def test_operator_orders_open_probe_and_close(tmp_path: Path) -> None:
    broker = StubBroker()
    service = Service()
    worker = make_worker(
        broker,
        tmp_path,
        service,
        circuit_probe_s=3600,
        circuit_probe_max_s=3600,
        circuit_breaker=True,
    )
    thread = _run(worker, until_drained=False)
    state_dir = worker.settings.state_dir
    try:
        write_command(state_dir, GROUP, CircuitAction.OPEN, "ops")
        wait_for(lambda: _state(worker) is OPEN, 10, what="the order to open")
        assert worker.circuit.breaker.reason == "opened by ops"
        send(broker, 10)
        wait_for(lambda: worker.book.paused_by_topic().get(MAIN), 10, what="main paused")
        assert service.calls == 0  # nothing starts while open

        write_command(state_dir, GROUP, CircuitAction.PROBE, "ops")
        wait_for(lambda: _state(worker) is CLOSED, 10, what="the probe to close it")
        wait_for(lambda: len(service.ok) == 10, 10, what="the records to run")

        write_command(state_dir, GROUP, CircuitAction.OPEN, "ops")
        wait_for(lambda: _state(worker) is OPEN, 10, what="open again")
        write_command(state_dir, GROUP, CircuitAction.CLOSE, "ops")
        wait_for(lambda: _state(worker) is CLOSED, 10, what="the order to close")
        assert worker.circuit.breaker.reason == "closed by ops"
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_disabled_the_outage_routes_as_before(tmp_path: Path) -> None:
    broker = StubBroker()

    def handler(m: Message) -> None:
        raise ConnectionError("down")

    worker = make_worker(broker, tmp_path, handler, sequence="10ms", circuit_breaker=False)
    send(broker, 100, keys=50)
    worker.run(until_drained=True)
    assert len(broker.records("failed_topic")) == 100


def test_a_poison_record_failing_the_probe_does_not_keep_the_circuit_open(
    tmp_path: Path,
) -> None:
    broker = StubBroker()
    service = Service()
    service.down.set()

    def handler(m: Message) -> None:
        if m.key == b"poison":
            raise ConnectionError("poison: always unavailable")
        service(m)

    worker = make_worker(
        broker,
        tmp_path,
        handler,
        sequence="50ms",
        circuit_probe_s=0.2,
        circuit_probe_max_s=0.2,
        max_in_flight=1,
        circuit_breaker=True,
    )
    broker.append(MAIN, b"poison", b"p")  # the oldest record: the first one held, the first probe
    send(broker, 100, keys=20)
    thread = _run(worker)
    wait_for(lambda: _state(worker) is OPEN, 10, what="the circuit to open")
    service.down.clear()
    thread.join(30)
    assert not thread.is_alive()
    snap = worker.circuit.snapshot()
    assert snap.state is CLOSED
    assert snap.probes <= 3  # the poison probe failed once; another record's probe closed it
    assert [r.key for r in broker.records("failed_topic")] == [b"poison"]
    assert set(service.ok) == set(range(1, 101))


def test_tier_records_failing_again_do_not_open_the_circuit(tmp_path: Path) -> None:
    # every record fails its first two attempts (a business rule, not an outage): the main
    # topic fails 100 % of first attempts only for some records, the tiers fail a lot
    broker = StubBroker()

    def handler(m: Message) -> None:
        key = int(m.key or b"0")
        if key % 3 == 0 and m.retry_number < 2:
            raise ConnectionError("not yet")

    worker = make_worker(broker, tmp_path, handler, sequence="20ms,20ms,20ms", circuit_breaker=True)
    send(broker, 300, keys=60)
    worker.run(until_drained=True)

    assert worker.circuit.breaker.snapshot().transitions == {}
    assert broker.records("failed_topic") == []
    assert broker.committed_offset(GROUP, MAIN) == 300
