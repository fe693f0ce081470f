"""Reading what happened, incrementally: the handlers' call log, ``failed_topic``, and the
group's committed offsets. A scenario polls these until every id has a terminal place and the
group has committed everything (nothing left to redo), so duplicates are counted at rest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from tests.chaos.ledger import Reconciliation, Spec, Tally, reconcile
from tests.support import unique


class CallLog:
    """Tails the append-only JSON-line call log (a line cut by a SIGKILL cannot exist: each is
    one write; a line still being written is left for the next read)."""

    def __init__(self, path: Path, digests: Mapping[str, str] | None = None) -> None:
        self.path = path
        self.digests = digests or {}
        self._offset = 0

    def read_new(self, tally: Tally) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        n = 0
        for line in data[:end].splitlines():
            if line.strip():
                entry = json.loads(line)
                tally.call(entry, self.digests.get(str(entry.get("id"))))
                n += 1
        return n


class DeadLetters:
    """A group-less reader of ``failed_topic`` that keeps its position between reads."""

    def __init__(self, bootstrap: str, topic: str, ident: Callable[[bytes | None], str]) -> None:
        self.topic = topic
        self.ident = ident
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": unique("chaos-dead"),
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                "log_level": 2,  # the broker-cut scenario cuts this reader's connections too
            }
        )
        md = self._consumer.list_topics(topic, timeout=15).topics[topic]
        # assigning no partition would read nothing, for good (see support.wait_for_topics)
        assert md.error is None and md.partitions, f"{topic}: no partitions in the metadata"
        self._parts = sorted(md.partitions)
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self._parts])
        self._at_end: set[int] = set()

    def read_new(self, tally: Tally, timeout_s: float = 30.0) -> int:
        """Read what arrived since the last call. A partition counts as read once it reported
        its end (librdkafka reports the end once per catch-up, so a partition with nothing new
        stays "at end" until a record arrives)."""
        n = 0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = self._consumer.consume(1000, 0.2)
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        self._at_end.add(msg.partition())
                    continue
                self._at_end.discard(msg.partition())
                reason = None
                for name, value in msg.headers() or ():
                    if name == "retryd_dead_reason":
                        reason = (value or b"").decode("utf-8", "replace")
                tally.dead_letter(self.ident(msg.value()), reason)
                n += 1
            if not batch and len(self._at_end) == len(self._parts):
                break
        return n

    def positions(self) -> list[int]:
        return [
            tp.offset
            for tp in self._consumer.position([TopicPartition(self.topic, p) for p in self._parts])
        ]

    def close(self) -> None:
        self._consumer.close()


def id_from_json(value: bytes | None) -> str:
    try:
        return str(json.loads(value or b"{}").get("id"))
    except (ValueError, AttributeError):
        return "?"


def partitions_behind(bootstrap: str, group: str, topics: Iterable[str]) -> int:
    """Partitions of ``topics`` holding records past the group's committed offset (0: nothing
    left to redo).

    Read, not computed from watermarks: transaction markers (exactly-once routing, the
    ledger's writers) take offsets too, so "committed < high watermark" can hold with no
    record left to redo.
    """
    meta = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        parts = []
        for topic in topics:
            md = meta.list_topics(topic, timeout=15).topics[topic]
            parts += [TopicPartition(topic, p) for p in md.partitions]
        committed = meta.committed(parts, timeout=15)
    finally:
        meta.close()
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("chaos-behind"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        reader.assign(
            [
                TopicPartition(
                    tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                )
                for tp in committed
            ]
        )
        open_parts = {(tp.topic, tp.partition) for tp in committed}
        behind = 0
        deadline = time.monotonic() + 60
        while open_parts and time.monotonic() < deadline:
            for msg in reader.consume(100, 0.2):
                where = (msg.topic(), msg.partition())
                if where not in open_parts:
                    continue
                err = msg.error()
                if err is None:
                    behind += 1  # a record past the committed offset
                elif err.code() != KafkaError._PARTITION_EOF:
                    continue
                open_parts.discard(where)
        return behind + len(open_parts)
    finally:
        reader.close()


class Observer:
    """The call log(s) and ``failed_topic`` of one scenario, tallied against its plan."""

    def __init__(
        self,
        plan: list[Spec],
        logs: list[CallLog],
        dead: DeadLetters,
        bootstrap: str,
        group: str,
        topics: list[str],
    ) -> None:
        self.plan = plan
        self.logs = logs
        self.dead = dead
        self.bootstrap = bootstrap
        self.group = group
        self.topics = topics
        self.tally = Tally()
        # what settling met: partitions_behind's failures, and where missing ids were found
        self.notes: list[str] = []

    def refresh(self) -> Reconciliation:
        for log in self.logs:
            log.read_new(self.tally)
        self.dead.read_new(self.tally)
        return reconcile(self.plan, self.tally)

    def settle(self, timeout_s: float, *, interval_s: float = 1.0) -> tuple[Reconciliation, int]:
        """Wait until every id has a terminal place and no partition holds records past the
        group's committed offset (or the deadline); returns the reconciliation and the
        partitions still behind (-1: not measured, ids still missing). Never raises on the
        deadline: the caller reports first, then asserts."""
        deadline = time.monotonic() + timeout_s
        while True:
            rec = self.refresh()
            behind = -1
            if not rec.lost:
                try:
                    behind = partitions_behind(self.bootstrap, self.group, self.topics)
                except KafkaException as exc:
                    # a metadata or offset-fetch timeout on a busy machine is a failed
                    # measurement, not a verdict: measure again until the deadline
                    self.notes.append(str(exc))
            if behind == 0 or time.monotonic() > deadline:
                if rec.lost:
                    self.notes.append(self._explain_missing(rec.lost))
                return rec, behind
            time.sleep(interval_s)  # polling interval of a condition wait, not synchronisation

    def _explain_missing(self, missing: list[str]) -> str:
        """Where a fresh read (as ``final`` makes it) finds ids the incremental readers still
        miss: tells a stuck message from a reader that lost track."""
        fresh = self._fresh_tally(timeout_s=60)
        found = [
            f"{i}: fresh handled={fresh.handled.get(i, 0)} dead={fresh.dead.get(i, 0)}"
            for i in missing[:5]
        ]
        logs = [
            f"{log.path.name} read to {log._offset} of {log.path.stat().st_size}"
            for log in self.logs
        ]
        return (
            f"{len(missing)} ids missing at the deadline ({'; '.join(found)}); "
            f"{'; '.join(logs)}; dead-letter reader at end of {sorted(self.dead._at_end)} "
            f"of {self.dead._parts}, positions {self.dead.positions()}"
        )

    def final(self) -> Reconciliation:
        """Everything read again from the start by fresh readers: the numbers of the report."""
        return reconcile(self.plan, self._fresh_tally(timeout_s=120))

    def _fresh_tally(self, timeout_s: float) -> Tally:
        """The call logs and ``failed_topic`` read from the start by new readers."""
        tally = Tally()
        for log in self.logs:
            CallLog(log.path, log.digests).read_new(tally)
        reader = DeadLetters(self.bootstrap, self.dead.topic, self.dead.ident)
        try:
            reader.read_new(tally, timeout_s=timeout_s)
        finally:
            reader.close()
        return tally

    def close(self) -> None:
        self.dead.close()
