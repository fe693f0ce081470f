"""A downstream business service that can go down, steady load on a main topic, and the call
log of tests/integration/circuit_handlers.py: what the circuit breaker's tests on real Kafka
share (tests/integration/test_circuit_outage.py, test_circuit_retries_succeed.py,
tests/chaos/test_circuit_kills.py)."""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from datetime import datetime
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

    def longest_wait_s(self) -> float:
        """The longest time between two records' first successes (and from the first call to
        the first success): how long the drain stood still at most, on the handler's clock."""
        if self.first_s is None or not self.ok_s:
            return 0.0
        times = [self.first_s, *sorted(self.ok_s.values())]
        return max(b - a for a, b in itertools.pairwise(times))

    def follow(
        self, records: int, worker: subprocess.Popen[bytes], *, start_s: float, stall_s: float
    ) -> str | None:
        """Read the log while ``worker`` runs until ``records`` records succeeded: None, or why
        it stopped short (the worker exited, or it stalled).

        Progress decides, never a total: on a busy machine every step is slower, and a fixed
        deadline for the whole drain measured the machine (issue 32 item 3: 30 s from the
        spawn, of which the worker's start took up to 16 s). What is asserted is that the drain
        does not stand still: the first call comes within ``start_s`` of the spawn (the start
        is not under test: this only stops a worker that never starts), and after it one more
        record succeeds at least every ``stall_s`` (a circuit holding a healthy workload stops
        every success: nothing but its probe starts). The silence is timed by this process,
        which reads before it judges, so a reader that was itself kept off the CPU sees the
        successes made meanwhile instead of a stall."""
        succeeded, called = 0, False
        since = time.monotonic()  # the last progress seen: the spawn, the first call, a success
        while True:
            got = self.read()
            if got >= records:
                return None
            now = time.monotonic()
            if got > succeeded or (self.calls and not called):
                succeeded, called, since = got, True, now
            elif not called and now - since > start_s:
                return f"the worker made no call within {start_s:g}s of its start"
            elif called and now - since > stall_s:
                return (
                    f"no record succeeded for {stall_s:g}s: {got} of {records} succeeded, "
                    f"{self.calls} calls"
                )
            code = worker.poll()
            if code is not None:
                if self.read() >= records:
                    return None
                return f"the worker exited ({code}) with {len(self.ok_s)} of {records} succeeded"
            with suppress(subprocess.TimeoutExpired):
                worker.wait(0.1)  # the next look: at once if the worker exits


def _log_time(line: str) -> float | None:
    """The time of a worker's log line (``retryd.runtime.logs.TEXT_FORMAT``), if it has one."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def circuit_holds(log: str) -> list[float]:
    """How long (s) each stretch of a worker's circuit not closed lasted, in order, from the
    worker's log (``retryd.worker.circuit``: half-open or open after closed, until closed
    again; one still on when the log ends lasts until its last line). While the circuit is not
    closed only its probe starts, so every failure is held and no record moves on."""
    holds: list[float] = []
    since = last = None
    for line in log.splitlines():
        at = _log_time(line)
        if at is None:
            continue
        last = at
        if " retryd.worker.circuit: circuit " not in line or " circuit order #" in line:
            continue  # (an operator's order is logged, then the state it made)
        closed = " retryd.worker.circuit: circuit closed" in line
        if since is None and not closed:
            since = at
        elif since is not None and closed:
            holds.append(round(at - since, 3))
            since = None
    if since is not None and last is not None:
        holds.append(round(last - since, 3))
    return holds


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
