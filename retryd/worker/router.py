"""The producer side of the worker: routed copies out, acknowledgements back.

acks=all and idempotence are fixed in ``retryd.kafka.clients``. The worker marks an input done
only from ``on_acked``, so a copy the broker did not acknowledge never loses its input.

Back-pressure: when librdkafka's local queue is full (``BufferError``), the copy waits in a
bounded backlog and ``blocked`` tells the worker to pause its partitions and keep polling: the
consumer keeps its group membership and the producer drains in the background. The backlog is
bounded by what was already consumed (nothing new is consumed while blocked).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException

from retryd.policy.routing import Route, target_partition

Acked = Callable[[int, int], None]  # (partition, offset) of the routed copy
Failed = Callable[[KafkaError], None]


class ProducerLike(Protocol):
    """The part of ``confluent_kafka.Producer`` the worker uses (stubbed in unit tests)."""

    def produce(self, topic: str, **kwargs: Any) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...


class _Copy:
    __slots__ = ("key", "on_acked", "on_failed", "partition", "route", "value")

    def __init__(
        self,
        route: Route,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        on_acked: Acked,
        on_failed: Failed,
    ) -> None:
        self.route = route
        self.key = key
        self.value = value
        self.partition = partition
        self.on_acked = on_acked
        self.on_failed = on_failed


class Router:
    def __init__(self, producer: ProducerLike, partition_counts: dict[str, int]) -> None:
        self._producer = producer
        self.partition_counts = partition_counts
        self.inflight = 0  # produced, not yet acknowledged or failed
        self.produced_end: dict[tuple[str, int], int] = {}  # acknowledged copies, per partition
        self._backlog: deque[_Copy] = deque()

    @property
    def blocked(self) -> bool:
        """Copies are waiting for room in the producer's queue."""
        return bool(self._backlog)

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def send(
        self,
        route: Route,
        key: bytes | None,
        value: bytes | None,
        source_partition: int,
        on_acked: Acked,
        on_failed: Failed,
    ) -> None:
        partition = target_partition(source_partition, self.partition_counts.get(route.topic))
        copy = _Copy(route, key, value, partition, on_acked, on_failed)
        if self._backlog or not self._produce(copy):
            self._backlog.append(copy)

    def _produce(self, copy: _Copy) -> bool:
        """Hand one copy to librdkafka; False when its queue is full (try again later)."""
        route = copy.route

        def delivered(err: KafkaError | None, out: Any) -> None:
            self.inflight -= 1
            if err is not None:
                copy.on_failed(err)
                return
            partition, offset = out.partition(), out.offset()
            end = self.produced_end
            k = (route.topic, partition)
            if offset + 1 > end.get(k, 0):
                end[k] = offset + 1
            copy.on_acked(partition, offset)

        kwargs: dict[str, Any] = {
            "key": copy.key,
            "value": copy.value,
            "headers": route.headers,
            "timestamp": route.timestamp_ms,
            "on_delivery": delivered,
        }
        if copy.partition is not None:
            kwargs["partition"] = copy.partition
        try:
            self._producer.produce(route.topic, **kwargs)
        except BufferError:
            return False
        except KafkaException as exc:  # refused locally, e.g. larger than message.max.bytes
            copy.on_failed(exc.args[0] if exc.args else KafkaError(KafkaError._FAIL))
            return True
        self.inflight += 1
        return True

    def poll(self) -> None:
        """Serve delivery reports, then move waiting copies into the freed room."""
        self._producer.poll(0)
        backlog = self._backlog
        while backlog and self._produce(backlog[0]):
            backlog.popleft()

    def flush(self, timeout_s: float) -> int:
        """Wait for every acknowledgement (backlog included); returns copies still undelivered."""
        import time

        deadline = time.monotonic() + timeout_s
        while self._backlog and time.monotonic() < deadline:
            self._producer.poll(0.05)
            self.poll()
        if not self.inflight:
            return len(self._backlog)
        remaining = self._producer.flush(max(deadline - time.monotonic(), 0.0))
        return int(remaining) + len(self._backlog)
