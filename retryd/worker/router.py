"""The producer side of the worker: routed copies out, acknowledgements back.

acks=all and idempotence are fixed in ``clients.producer_config``. The worker stores an input
offset only from ``on_acked``, so a copy the broker did not acknowledge never loses its input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import Message as KMessage

from retryd.policy.routing import Route, target_partition

Acked = Callable[[int, int], None]  # (partition, offset) of the routed copy
Failed = Callable[[KafkaError], None]


class Router:
    def __init__(self, config: dict[str, Any], partition_counts: dict[str, int]) -> None:
        self._producer = Producer(config)
        self.partition_counts = partition_counts
        self.inflight = 0
        self.produced_end: dict[tuple[str, int], int] = {}  # acknowledged copies, per partition

    def send(
        self,
        route: Route,
        key: bytes | None,
        value: bytes | None,
        source_partition: int,
        on_acked: Acked,
        on_failed: Failed,
    ) -> None:
        def delivered(err: KafkaError | None, out: KMessage) -> None:
            self.inflight -= 1
            if err is not None:
                on_failed(err)
            else:
                partition, offset = out.partition() or 0, out.offset() or 0
                key = (route.topic, partition)
                if offset + 1 > self.produced_end.get(key, 0):
                    self.produced_end[key] = offset + 1
                on_acked(partition, offset)

        kwargs: dict[str, Any] = {
            "key": key,
            "value": value,
            "headers": route.headers,
            "timestamp": route.timestamp_ms,
            "on_delivery": delivered,
        }
        partition = target_partition(source_partition, self.partition_counts.get(route.topic))
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(route.topic, **kwargs)
                break
            except BufferError:
                self._producer.poll(0.05)  # local queue full: serve delivery reports to make room
            except KafkaException as exc:  # refused locally, e.g. larger than message.max.bytes
                on_failed(exc.args[0] if exc.args else KafkaError(KafkaError._FAIL))
                return
        self.inflight += 1

    def poll(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout_s: float) -> int:
        """Wait for every acknowledgement; returns how many copies are still undelivered."""
        if not self.inflight:
            return 0
        return int(self._producer.flush(timeout_s))
