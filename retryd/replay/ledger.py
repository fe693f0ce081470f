"""The replay ledger: which failed records were replayed, kept in a compacted Kafka topic.

It is how the sidecar's HTTP API, ``retryd replay`` and the Spark pipeline agree that a failed
record is replayed at most once (unless forced), across restarts and across processes.

Record format (one per replayed failed record; compaction keeps the latest per key):

- key: ``"<failed_topic>/<partition>/<offset>"`` of the failed record (UTF-8), see ``Coord``.
- value: JSON ``{"v": 1, "replay_id", "target_topic", "target_partition", "target_offset",
  "replayed_at_ms", "forced", "by"}``. A value that does not parse still counts as replayed
  (fail safe: never replay twice because of a bad ledger record).
- *job markers* (``retryd.replay.recovery``): key ``"#job/<job id>"`` (``#`` never occurs in a
  topic name, so a marker is never a record's key), value the JSON of a bulk job still running
  or interrupted; a tombstone once the job finished. Kept apart from the entries (``markers``).

API::

    ledger = ReplayLedger(settings.kafka_common(), settings.ledger_topic)
    ledger.ensure_topic()                 # optional: create it (1 partition, compacted) if missing
    ledger.refresh()                      # read to the end (or raise): call right before deciding
    entry = ledger.get(coord)             # LedgerEntry | None; ledger.is_replayed(coord) -> bool
    ledger.record(coord, LedgerEntry(...))  # produce with acks=all, wait; returns the ledger offset
    ledger.record_async(coord, entry, on_done)  # bulk: on_done(err, offset) from ledger.poll()/
    ledger.flush()                              # flush(); the entry is visible once acknowledged
    ledger.competing_writes(coord, entry)  # after record(): other replays of it that raced ours
    with ledger.claim(coord): ...         # in-process mutual exclusion (try_claim/release: bulk)
    ledger.close()

``coord`` is a ``retryd.replay.records.Coord`` (or its ``"topic/partition/offset"`` string).

Ordering contract for a replay: produce the replayed copy and wait for its ack, *then* write
the ledger record and wait for its ack; only then does the replay count. If the ledger write
fails the copy exists but is not remembered: the record may be replayed again (at-least-once,
never lost). For bulk jobs, a process that dies between the two writes is covered by the job
markers: the next job finds the copies an interrupted job left without entries and records
them (``retryd.replay.recovery``).

Reading: ``refresh`` either reads every partition to its current end or raises
(``LedgerIncomplete`` when its deadline passed first, ``BrokerUnavailable`` when Kafka does not
answer). A cut-short read is never taken for the whole ledger: a record whose entry was not read
would look "not replayed" and be replayed twice. What a cut-short read did get is kept, so the
next ``refresh`` continues from there (a large ledger is read to its end over a few calls).

Size: one compacted record (about 250 bytes: key plus JSON value) per distinct failed record
that was ever replayed, and about 470 bytes of memory per entry in every process holding a view.
Nothing expires on its own; a tombstone (null value) for a key forgets that entry (README: the
replay ledger).

Concurrency: within one process callers serialise "refresh, decide, produce, record" per
record (``ReplayLedger.claim``). Across processes (two sidecars, a sidecar and Spark) each
refreshes right before deciding; what remains is the window between one process's refresh
and the other's ledger write becoming visible (the produce round trips, typically a few ms):
two processes deciding about the same record inside it both replay it. ``competing_writes``
detects this afterwards (the single-record API reports it as ``concurrent_replays``) but cannot
undo it. Bulk jobs refresh once per second rather than per record, so for them the window is
up to a second plus the round trips. Closing the window fully would need a lease or
transactional fencing; a duplicate replay is the at-least-once outcome the rest of retryd
already tolerates.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import NewTopic

from retryd.errors import RetrydError
from retryd.kafka.clients import admin_config, producer_config
from retryd.replay.clients import KAFKA, ReplayClients
from retryd.replay.errors import BrokerUnavailable, LedgerMisconfigured, ScanIncomplete
from retryd.replay.records import Coord
from retryd.replay.scan import TopicScanner

log = logging.getLogger(__name__)

MARKER_PREFIX = "#job/"


class LedgerError(RetrydError):
    """The ledger could not be read or written."""


class LedgerIncomplete(LedgerError):
    """The ledger could not be read to its end in time: no decision may be taken from it."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    replay_id: str
    target_topic: str | None = None
    target_partition: int | None = None
    target_offset: int | None = None
    replayed_at_ms: int = 0
    forced: bool = False
    by: str = ""

    def to_json(self) -> bytes:
        return json.dumps({"v": 1, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | None) -> LedgerEntry:
        try:
            data = json.loads(raw or b"")
            return cls(
                replay_id=str(data["replay_id"]),
                target_topic=data.get("target_topic"),
                target_partition=data.get("target_partition"),
                target_offset=data.get("target_offset"),
                replayed_at_ms=int(data.get("replayed_at_ms") or 0),
                forced=bool(data.get("forced")),
                by=str(data.get("by") or ""),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(replay_id="unknown", by="unparsable ledger record")


class ReplayLedger:
    """In-memory view of the ledger topic, refreshed on demand; thread-safe."""

    def __init__(
        self,
        common: dict[str, str],
        topic: str,
        *,
        replication_factor: int = -1,
        timeout_s: float = 10.0,
        delivery_timeout_s: float | None = None,
        clients: ReplayClients = KAFKA,
    ) -> None:
        """``timeout_s`` bounds each wait for Kafka (a read is abandoned after 3x that);
        ``delivery_timeout_s`` (librdkafka ``message.timeout.ms``) bounds how long a ledger
        write may stay unacknowledged, so a caller waiting for every outcome (sidecar shutdown)
        waits a known time. None keeps librdkafka's default."""
        self.common = common
        self.topic = topic
        self.clients = clients  # every other replay part of this composition uses them too
        self.replication_factor = replication_factor
        self.timeout_s = timeout_s
        self.delivery_timeout_s = delivery_timeout_s
        self._entries: dict[str, LedgerEntry] = {}
        self._markers: dict[str, bytes] = {}  # job id -> marker JSON (unfinished jobs)
        self._positions: dict[int, int] = {}
        self._scanner: TopicScanner | None = None
        self._producer: Producer | None = None
        self._lock = threading.RLock()
        self._claims: set[str] = set()
        self._claims_cond = threading.Condition()

    # ------------------------------------------------------------------ reading
    def ensure_topic(self) -> None:
        """Create the ledger topic (1 partition, cleanup.policy=compact) if it is missing;
        refuse an existing one that is not compacted (LedgerMisconfigured): with deletion by
        retention its entries expire and the records they protect can be replayed again."""
        from retryd.kafka.topics import CLEANUP_POLICY, LEDGER_PARTITIONS, topic_configs

        admin = self.clients.admin(admin_config(self.common, "ledger"))
        try:
            existing = admin.list_topics(timeout=self.timeout_s).topics
        except KafkaException as exc:
            raise BrokerUnavailable(f"cannot list topics: {exc}") from exc
        if self.topic in existing:
            from retryd.errors import KafkaSetupError
            from retryd.kafka.topics import ledger_policy_problem

            try:
                config = topic_configs(admin, [self.topic], self.timeout_s).get(self.topic, {})
            except KafkaSetupError as exc:
                raise BrokerUnavailable(str(exc)) from exc
            problem = ledger_policy_problem(self.topic, config.get(CLEANUP_POLICY))
            if problem is not None:
                raise LedgerMisconfigured(problem)
            return
        new = NewTopic(
            self.topic,
            LEDGER_PARTITIONS,
            self.replication_factor,
            config={CLEANUP_POLICY: "compact"},
        )
        future = admin.create_topics([new], operation_timeout=self.timeout_s)[self.topic]
        try:
            future.result(self.timeout_s + 5)
            log.info("created replay ledger topic %s", self.topic)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise LedgerError(f"cannot create ledger topic {self.topic}: {exc}") from exc

    def refresh(self, timeout_s: float | None = None) -> int:
        """Read every ledger record written since the last refresh; returns how many."""
        timeout = timeout_s or self.timeout_s
        with self._lock:
            if self._scanner is None:
                self._scanner = TopicScanner(self.common, self.topic, "ledger", self.clients)
            scanner = self._scanner
            parts = scanner.partitions(timeout)
            if parts is None:
                raise LedgerError(
                    f"ledger topic {self.topic} does not exist: run 'retryd topics create'"
                )
            start = {p: self._positions.get(p, 0) for p in parts}
            count = 0
            try:
                for msg in scanner.scan(start, timeout_s=timeout * 3, idle_timeout_s=timeout):
                    self._apply(msg)
                    count += 1
            except ScanIncomplete as exc:
                self._positions.update(scanner.positions)  # keep what was read: resume there
                raise LedgerIncomplete(
                    f"the replay ledger {self.topic} could not be read to its end in time "
                    f"({count} new entries read, {len(self._entries)} known); try again: {exc}"
                ) from exc
            if any(scanner.positions[p] < start[p] for p in parts):
                raise LedgerError(f"ledger topic {self.topic} went backwards (recreated?)")
            self._positions.update(scanner.positions)
            return count

    def _apply(self, msg: Message) -> None:
        key = (msg.key() or b"").decode("utf-8", errors="replace")
        if key.startswith(MARKER_PREFIX):
            job_id = key[len(MARKER_PREFIX) :]
            value = msg.value()
            if value is None:
                self._markers.pop(job_id, None)
            else:
                self._markers[job_id] = value
            return
        if msg.value() is None:
            self._entries.pop(key, None)  # tombstone: forgotten
        else:
            self._entries[key] = LedgerEntry.from_json(msg.value())

    def get(self, coord: Coord | str) -> LedgerEntry | None:
        with self._lock:
            return self._entries.get(str(coord))

    def is_replayed(self, coord: Coord | str) -> bool:
        return self.get(coord) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def markers(self) -> dict[str, bytes]:
        """Job markers as of the last refresh or write: job id -> marker JSON."""
        with self._lock:
            return dict(self._markers)

    def write_marker(self, job_id: str, value: bytes | None, *, wait: bool) -> None:
        """Write (or, with ``value=None``, delete) a job's marker; with ``wait``, return only
        once the broker acknowledged it (raises LedgerError otherwise)."""
        key = MARKER_PREFIX + job_id
        producer = self._get_producer()
        result: list[KafkaError | None] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                with self._lock:
                    if value is None:
                        self._markers.pop(job_id, None)
                    else:
                        self._markers[job_id] = value
            result.append(err)

        while True:
            try:
                producer.produce(self.topic, key=key.encode(), value=value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        if not wait:
            return
        deadline = time.monotonic() + self.timeout_s * 3
        while not result and time.monotonic() < deadline:
            self.poll(0.05)
        if not result:
            raise LedgerError(f"ledger marker for job {job_id} not acknowledged in time")
        if result[0] is not None:
            raise LedgerError(f"ledger marker for job {job_id} failed: {result[0].str()}")

    # ------------------------------------------------------------------ writing
    def _get_producer(self) -> Producer:
        with self._lock:
            if self._producer is None:
                tuning: dict[str, Any] = {"linger.ms": 2, "log_level": 3}
                if self.delivery_timeout_s is not None:
                    tuning["message.timeout.ms"] = int(self.delivery_timeout_s * 1000)
                self._producer = self.clients.producer(
                    producer_config(self.common, "ledger", **tuning)
                )
            return self._producer

    def record_async(
        self,
        coord: Coord | str,
        entry: LedgerEntry,
        on_done: Callable[[KafkaError | None, int | None], None],
    ) -> None:
        """Produce one ledger record; ``on_done(error, ledger_offset)`` runs from ``poll``/
        ``flush`` once the broker acknowledged it (acks=all) or gave up."""
        key = str(coord)
        producer = self._get_producer()

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                with self._lock:
                    self._entries[key] = entry
            on_done(err, None if err is not None else msg.offset())

        while True:
            try:
                producer.produce(
                    self.topic, key=key.encode(), value=entry.to_json(), on_delivery=delivered
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)

    def poll(self, timeout_s: float = 0) -> None:
        if self._producer is not None:
            self._producer.poll(timeout_s)

    def flush(self, timeout_s: float | None = None) -> int:
        """Wait for outstanding ledger writes; returns how many are still not acknowledged."""
        if self._producer is None:
            return 0
        return int(self._producer.flush(timeout_s or self.timeout_s * 3))

    def record(self, coord: Coord | str, entry: LedgerEntry) -> int:
        """Write one ledger record and wait for acks=all; returns its ledger offset."""
        result: list[tuple[KafkaError | None, int | None]] = []
        self.record_async(coord, entry, lambda err, off: result.append((err, off)))
        deadline = time.monotonic() + self.timeout_s * 3
        while not result and time.monotonic() < deadline:
            self.poll(0.05)
        if not result:
            raise LedgerError(f"ledger write for {coord} not acknowledged in time")
        err, offset = result[0]
        if err is not None:
            raise LedgerError(f"ledger write for {coord} failed: {err.str()}")
        assert offset is not None
        return offset

    def competing_writes(self, coord: Coord | str, mine: LedgerEntry) -> list[LedgerEntry]:
        """After ``record``: other replays of the same record that reached the ledger since our
        last refresh (the cross-process race described in the module docstring)."""
        key = str(coord).encode()
        found: list[LedgerEntry] = []
        with self._lock:
            if self._scanner is None:
                return found
            parts = self._scanner.partitions(self.timeout_s) or []
            start = {p: self._positions.get(p, 0) for p in parts}
            for msg in self._scanner.scan(start, timeout_s=self.timeout_s):
                self._apply(msg)
                if msg.key() == key and msg.value() is not None:
                    other = LedgerEntry.from_json(msg.value())
                    if other.replay_id != mine.replay_id:
                        found.append(other)
            self._positions.update(self._scanner.positions)
            self._entries[str(coord)] = mine  # our write is the one we know landed last
        return found

    @contextmanager
    def claim(self, coord: Coord | str, timeout_s: float = 30.0) -> Iterator[None]:
        """Serialise deciding about one record inside this process (see module docstring)."""
        key = str(coord)
        deadline = time.monotonic() + timeout_s
        with self._claims_cond:
            while key in self._claims:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LedgerError(f"record {key} is being replayed by another request")
                self._claims_cond.wait(left)
            self._claims.add(key)
        try:
            yield
        finally:
            with self._claims_cond:
                self._claims.discard(key)
                self._claims_cond.notify_all()

    def try_claim(self, coord: Coord | str) -> bool:
        """Non-blocking claim for bulk jobs; release with ``release``."""
        with self._claims_cond:
            if str(coord) in self._claims:
                return False
            self._claims.add(str(coord))
            return True

    def release(self, coord: Coord | str) -> None:
        with self._claims_cond:
            self._claims.discard(str(coord))
            self._claims_cond.notify_all()

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.flush(5)
                self._producer = None
            if self._scanner is not None:
                self._scanner.close()
                self._scanner = None

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"entries": len(self._entries), "positions": dict(self._positions)}
