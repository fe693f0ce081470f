"""A downstream business service that can go down, steady load on a main topic, and the call
log of tests/integration/circuit_handlers.py: what the circuit breaker's tests on real Kafka
share (tests/integration/test_circuit_outage.py, test_circuit_retries_succeed.py,
tests/chaos/test_circuit_kills.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from retryd.runtime.heartbeat import read_heartbeats
from tests.support import Record, http_service, read_topic, unique

LOAD_PER_S = 40
KEYS = 100
POISON = "poison"


class Service(BaseHTTPRequestHandler):
    """Answers 200, 503 to everything while ``down``, and 503 always to the poison key.

    It keeps connections alive (HTTP/1.1), as services do. Answering HTTP/1.0 (a connection per
    call), bursts of calls overflowed its listen backlog of 5 (78 overflows in one outage run)
    and a dropped SYN costs a call a 1 s retransmit: the outage test's confirming probe once
    took 1 s, and detection 2.6 s."""

    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    down = False
    calls: list[tuple[float, str, int]] = []  # (time, body, status)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        status = 503 if Service.down or body.startswith(POISON) else 200
        with Service.lock:
            Service.calls.append((time.time(), body, status))
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def service() -> Iterator[str]:
    Service.down = False
    Service.calls = []
    with http_service(Service) as url:
        yield url


class Load:
    """Steady load on the main topic: ``LOAD_PER_S`` records a second over ``KEYS`` keys, one
    in fifty for the poison key."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        self.topic = topic
        self.sent: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        start = time.monotonic()
        while not self.stop.is_set():
            body = f"{POISON}-{i}" if i % 50 == 25 else f"m-{i}"
            key = POISON if body.startswith(POISON) else f"k{i % KEYS}"
            self.producer.produce(self.topic, key=key.encode(), value=body.encode())
            self.sent.append(body)
            i += 1
            self.producer.poll(0)
            # paced by the clock, not by sleeping out a fixed share
            self.stop.wait(max(0.0, start + i / LOAD_PER_S - time.monotonic()))
        assert self.producer.flush(30) == 0


def read_now(bootstrap: str, topic: str) -> list[Record]:
    """Everything in ``topic`` now (empty while nothing was written yet)."""
    try:
        return read_topic(bootstrap, topic, timeout=5)
    except AssertionError:  # timed out on a topic with nothing in it yet
        return []


def circuit_of(state_dir: Path) -> dict[str, Any]:
    """The circuit of the (first) worker process writing heartbeats in ``state_dir``."""
    beats = read_heartbeats(state_dir)
    return beats[0].circuit if beats and beats[0].circuit else {}


def circuits(state_dir: Path, fresh_s: float = 5.0) -> dict[int, dict[str, Any]]:
    """pid -> circuit of every worker process writing heartbeats in ``state_dir`` (a killed
    worker's file stays behind: only heartbeats fresher than ``fresh_s`` count)."""
    now = time.time()
    return {
        b.pid: b.circuit for b in read_heartbeats(state_dir) if b.circuit and now - b.ts <= fresh_s
    }


def ok_bodies() -> set[str]:
    with Service.lock:
        return {body for _, body, status in Service.calls if status == 200}


class CallLog:
    """The calls tests/integration/circuit_handlers.py appends to a file (``<S|F> <value>
    <wall clock s>`` per line), read as the file grows: when each record first succeeded."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self.first_s: float | None = None  # the first call
        self.ok_s: dict[str, float] = {}  # value -> its first success
        self.calls = 0
        self.failures = 0

    def read(self) -> int:
        """Take in the lines completed since the last read; returns the records succeeded."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._pos)
                chunk = fh.read()
        except FileNotFoundError:
            return 0
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a writer may be halfway through a line
        self._pos += len(complete)
        ok_s = self.ok_s
        for line in complete.decode().splitlines():
            kind, value, at = line.split()
            t = float(at)
            self.calls += 1
            if self.first_s is None or t < self.first_s:
                self.first_s = t
            if kind == "S":
                if value not in ok_s or t < ok_s[value]:
                    ok_s[value] = t
            else:
                self.failures += 1
        return len(ok_s)

    def drain_s(self) -> float:
        """From the first call to the last record's first success."""
        assert self.first_s is not None and self.ok_s
        return max(self.ok_s.values()) - self.first_s


def records_in(bootstrap: str, topic: str) -> int:
    """How many records ``topic`` holds (the sum of its partitions' high watermarks)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("watermarks")})
    try:
        md = consumer.list_topics(topic, timeout=10).topics[topic]
        assert md.error is None, f"topic {topic}: {md.error}"
        total = 0
        for p in md.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high - low
        return total
    finally:
        consumer.close()
