"""The executor side of ``retryd spark replay``: one task replays its share of the rows.

Per row: re-check the ledger (unless forced), take a token from this task's bucket, produce
the copy; when the broker acknowledges the copy, write its ledger record with
``ReplayLedger.record_async``; the replay counts when that record is acknowledged too.
This is the ordering contract of ``retryd.replay.ledger``. A copy the target refuses for its
size is skipped (``too_large``, ``retryd.replay.copies``) and the task goes on.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from retryd.kafka.clients import new_producer
from retryd.policy.foreign import ForeignFormat, parse_format, record_format
from retryd.replay.copies import CopyOutcome, CopyProducer
from retryd.replay.jobs import LEDGER_REFRESH_S, TokenBucket
from retryd.replay.ledger import ReplayLedger
from retryd.replay.records import FailedRecord
from retryd.replay.replayer import replay_producer_config, send_replay_copy

log = logging.getLogger(__name__)
MAX_ERRORS = 20


@dataclass(frozen=True)
class TaskSpec:
    """What every task needs; pickled into the Spark closure."""

    kafka_conf: dict[str, str]
    ledger_topic: str
    replay_id: str
    partitions: dict[str | None, int]  # allowed target topic -> partition count
    rate_per_task: float
    force: bool
    timeout_s: float = 10.0
    foreign: str = "retryd"  # how the rows' dead letters are read (foreign_dead_letters)


class _Task:
    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.by = f"spark@{socket.gethostname()}"
        self.ledger = ReplayLedger(spec.kafka_conf, spec.ledger_topic, timeout_s=spec.timeout_s)
        self.producer = CopyProducer(new_producer, replay_producer_config(dict(spec.kafka_conf)))
        self.bucket = TokenBucket(spec.rate_per_task)
        self.never = threading.Event()
        self.inflight = 0
        self.replayed = 0
        self.failed = 0
        self.skipped: Counter[str] = Counter()
        self.by_target: Counter[str] = Counter()
        self.errors: list[str] = []

    def error(self, text: str) -> None:
        log.error("%s", text)
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(text)

    def idle(self, seconds: float) -> None:
        self.producer.poll(seconds)
        self.ledger.poll(0)

    def send(self, rec: FailedRecord, target: str, forced: bool) -> None:
        def done(outcome: CopyOutcome) -> None:
            self.inflight -= 1
            if outcome.replayed:
                self.replayed += 1
                self.by_target[target] += 1
            elif outcome.skipped is not None:  # nothing written, no ledger entry
                self.skipped[outcome.skipped] += 1
            else:
                self.failed += 1
                self.error(outcome.error or "failed")

        self.inflight += 1
        send_replay_copy(
            self.producer,
            self.ledger,
            rec,
            target,
            self.spec.partitions[target],
            replay_id=self.spec.replay_id,
            forced=forced,
            by=self.by,
            on_done=done,
            idle=self.idle,
        )

    def drain(self) -> None:
        deadline = time.monotonic() + self.spec.timeout_s * 6
        while self.inflight > 0 and time.monotonic() < deadline:
            self.producer.poll(0.05)
            self.ledger.poll(0.05)
        if self.inflight > 0:
            self.failed += self.inflight
            self.error(f"{self.inflight} replay(s) not acknowledged in time (outcome unknown)")
            self.inflight = 0

    def summary(self) -> dict[str, Any]:
        return {
            "replayed": self.replayed,
            "failed": self.failed,
            "skipped": dict(self.skipped),
            "by_target": dict(self.by_target),
            "errors": self.errors,
        }


def to_record(row: Any, foreign: str = "retryd") -> FailedRecord:
    """A row as a failed record; ``foreign`` (a foreign_dead_letters format, or ``retryd``)
    says how its headers are read: a replayed copy then leaves the foreign ones behind."""
    headers = [
        (h["key"], None if h["value"] is None else bytes(h["value"])) for h in row["headers"]
    ]
    return FailedRecord(
        topic=row["topic"],
        partition=row["partition"],
        offset=row["offset"],
        timestamp=row["ts_ms"] if row["ts_ms"] is not None else -1,
        key=None if row["key"] is None else bytes(row["key"]),
        value=None if row["value"] is None else bytes(row["value"]),
        headers=headers,
        format=record_format(
            ForeignFormat.RETRYD if foreign == "retryd" else parse_format(foreign), headers
        ),
    )


def replay_partition(spec: TaskSpec, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
    """Replay the rows of one Spark partition; yields one summary dict."""
    task = _Task(spec)
    try:
        task.ledger.refresh()
        last_refresh = time.monotonic()
        for row in rows:
            rec = to_record(row, spec.foreign)
            target = row["target"]
            if time.monotonic() - last_refresh > LEDGER_REFRESH_S:
                task.ledger.refresh()  # the sidecar may have replayed some meanwhile
                last_refresh = time.monotonic()
            if rec.nothing_to_replay is not None:  # a share group's headers-only DLQ record
                task.skipped["no_payload"] += 1
                continue
            known = task.ledger.is_replayed(rec.coord)
            if known and not spec.force:
                task.skipped["already_replayed"] += 1
                continue
            task.bucket.take(task.never, task.idle)
            task.send(rec, target, forced=known)
        task.drain()
    finally:
        task.ledger.close()
        task.producer.flush(spec.timeout_s)
    yield task.summary()
