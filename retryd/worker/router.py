"""The producer side of the worker: routed copies out, acknowledgements back.

acks=all and idempotence are fixed in ``retryd.kafka.clients``. Every delivery report (or a
copy refused locally) becomes a ``Report`` in ``reports``, which the settler reads on the poll
thread: the worker marks an input done only from an acknowledgement, so a copy the broker did
not acknowledge never loses its input. No callbacks are wired back into the settler.

Back-pressure: when librdkafka's local queue is full (``BufferError``), the copy waits in a
bounded backlog and ``blocked`` tells the worker to pause its partitions and keep polling: the
consumer keeps its group membership and the producer drains in the background. The backlog is
bounded by what was already consumed (nothing new is consumed while blocked).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from confluent_kafka import KafkaError, KafkaException

from retryd.policy.routing import Route


class Report(NamedTuple):
    """What became of one routed copy: acknowledged at (partition, offset), or ``error``."""

    context: Any
    route: Route
    error: KafkaError | None
    partition: int
    offset: int


PARTITION_UNASSIGNED = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner decides


class ProducerLike(Protocol):
    """The part of ``confluent_kafka.Producer`` the worker uses (stubbed in unit tests)."""

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...


class Router:
    """Sends routed copies and reports each acknowledgement (or failure) in ``reports`` with
    the context given to ``send``: one small closure per copy, no keyword dictionaries, so the
    per-failure cost is the client's ``produce`` itself."""

    def __init__(
        self,
        producer: ProducerLike,
        partition_counts: dict[str, int],
        alone: Callable[[], ProducerLike] | None = None,
    ) -> None:
        self._producer = producer
        # a copy refused as too large is sent again on a producer that never batches (made on
        # first use): the broker refuses a whole batch, small copies beside a big one too
        self._alone_factory = alone
        self._alone: ProducerLike | None = None
        self.partition_counts = partition_counts
        self.reports: deque[Report] = deque()
        self.inflight = 0  # produced, not yet acknowledged or failed
        self.produced_end: dict[tuple[str, int], int] = {}  # acknowledged copies, per partition
        self._backlog: deque[tuple[Route, bytes | None, bytes | None, int, Any]] = deque()
        # contexts of backlogged copies handed to the producer since the settler last looked
        # (exactly-once settles a copy when it enters the transaction, not on its report)
        self.produced_late: deque[tuple[Any, Route]] = deque()

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
        context: Any,
    ) -> bool:
        """Hand a copy to the producer; False when it waits in the backlog (queue full)."""
        count = self.partition_counts.get(route.topic)
        partition = (
            source_partition
            if count is not None and 0 <= source_partition < count
            else PARTITION_UNASSIGNED
        )
        if self._backlog or not self._produce(route, key, value, partition, context):
            self._backlog.append((route, key, value, partition, context))
            return False
        return True

    def _produce(
        self, route: Route, key: bytes | None, value: bytes | None, partition: int, context: Any
    ) -> bool:
        """Hand one copy to librdkafka; False when its queue is full (try again later)."""

        reports = self.reports

        def delivered(err: KafkaError | None, out: Any) -> None:
            self.inflight -= 1
            if err is not None:
                reports.append(Report(context, route, err, -1, -1))
                return
            partition, offset = out.partition(), out.offset()
            end = self.produced_end
            k = (route.topic, partition)
            if offset + 1 > end.get(k, 0):
                end[k] = offset + 1
            reports.append(Report(context, route, None, partition, offset))

        try:
            # Positional, like the client's C signature: (topic, value, key, partition, callback,
            # on_delivery, timestamp, headers). No keyword dictionary per copy.
            self._producer.produce(
                route.topic,
                value,
                key,
                partition,
                delivered,
                None,
                route.timestamp_ms,
                route.headers,
            )
        except BufferError:
            return False
        except KafkaException as exc:  # refused locally, e.g. larger than message.max.bytes
            err = exc.args[0] if exc.args else KafkaError(KafkaError._FAIL)
            self.reports.append(Report(context, route, err, -1, -1))
            return True
        self.inflight += 1
        return True

    @property
    def can_send_alone(self) -> bool:
        return self._alone_factory is not None

    def send_alone(
        self,
        route: Route,
        key: bytes | None,
        value: bytes | None,
        source_partition: int,
        context: Any,
    ) -> None:
        """Send one copy in a batch of its own (its report arrives like any other)."""
        assert self._alone_factory is not None
        if self._alone is None:
            self._alone = self._alone_factory()
        count = self.partition_counts.get(route.topic)
        partition = (
            source_partition
            if count is not None and 0 <= source_partition < count
            else PARTITION_UNASSIGNED
        )
        producer, self._producer = self._producer, self._alone
        try:
            while not self._produce(route, key, value, partition, context):
                self._alone.poll(0.05)  # (its queue is tiny: one copy at a time, rarely)
        finally:
            self._producer = producer

    def poll(self) -> None:
        """Serve delivery reports, then move waiting copies into the freed room."""
        self._producer.poll(0)
        if self._alone is not None:
            self._alone.poll(0)
        backlog = self._backlog
        while backlog and self._produce(*backlog[0]):
            item = backlog.popleft()
            self.produced_late.append((item[4], item[0]))

    def flush(self, timeout_s: float) -> int:
        """Wait for every acknowledgement (backlog included); returns copies still undelivered."""
        deadline = time.monotonic() + timeout_s
        while self._backlog and time.monotonic() < deadline:
            self._producer.poll(0.05)
            self.poll()
        if not self.inflight:
            return len(self._backlog)
        remaining = self._producer.flush(max(deadline - time.monotonic(), 0.0))
        if self._alone is not None:
            remaining += self._alone.flush(max(deadline - time.monotonic(), 0.0))
        return int(remaining) + len(self._backlog)
