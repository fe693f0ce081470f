"""Read partitions of a topic from given offsets up to their current end, without a group.

End-of-partition is detected with ``enable.partition.eof`` rather than a ListOffsets
'latest' request (wrong on some Kafka-compatible brokers). Positions are tracked here, never
read back from librdkafka (``position()`` is invalid until a message was delivered).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Generator, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from retryd.kafka.clients import reader_config
from retryd.policy.foreign import ForeignFormat, TopicFormat, record_format
from retryd.policy.headers import message_headers
from retryd.replay.clients import KAFKA, ReplayClients
from retryd.replay.errors import BrokerUnavailable, ScanIncomplete
from retryd.replay.records import FailedRecord

log = logging.getLogger(__name__)

QUIET_END_S = 1.0
# consume() batch: at most this many records, and about this many value bytes (see
# ``TopicScanner._size_batch``).
MAX_BATCH = 500
BATCH_BYTES = 2 * 1024 * 1024

# Errors that mean "this read cannot succeed": stop at once instead of waiting out the deadline.
_FATAL_CODES = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
}


def partitions_of(client: Any, topic: str, timeout_s: float) -> list[int] | None:
    """Partition ids of ``topic``; None when it does not exist. Raises BrokerUnavailable.

    ``client`` is any confluent-kafka client; a consumer or producer does not auto-create the
    topic by asking (``allow.auto.create.topics`` is off for consumers).
    """
    try:
        md = client.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        raise BrokerUnavailable(f"cannot read metadata of topic {topic}: {exc}") from exc
    meta = md.topics.get(topic)
    if meta is None or meta.error is not None:
        if meta is not None and meta.error.code() not in (
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_TOPIC,
        ):
            raise BrokerUnavailable(f"metadata of topic {topic}: {meta.error.str()}")
        return None
    return sorted(meta.partitions)


def to_record(msg: Message, fmt: TopicFormat = ForeignFormat.RETRYD) -> FailedRecord:
    """``msg`` as a failed record; ``fmt`` is how its topic's dead letters are read (a foreign
    system's, or ``auto``: detected per record, see ``retryd.policy.foreign``)."""
    headers, problem = message_headers(msg)  # never raises; reads headers() once
    return FailedRecord(
        topic=msg.topic() or "",
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        timestamp=msg.timestamp()[1],
        key=msg.key(),
        value=msg.value(),
        headers=headers,
        headers_error=problem,
        format=record_format(fmt, headers),
    )


