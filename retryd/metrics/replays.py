"""Replays counted from the replay ledger: the sidecar's own, ``retryd replay`` and Spark's.

A replay by the CLI or by a Spark executor happens in a process the sidecar never sees, so a
Prometheus counter incremented there is lost when that process exits. What every replay does
leave is one record in the replay ledger topic, naming who wrote it (``by``). The sidecar
tails the ledger and counts the records written since it started, by source:
``retryd_replayed_total{status="replayed", source="sidecar"|"cli"|"spark"|"other"}``.

- Counting starts at the ledger's end when the sidecar starts (earlier records are history, and
  a counter that restarted at the whole history would show it as a burst of replays). A
  restart is a counter reset, which ``rate``/``increase`` handle.
- Every sidecar of a deployment tails the same ledger, so every one of them counts every
  replay. The series is a group-level fact: dashboards take ``max by (group, status, source)``
  over the sidecars before summing (deploy/README.md); one sidecar that stays up is enough.
- Only records of this deployment's ``failed_topic`` and its error routes' dead-letter topics
  are counted (the ledger key starts with one of them), so deployments sharing a ledger topic
  count their own replays.
- ``skipped`` and ``failed`` leave no ledger record: they are counted where they happen (the
  sidecar's own requests and jobs, ``source="sidecar"``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter

from retryd.replay.errors import ScanIncomplete
from retryd.replay.scan import TopicScanner

log = logging.getLogger(__name__)

SOURCES = ("sidecar", "cli", "spark")
OTHER = "other"


def source_of(by: str) -> str:
    """The bounded ``source`` label of a ledger entry's ``by`` (``sidecar:<token id>@host``,
    ``cli``, ``spark@host``): the word before the first ``:`` or ``@``, or ``other``."""
    word = by.replace("@", ":", 1).split(":", 1)[0].strip().lower()
    return word if word in SOURCES else OTHER


def entry_source(value: bytes | None) -> str | None:
    """The source of one ledger record's value; None for a tombstone (nothing was replayed)."""
    if value is None:
        return None
    try:
        by = json.loads(value).get("by", "")
    except (ValueError, AttributeError):
        return OTHER
    return source_of(str(by))


class LedgerTail:
    """Reads the ledger from where it stopped last time and counts new replays by source.

    ``tail_once`` is called from the sidecar's measurement thread; ``counts`` from scrapes.
    """

    def __init__(
        self,
        common: dict[str, str],
        ledger_topic: str,
        failed_topic: str,
        timeout_s: float = 5.0,
        *,
        dlt_topics: tuple[str, ...] | list[str] = (),
    ) -> None:
        """``dlt_topics``: the error routes' dead-letter topics, replayed from like
        ``failed_topic``."""
        self.common = common
        self.topic = ledger_topic
        self.prefix = tuple(f"{t}/".encode() for t in (failed_topic, *dlt_topics))
        self.timeout_s = timeout_s
        self._scanner: TopicScanner | None = None
        self._positions: dict[int, int] = {}
        self._started = False  # True once the ledger's end at start-up was reached
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def counts(self) -> dict[str, int]:
        """Replays recorded since this sidecar started, by source (empty until it first read
        to the ledger's end)."""
        with self._lock:
            if not self._started:
                return {}
            return {source: self._counts[source] for source in (*SOURCES, OTHER)}

    def tail_once(self) -> int:
        """Count the ledger records written since the last call; returns how many. The first
        calls only find the ledger's end (a large ledger may take a few: a read cut short
        resumes where it stopped)."""
        if self._scanner is None:
            self._scanner = TopicScanner(self.common, self.topic, "ledger-metrics")
        scanner = self._scanner
        parts = scanner.partitions(self.timeout_s)
        if parts is None:
            with self._lock:
                self._started = True  # no ledger yet: nothing was ever replayed
            return 0
        history = not self._started
        start = {p: self._positions.get(p, 0) for p in parts}
        seen: Counter[str] = Counter()
        records = scanner.scan(start, timeout_s=self.timeout_s * 3, idle_timeout_s=self.timeout_s)
        try:
            for msg in records:
                if history or not (msg.key() or b"").startswith(self.prefix):
                    continue  # the history before this sidecar started, or another deployment's
                source = entry_source(msg.value())
                if source is not None:
                    seen[source] += 1
            complete = True
        except ScanIncomplete:
            complete = False
        finally:
            records.close()
        with self._lock:
            self._positions = dict(scanner.positions)
            self._counts.update(seen)
            self._started = self._started or complete
        return sum(seen.values())

    def close(self) -> None:
        if self._scanner is not None:
            self._scanner.close()
            self._scanner = None
