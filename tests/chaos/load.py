"""Producing a scenario's messages in step with its fault schedule, so that every fault hits a
system under load rather than one that already finished.

The schedule drives the load: before each fault interval it ``allow``\\ s the next share of the
messages, which the producer thread spreads evenly over that interval; ``finish`` releases the
rest. However long a scenario waits between faults (a group settling on a busy machine), each
fault lands right after a share of fresh messages, with some of them still in the retry tiers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

from confluent_kafka import KafkaError, Producer

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]

BURSTS_PER_S = 20


class PacedProducer:
    """Produces ``records`` to ``topic`` in paced segments from a thread; every record is
    acknowledged (acks=all) before ``join`` returns."""

    def __init__(self, bootstrap: str, topic: str, records: Sequence[Record]) -> None:
        self.topic = topic
        self.records = records
        self.produced = 0
        self.acked = 0
        self.errors: list[str] = []
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 300_000,
                "log_level": 2,  # connection failures are the point of some scenarios
            }
        )
        self._segments: deque[tuple[int, float]] = deque()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)
        self._thread.start()

    def allow(self, upto: int, over_s: float) -> None:
        """Produce records up to index ``upto`` (exclusive), spread over ``over_s`` seconds."""
        with self._cond:
            self._segments.append((min(upto, len(self.records)), over_s))
            self._cond.notify()

    def allow_share(self, part: int, parts: int, over_s: float) -> None:
        """The ``part``-th of ``parts`` equal shares (1-based)."""
        self.allow(len(self.records) * part // parts, over_s)

    def finish(self, over_s: float = 1.0) -> None:
        self.allow(len(self.records), over_s)

    def _delivered(self, err: KafkaError | None, _msg: object) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors.append(err.str())

    def _next_segment(self) -> tuple[int, float]:
        with self._cond:
            while not self._segments:
                self._cond.wait()
            return self._segments.popleft()

    def _run(self) -> None:
        n = len(self.records)
        while self.produced < n:
            upto, over_s = self._next_segment()
            first = self.produced
            count = upto - first
            if count <= 0:
                continue
            began = time.monotonic()
            chunk = max(1, count // max(1, int(over_s * BURSTS_PER_S)))
            for i in range(first, upto, chunk):
                wait = began + over_s * (i - first) / count - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # pacing the load, not synchronisation
                for key, value, headers in self.records[i : min(i + chunk, upto)]:
                    while True:
                        try:
                            self._producer.produce(
                                self.topic,
                                value,
                                key,
                                headers=headers,
                                on_delivery=self._delivered,
                            )
                            break
                        except BufferError:
                            self._producer.poll(0.1)
                    self.produced += 1
                self._producer.poll(0)
        self._producer.flush(600)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"producing took longer than {timeout_s}s"
        assert not self.errors, f"produce failed: {self.errors[:3]}"
        assert self.acked == len(self.records), f"{self.acked}/{len(self.records)} acknowledged"
