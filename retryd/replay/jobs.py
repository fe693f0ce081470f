"""Bulk replay jobs: a counting pass, then a rate-limited replay pass in a background thread.

The counting pass reads ``failed_topic`` (or the error route's dead-letter topic the spec
names) to its current end and fixes the job's *snapshot* (end offset per partition): records
dead-lettered after the job started are not part of it, so a job replays exactly the set it
matched. A counting pass that cannot reach that end within
``count_timeout_s`` fails the job before anything is replayed (never a silent partial snapshot).
Progress (matched, replayed, skipped, failed, rate, ETA, position) is readable at any time; a
copy the target refuses for its size is skipped (``too_large``, ``retryd.replay.copies``) and
the job goes on;
``cancel`` stops it after the records in flight have a definite outcome: every copy acknowledged
is also in the ledger (or counted failed), so the counts and the position it reports are exact
and a shutdown never leaves a copy without its ledger entry. Each replayed record writes an
audit line (``retryd.audit``) naming the job's actor.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException

from retryd.policy.foreign import ForeignFormat, TopicFormat
from retryd.replay import audit, recovery
from retryd.replay.copies import (
    CopyOutcome,
    CopyProducer,
    effective_delivery_timeout_s,
    replay_producer_config,
    send_replay_copy,
    who,
)
from retryd.replay.errors import (
    BrokerUnavailable,
    InvalidTarget,
    NothingToReplay,
    ReplayError,
    ScanIncomplete,
    TargetRefused,
    TargetReserved,
)
from retryd.replay.job_progress import JobProgress, JobSpec, rate_per_second, render_snapshot
from retryd.replay.ledger import LedgerEntry, LedgerError, ReplayLedger
from retryd.replay.ratelimit import SharedRateLimit, TokenBucket
from retryd.replay.records import FailedRecord
from retryd.replay.scan import TopicScanner, to_record
from retryd.replay.targets import TargetPolicy
from retryd.tracing import NO_TRACING, Tracing

# Re-exported for existing importers.
__all__ = ["LEDGER_REFRESH_S", "JobProgress", "JobSpec", "ReplayJob", "TokenBucket"]

log = logging.getLogger(__name__)

LEDGER_REFRESH_S = 1.0
MAX_ERRORS_KEPT = 20
COUNT_TIMEOUT_S = 3600.0


def selection_start(parts: list[int], records: frozenset[tuple[int, int]] | None) -> dict[int, int]:
    """Where a job starts reading each partition: offset 0 of every one, or for a job that
    names its records (the explorer's selection) only their partitions, from the lowest
    offset named in each."""
    if records is None:
        return {part: 0 for part in parts}
    lowest: dict[int, int] = {}
    for part, offset in records:
        lowest[part] = min(offset, lowest.get(part, offset))
    return {part: lowest[part] for part in parts if part in lowest}


class ReplayJob:
    """One bulk replay; ``start()`` runs it in a daemon thread."""

    def __init__(
        self,
        spec: JobSpec,
        *,
        common: dict[str, str],
        failed_topic: str,
        ledger: ReplayLedger,
        policy: TargetPolicy,
        by: str = "sidecar",
        job_id: str | None = None,
        timeout_s: float = 10.0,
        count_timeout_s: float = COUNT_TIMEOUT_S,
        delivery_timeout_s: float | None = None,
        ceiling: SharedRateLimit | None = None,
        tracing: Tracing = NO_TRACING,
        formats: Mapping[str, TopicFormat] | None = None,
    ) -> None:
        """``count_timeout_s`` bounds the counting pass; ``delivery_timeout_s`` the wait for
        one copy's (and one ledger record's) delivery report; ``ceiling`` is the rate shared
        with every other replay of the process; ``formats`` names the foreign dead-letter
        topics (``foreign_dead_letters``), whose records are read through their mapping."""
        self.id = job_id or f"job-{uuid.uuid4().hex[:16]}"
        self.spec = spec
        self.common = common
        self.failed_topic = spec.topic or failed_topic  # the dead-letter topic it reads
        self.fmt: TopicFormat = (formats or {}).get(self.failed_topic, ForeignFormat.RETRYD)
        self.ledger = ledger
        self.policy = policy
        self.by = f"{by}:{spec.actor}@{who()}"
        self.timeout_s = timeout_s
        self.count_timeout_s = count_timeout_s
        self.producer_conf = replay_producer_config(common, delivery_timeout_s)
        # A copy's report comes within message.timeout.ms, its ledger record's within as long
        # again: waiting that long leaves no outcome unknown.
        self.drain_timeout_s = 2 * effective_delivery_timeout_s(self.producer_conf) + timeout_s
        self.ceiling = ceiling
        self.tracing = tracing  # replayed copies' traces (retryd.tracing)
        self.progress = JobProgress()
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._rate_samples: deque[tuple[float, int]] = deque(maxlen=64)
        self._inflight = 0
        self._replay_began: float | None = None
        self._finished_mono: float | None = None
        self._marker: recovery.JobMarker | None = None

    # ------------------------------------------------------------------ control
    def start(self) -> ReplayJob:
        self._thread = threading.Thread(target=self.run, name=f"replay-{self.id}", daemon=True)
        self._thread.start()
        return self

    def cancel(self) -> None:
        self._cancel.set()

    def shutdown_bound_s(self) -> float:
        """How long after ``cancel`` this job can still run: a ledger read or a scan that
        was under way, then the drain of the copies in flight."""
        return self.timeout_s * 3 + self.drain_timeout_s

    def wait(self, timeout_s: float | None = None) -> bool:
        return self._done.wait(timeout_s)

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def run(self) -> None:
        from retryd.metrics.registry import REPLAYED

        scanner: TopicScanner | None = None
        producer: CopyProducer | None = None
        p = self.progress
        p.started_at = time.time()
        try:
            scanner = TopicScanner(
                self.common, self.failed_topic, "replay-job", self.ledger.clients, self.fmt
            )
            self._set(state="counting")
            parts = scanner.partitions(self.timeout_s)
            start = selection_start(parts or [], self.spec.filter.records)
            self.ledger.refresh()
            if not self.spec.dry_run:
                # Copies an interrupted job left without ledger entries count as replayed.
                recovery.recover(self.ledger, self.common, self.timeout_s, own_job=self.id)
            self._count(scanner, start)
            if self.spec.dry_run:
                self._finish("completed", "dry run: nothing was produced")
                return
            if self._cancel.is_set():
                self._finish("cancelled", "cancelled before replaying")
                return
            self._set(state="running")
            targets = {t for t in self.progress.by_target if t != "?"}
            if targets:  # announced before the first copy: a crash from here on is recoverable
                self._marker = recovery.begin(
                    self.ledger, self.common, self.id, targets, self.timeout_s
                )
            producer = CopyProducer(self.ledger.clients.producer, self.producer_conf)
            self._replay(scanner, producer, start, REPLAYED)
        except (ReplayError, LedgerError, KafkaException) as exc:
            log.error("replay job %s failed: %s", self.id, exc)
            self._note_error(str(exc))
            if producer is not None:
                self._drain(producer)  # copies in flight still get their ledger entries
            self._finish("failed", str(exc))
        except Exception as exc:  # a bug must not leave the job "running" forever
            log.exception("replay job %s crashed", self.id)
            if producer is not None:
                self._drain(producer)
            self._finish("failed", f"internal error: {exc.__class__.__name__}")
        finally:
            if scanner is not None:
                scanner.close()

    # ------------------------------------------------------------------ passes
    def _count(self, scanner: TopicScanner, start: dict[int, int]) -> None:
        spec = self.spec
        limit = spec.max_messages
        records = scanner.scan(start, timeout_s=self.count_timeout_s, idle_timeout_s=self.timeout_s)
        try:
            for msg in records:
                if self._cancel.is_set():
                    break
                self._count_one(to_record(msg, self.fmt), limit)
        except ScanIncomplete as exc:
            raise ScanIncomplete(
                f"the counting pass did not reach the end of {self.failed_topic} within "
                f"{self.count_timeout_s:g}s ({self.progress.scanned} records read); nothing "
                "was replayed"
            ) from exc
        finally:
            records.close()  # unassigns now, not whenever the generator is collected
        with self._lock:
            self.progress.end_offsets = dict(scanner.positions)
            self.progress.position = dict(start)

    def _count_one(self, rec: FailedRecord, limit: int | None) -> None:
        spec = self.spec
        with self._lock:
            self.progress.scanned += 1
        if not spec.filter.matches(rec):
            return
        reason, target = self._decide(rec)
        with self._lock:
            p = self.progress
            p.matched += 1
            p.by_dead_reason[str(rec.envelope.get("retryd_dead_reason"))] += 1
            p.by_error_class[str(rec.envelope.get("retryd_error_class"))] += 1
            if reason is None and (limit is None or p.to_replay < limit):
                p.to_replay += 1
                p.by_target[target or "?"] += 1

    def _decide(self, rec: FailedRecord) -> tuple[str | None, str | None]:
        """(skip reason or None, target topic)."""
        try:
            target = self.policy.choose(rec, self.spec.target)
        except InvalidTarget:
            return "no_valid_target", None
        except TargetReserved:
            return "target_reserved", None
        except TargetRefused:
            return "target_not_allowed", None
        except NothingToReplay:
            return "no_payload", None
        try:
            if self.policy.partitions(target) is None:
                return "target_missing", target
        except BrokerUnavailable:
            return "target_unknown", target
        if not self.spec.force and self.ledger.is_replayed(rec.coord):
            return "already_replayed", target
        return None, target

    def _replay(
        self, scanner: TopicScanner, producer: CopyProducer, start: dict[int, int], counter: Any
    ) -> None:
        spec = self.spec
        bucket = TokenBucket(spec.max_per_second)
        stop = dict(self.progress.end_offsets)
        last_refresh = time.monotonic()
        self._sample()
        outcome = ("completed", "every matched record was handled")

        def idle(seconds: float) -> None:
            producer.poll(seconds)
            self.ledger.poll(0)

        unprocessed: FailedRecord | None = None  # read but not handled when the job stopped
        for msg in scanner.scan(start, stop, timeout_s=10**9, idle_timeout_s=self.timeout_s):
            rec = to_record(msg, self.fmt)
            if self._cancel.is_set():
                unprocessed, outcome = rec, ("cancelled", "cancelled")
                break
            if not spec.filter.matches(rec):
                self._position(scanner)
                continue
            if spec.max_messages is not None and self._done_or_inflight() >= spec.max_messages:
                unprocessed = rec
                outcome = ("completed", f"max_messages={spec.max_messages} reached")
                break
            if time.monotonic() - last_refresh > LEDGER_REFRESH_S:
                self.ledger.refresh()  # another process may have replayed some meanwhile
                last_refresh = time.monotonic()
            marker = self._marker
            if marker is not None and time.time() - marker.beat_ms / 1000 > recovery.MARKER_EVERY_S:
                recovery.beat(self.ledger, marker)
            # Claim first, then decide: a single replay holds the same claim from its ledger
            # check to its entry, so deciding after the claim sees its entry (checking first
            # and claiming after let one land in between, and the record was replayed twice).
            reason: str | None
            target: str | None
            if not self.ledger.try_claim(rec.coord):
                reason, target = "in_progress", None
            else:
                reason, target = self._decide(rec)
                if reason is not None:
                    self.ledger.release(rec.coord)
            if reason is not None:
                with self._lock:
                    self.progress.skipped += 1
                    self.progress.skipped_reasons[reason] += 1
                if reason == "already_replayed":
                    counter.labels(status="skipped").inc()
                self._position(scanner)
                continue
            assert target is not None
            if not bucket.take(self._cancel, idle) or (
                self.ceiling is not None and not self.ceiling.take(self._cancel, idle)
            ):
                self.ledger.release(rec.coord)
                unprocessed, outcome = rec, ("cancelled", "cancelled")
                break
            self._send(producer, rec, target, counter)
            self._position(scanner)
            self._sample()
        settled = self._drain(producer)
        if self._marker is not None and settled and self.progress.failed == 0:
            self._close_marker(self._marker)
        self._position(scanner)
        if unprocessed is not None:
            with self._lock:  # the scanner had moved past it: report it as not done
                self.progress.position[unprocessed.partition] = unprocessed.offset
        self._finish(*outcome)

    def _send(self, producer: CopyProducer, rec: FailedRecord, target: str, counter: Any) -> None:
        coord = rec.coord

        def recorded(entry: LedgerEntry) -> None:
            audit.replayed(
                actor=self.spec.actor,
                record=str(coord),
                target=target,
                partition=entry.target_partition,
                offset=entry.target_offset,
                replay_id=entry.replay_id,
                forced=entry.forced,
                job=self.id,
            )

        def done(outcome: CopyOutcome) -> None:
            with self._lock:
                self._inflight -= 1
                p = self.progress
                if outcome.replayed:
                    p.replayed += 1
                    p.last_replayed = str(coord)
                elif outcome.skipped is not None:  # nothing written: counted like any skip
                    p.skipped += 1
                    p.skipped_reasons[outcome.skipped] += 1
                else:
                    p.failed += 1
                    self._note_error(outcome.error or "failed")
            status = "replayed" if outcome.replayed else "failed"
            counter.labels(status=status if outcome.skipped is None else "skipped").inc()
            self.ledger.release(coord)

        def idle(seconds: float) -> None:
            producer.poll(seconds)
            self.ledger.poll(0)

        with self._lock:
            self._inflight += 1
        try:
            send_replay_copy(
                producer,
                self.ledger,
                rec,
                target,
                self.policy.partitions(target) or 1,
                replay_id=self.id,
                forced=self.ledger.is_replayed(coord),
                by=self.by,
                on_done=done,
                idle=idle,
                on_recorded=recorded,
                tracing=self.tracing,
            )
        except KafkaException:  # refused by produce itself: never sent, so never in flight
            with self._lock:
                self._inflight -= 1
            self.ledger.release(coord)
            raise

    def _close_marker(self, marker: recovery.JobMarker) -> None:
        """Every copy has its entry: the job's marker goes. If that write fails the marker
        stays, and a later job's recovery (finding nothing to record) removes it."""
        try:
            if self.ledger.flush() == 0:
                recovery.finish(self.ledger, marker)
        except LedgerError as exc:
            log.warning("replay job %s: could not remove its ledger marker: %s", self.id, exc)

    def _drain(self, producer: CopyProducer) -> bool:
        """Wait until every copy and its ledger record has a definite outcome (False when some
        outcomes are still unknown). Both producers report every message within their delivery
        timeout, so this ends by itself; the deadline only guards against a report that never
        comes."""
        deadline = time.monotonic() + self.drain_timeout_s
        while time.monotonic() < deadline:
            producer.poll(0.05)
            self.ledger.poll(0.05)
            with self._lock:
                if self._inflight <= 0:
                    return True
        with self._lock:
            lost, self._inflight = self._inflight, 0
            self.progress.failed += lost
        self._note_error(f"{lost} replay(s) not acknowledged in time (outcome unknown)")
        return False

    # ------------------------------------------------------------------ bookkeeping
    def _done_or_inflight(self) -> int:
        with self._lock:
            return self.progress.replayed + self._inflight

    def _position(self, scanner: TopicScanner) -> None:
        with self._lock:
            self.progress.position = dict(scanner.positions)

    def _sample(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._replay_began is None:
                self._replay_began = now
            if not self._rate_samples or now - self._rate_samples[-1][0] >= 0.25:
                self._rate_samples.append((now, self.progress.replayed))

    def _note_error(self, text: str) -> None:
        errors = self.progress.errors
        if len(errors) < MAX_ERRORS_KEPT:
            errors.append(text)

    def _set(self, **changes: Any) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(self.progress, name, value)

    def _finish(self, state: str, reason: str) -> None:
        with self._lock:
            p = self.progress
            replayed, skipped, failed = p.replayed, p.skipped, p.failed
        # Log first, then show the end and wake waiters: `retryd replay` exits as soon as its
        # job is done, and an audit line written after that could be lost with the process
        # (seen in tests as "I/O operation on closed file" from the job's thread after the
        # command returned); whoever sees the job finished finds its line written.
        audit.job_event(
            "finished",
            actor=self.spec.actor,
            job=self.id,
            state=state,
            replayed=replayed,
            skipped=skipped,
            failed=failed,
        )
        log.info(
            "replay job %s %s: %s (replayed=%d skipped=%d failed=%d)",
            self.id,
            state,
            reason,
            replayed,
            skipped,
            failed,
        )
        with self._lock:
            self.progress.state = state
            self.progress.stop_reason = reason
            self.progress.finished_at = time.time()
            self._finished_mono = time.monotonic()
        self._done.set()

    def rate(self) -> float:
        """Replays per second: over the last few seconds while running, overall once done."""
        with self._lock:
            samples = list(self._rate_samples)
            replayed = self.progress.replayed
            finished = self._finished_mono
            began = self._replay_began
        return rate_per_second(samples, replayed, began, finished, time.monotonic())

    def snapshot(self) -> dict[str, Any]:
        """Progress as plain data (the API's and the CLI's view)."""
        rate = self.rate()
        with self._lock:
            return render_snapshot(self.id, self.spec, self.progress, rate, self.failed_topic)
