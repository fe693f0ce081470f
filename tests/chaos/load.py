"""Producing a scenario's messages at a steady rate over its fault window, so that faults hit
a system under load rather than one that already finished."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from confluent_kafka import KafkaError, Producer

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


class PacedProducer:
    """Produces ``records`` to ``topic`` spread evenly over ``seconds`` in a thread; every
    record is acknowledged (acks=all) before ``join`` returns."""

    def __init__(
        self, bootstrap: str, topic: str, records: Sequence[Record], seconds: float
    ) -> None:
        self.topic = topic
        self.records = records
        self.seconds = seconds
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
            }
        )
        self._thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)

    def start(self) -> PacedProducer:
        self._thread.start()
        return self

    def _delivered(self, err: KafkaError | None, _msg: object) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors.append(err.str())

    def _run(self) -> None:
        n = len(self.records)
        began = time.monotonic()
        chunk = max(1, n // max(1, int(self.seconds * 20)))  # about 20 bursts a second
        for i in range(0, n, chunk):
            due = began + self.seconds * i / n
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # pacing the load, not synchronisation
            for key, value, headers in self.records[i : i + chunk]:
                while True:
                    try:
                        self._producer.produce(
                            self.topic, value, key, headers=headers, on_delivery=self._delivered
                        )
                        break
                    except BufferError:
                        self._producer.poll(0.1)
                self.produced += 1
            self._producer.poll(0)
        self._producer.flush(600)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"producing took longer than {timeout_s}s"
        assert not self.errors, f"produce failed: {self.errors[:3]}"
        assert self.acked == len(self.records), f"{self.acked}/{len(self.records)} acknowledged"