class TopicScanner:
    """One consumer reading one topic by explicit assignment; not thread-safe (use a lock).

    ``fmt`` is how that topic's dead letters are read (``to_record(msg, scanner.fmt)``)."""

    def __init__(
        self,
        common: dict[str, str],
        topic: str,
        purpose: str = "reader",
        clients: ReplayClients = KAFKA,
        fmt: TopicFormat = ForeignFormat.RETRYD,
    ) -> None:
        self.topic = topic
        self.fmt: TopicFormat = fmt
        self.consumer = clients.consumer(
            reader_config(common, purpose, **{"fetch.wait.max.ms": 50})
        )
        self.positions: dict[int, int] = {}
        self.last_scan_complete = False
        self.lock = threading.Lock()
        self._batch = 1  # until the first batch shows the records' size

    def partitions(self, timeout_s: float = 5.0) -> list[int] | None:
        return partitions_of(self.consumer, self.topic, timeout_s)

    def _size_batch(self, batch: list[Message]) -> None:
        """The client materialises every value of a ``consume()`` batch at once: size the
        next batch so that it holds about ``BATCH_BYTES`` (500 records of 1 MB were 500 MB
        per request)."""
        if not batch:
            return
        size = sum(len(m) for m in batch) // len(batch) + 64
        self._batch = max(1, min(MAX_BATCH, BATCH_BYTES // size))

    def scan(
        self,
        start: dict[int, int],
        stop: dict[int, int] | None = None,
        timeout_s: float = 10.0,
        idle_timeout_s: float | None = None,
        *,
        partial_ok: bool = False,
    ) -> Generator[Message, None, None]:
        """Yield messages of every partition in ``start`` from its offset until its current end
        (or ``stop[p]``, exclusive). ``self.positions`` always holds the next offset to read,
        updated *before* each yield, so a caller that stops after handling a message can resume
        exactly there. Raises BrokerUnavailable if nothing at all arrives within
        ``idle_timeout_s`` (default: ``timeout_s``).

        When ``timeout_s`` passes before every partition reached its end, the scan raises
        ScanIncomplete: a caller that took a cut-short read for the whole topic would decide on
        data it never saw (a ledger missing entries replays records twice). Only a caller that
        pages (``partial_ok``, e.g. browsing with ``has_more``) gets the early return, and must
        look at ``last_scan_complete``.
        """
        self.positions = dict(start)
        self.last_scan_complete = False
        active = {p for p, off in start.items() if stop is None or p not in stop or off < stop[p]}
        if not active:
            self.last_scan_complete = True
            return
        self.consumer.assign([TopicPartition(self.topic, p, start[p]) for p in sorted(active)])
        deadline = time.monotonic() + timeout_s
        idle_limit = idle_timeout_s if idle_timeout_s is not None else timeout_s
        last_progress = time.monotonic()
        last_event = {p: last_progress for p in active}
        try:
            while active:
                now = time.monotonic()
                self._end_by_watermark(active, last_event, now)
                if not active:
                    break
                if now - last_progress > idle_limit:
                    raise BrokerUnavailable(
                        f"no answer from Kafka reading {self.topic} within {idle_limit:g}s"
                    )
                if now > deadline:
                    if partial_ok:
                        return
                    raise ScanIncomplete(
                        f"reading {self.topic} did not reach its end within {timeout_s:g}s "
                        f"(stopped at {_describe_positions(self.positions)})"
                    )
                batch = self.consumer.consume(self._batch, 0.1)
                self._size_batch(batch)
                for msg in batch:
                    err = msg.error()
                    part = msg.partition()
                    if part is None or part not in active:
                        if err is not None:
                            self._on_error(err)
                        continue
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            last_progress = last_event[part] = time.monotonic()
                            self.positions[part] = max(self.positions[part], msg.offset() or 0)
                            active.discard(part)
                            continue
                        self._on_error(err)
                        continue
                    offset = msg.offset() or 0
                    last_progress = last_event[part] = time.monotonic()
                    if offset < start[part]:
                        continue  # re-read after an offset reset: not part of this scan
                    if stop is not None and part in stop and offset >= stop[part]:
                        active.discard(part)
                        continue
                    self.positions[part] = offset + 1
                    if stop is not None and part in stop and offset + 1 >= stop[part]:
                        active.discard(part)
                    yield msg
            self.last_scan_complete = True
        finally:
            self.consumer.unassign()

    def _end_by_watermark(self, active: set[int], last_event: dict[int, float], now: float) -> None:
        """A fetch at or past the end may return nothing and no end-of-partition event (some
        brokers do not report out-of-range). After a quiet second, trust the high watermark
        of the last fetch response."""
        for part in list(active):
            if now - last_event[part] < QUIET_END_S:
                continue
            _, high = self.consumer.get_watermark_offsets(
                TopicPartition(self.topic, part), cached=True
            )
            if high >= 0 and self.positions[part] >= high:
                active.discard(part)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal() or err.code() in _FATAL_CODES:
            raise BrokerUnavailable(f"reading {self.topic}: {err.str()}")
        log.debug("reading %s: %s", self.topic, err.str())

    def read_one(self, partition: int, offset: int, timeout_s: float = 10.0) -> Message | None:
        """The record at exactly ``partition``/``offset``, or None if there is none."""
        for msg in self.scan({partition: offset}, {partition: offset + 1}, timeout_s):
            return msg if msg.offset() == offset else None
        return None

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.consumer.close()


def _describe_positions(positions: dict[int, int], limit: int = 8) -> str:
    shown = ", ".join(f"{p}@{o}" for p, o in sorted(positions.items())[:limit])
    return shown + (", ..." if len(positions) > limit else "")


class ScannerPool:
    """A few reusable scanners for request handlers (a consumer costs a connection).

    A scanner assigns its partitions explicitly for each scan, so the same consumers serve
    every topic a request may read (``acquire(topic=...)``, e.g. an error route's dead-letter
    topic): the pool's size bounds the reads of all of them together. ``formats`` names the
    topics whose dead letters another system wrote (``foreign_dead_letters``): a scanner of
    one reads its records through that mapping."""

    def __init__(
        self,
        common: dict[str, str],
        topic: str,
        purpose: str,
        size: int = 4,
        clients: ReplayClients = KAFKA,
        formats: Mapping[str, TopicFormat] | None = None,
    ) -> None:
        self.common = common
        self.formats: dict[str, TopicFormat] = dict(formats or {})
        self.clients = clients
        self.topic = topic
        self.purpose = purpose
        self._free: list[TopicScanner] = []
        self._sem = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._closed = False

    def acquire(self, timeout_s: float = 10.0, topic: str | None = None) -> TopicScanner:
        """A scanner reading ``topic`` (default: the pool's topic)."""
        if not self._sem.acquire(timeout=timeout_s):
            raise BrokerUnavailable("all topic readers are busy; try again shortly")
        name = topic or self.topic
        fmt = self.formats.get(name, ForeignFormat.RETRYD)
        with self._lock:
            if self._free:
                scanner = self._free.pop()
                scanner.topic = name
                scanner.fmt = fmt
                return scanner
        try:
            return TopicScanner(self.common, name, self.purpose, self.clients, fmt)
        except Exception:
            self._sem.release()
            raise

    def release(self, scanner: TopicScanner, broken: bool = False) -> None:
        with self._lock:
            if broken or self._closed:
                scanner.close()
            else:
                self._free.append(scanner)
        self._sem.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for scanner in free:
            scanner.close()
