"""Bulk replays interrupted between a copy and its ledger entry.

A replay writes the copy, then its ledger entry (``retryd.replay.ledger``). A job whose process
dies between the two (SIGKILL, out of memory, a lost host) leaves copies the ledger does not
know, and the next job would replay those records a second time. Graceful shutdown cannot help
there, so the ledger itself carries what is needed to repair it:

- before its first copy, a job writes a *job marker* (acknowledged before it goes on): its id
  and, for every target partition, the offset from which its copies can appear (the end of
  the partition at that moment). While it runs it refreshes the marker's heartbeat; once every
  copy's entry is acknowledged it deletes the marker (a tombstone).
- every job, before it decides anything, ``recover``\\ s the markers of other jobs that did not
  finish: it reads their targets from the marked offsets to the current end and records in
  the ledger each copy carrying that job's ``retryd_replay_id`` whose failed record has no
  entry. Those records then count as replayed, which they were.

Scanning is bounded by what the targets received since the interrupted job began (markers
advance to where recovery read). A marker whose heartbeat is older than ``STALE_S`` after a
recovery belongs to a job that is gone: it is deleted. A marker of a job still running in
another process is only advanced, never deleted, so recovering it is harmless: every copy it
records exists, and the live job writes the same entries itself.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from confluent_kafka import KafkaException, TopicPartition

from retryd.policy.headers import REPLAY_ID, REPLAYED_FROM, header_value, message_headers
from retryd.replay.clients import KAFKA, ReplayClients
from retryd.replay.errors import BrokerUnavailable
from retryd.replay.ledger import LedgerEntry, LedgerError, ReplayLedger
from retryd.replay.scan import TopicScanner

log = logging.getLogger(__name__)

MARKER_EVERY_S = 10.0  # a running job refreshes its marker this often
STALE_S = 60.0  # a marker not refreshed for this long belongs to a job that stopped


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class JobMarker:
    job_id: str
    starts: dict[str, dict[int, int]]  # target topic -> partition -> first offset to read
    beat_ms: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "v": 1,
                "job_id": self.job_id,
                "starts": {t: {str(p): o for p, o in ps.items()} for t, ps in self.starts.items()},
                "beat_ms": self.beat_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> JobMarker | None:
        try:
            data = json.loads(raw)
            starts = {
                str(t): {int(p): int(o) for p, o in ps.items()} for t, ps in data["starts"].items()
            }
            return cls(str(data["job_id"]), starts, int(data["beat_ms"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def partition_ends(
    common: dict[str, str], topic: str, timeout_s: float, clients: ReplayClients = KAFKA
) -> dict[int, int]:
    """The current end of every partition of ``topic`` (where new copies will land)."""
    scanner = TopicScanner(common, topic, "replay-marker", clients)
    try:
        parts = scanner.partitions(timeout_s)
        if parts is None:
            return {}
        ends = {}
        for p in parts:
            try:
                _, high = scanner.consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=timeout_s
                )
            except KafkaException as exc:
                raise BrokerUnavailable(f"cannot read the end of {topic}[{p}]: {exc}") from exc
            ends[p] = max(0, high)
        return ends
    finally:
        scanner.close()


def begin(
    ledger: ReplayLedger, common: dict[str, str], job_id: str, targets: set[str], timeout_s: float
) -> JobMarker:
    """Announce a job before its first copy; the marker is acknowledged when this returns."""
    marker = JobMarker(
        job_id,
        {t: partition_ends(common, t, timeout_s, ledger.clients) for t in sorted(targets)},
        _now_ms(),
    )
    ledger.write_marker(job_id, marker.to_json(), wait=True)
    return marker


def beat(ledger: ReplayLedger, marker: JobMarker) -> None:
    """Refresh a running job's heartbeat (asynchronous)."""
    marker.beat_ms = _now_ms()
    ledger.write_marker(marker.job_id, marker.to_json(), wait=False)


def finish(ledger: ReplayLedger, marker: JobMarker) -> None:
    """Every copy of the job has its entry: delete the marker (acknowledged on return)."""
    ledger.write_marker(marker.job_id, None, wait=True)


def recover(
    ledger: ReplayLedger, common: dict[str, str], timeout_s: float, *, own_job: str = ""
) -> int:
    """Record the copies of unfinished jobs that the ledger lacks; returns how many. Call right
    after ``ledger.refresh()``. Raises LedgerError or BrokerUnavailable when a target cannot be
    read to its end (deciding without it could replay a record twice)."""
    recovered = 0
    for job_id, raw in sorted(ledger.markers().items()):
        if job_id == own_job:
            continue
        marker = JobMarker.from_json(raw)
        if marker is None:
            log.warning("ignoring an unreadable job marker for %s in the ledger", job_id)
            continue
        advanced: dict[str, dict[int, int]] = {}
        for topic, starts in marker.starts.items():
            found, advanced[topic] = _recover_topic(
                ledger, common, marker, topic, starts, timeout_s
            )
            recovered += found
        stale = _now_ms() - marker.beat_ms > STALE_S * 1000
        if stale:
            ledger.write_marker(job_id, None, wait=True)
        else:
            ledger.write_marker(
                job_id, JobMarker(job_id, advanced, marker.beat_ms).to_json(), wait=True
            )
    return recovered


def _recover_topic(
    ledger: ReplayLedger,
    common: dict[str, str],
    marker: JobMarker,
    topic: str,
    starts: dict[int, int],
    timeout_s: float,
) -> tuple[int, dict[int, int]]:
    scanner = TopicScanner(common, topic, "replay-recovery", ledger.clients)
    found = 0
    try:
        parts = scanner.partitions(timeout_s)
        if parts is None:
            return 0, starts  # the target is gone: nothing of it can be replayed again
        start = {p: starts.get(p, 0) for p in parts}
        for msg in scanner.scan(
            start, timeout_s=max(timeout_s * 30, 300), idle_timeout_s=timeout_s
        ):
            headers, _ = message_headers(msg)  # never raises (names that are not UTF-8)
            replay_id = header_value(headers, REPLAY_ID)
            replayed_from = header_value(headers, REPLAYED_FROM)
            if replay_id is None or replayed_from is None:
                continue
            if replay_id.decode("utf-8", "replace") != marker.job_id:
                continue
            coord = replayed_from.decode("utf-8", "replace")
            if ledger.is_replayed(coord):
                continue
            ledger.record(
                coord,
                LedgerEntry(
                    replay_id=marker.job_id,
                    target_topic=topic,
                    target_partition=msg.partition(),
                    target_offset=msg.offset(),
                    replayed_at_ms=msg.timestamp()[1],
                    by="recovered: the job was interrupted before this entry was written",
                ),
            )
            found += 1
            log.warning(
                "replay job %s was interrupted after replaying %s to %s[%s]@%s: entry recovered",
                marker.job_id,
                coord,
                topic,
                msg.partition(),
                msg.offset(),
            )
        if not scanner.last_scan_complete:
            raise LedgerError(f"could not read {topic} to its end to recover job {marker.job_id}")
        return found, dict(scanner.positions)
    finally:
        scanner.close()
