"""Issue 9, items 3 and 7: a read that stops at its deadline is never taken as complete.

Item 3: the ledger holds 5,000 entries, the record under test's entry last. A ledger read cut
short by its deadline (the real scan code, with deadlines from 2 to 50 ms) must raise, never
answer "not replayed"; a replay on such a read must refuse (503) instead of replaying the
record a second time. What a cut-short read got is kept: the next read finishes the job.

Item 7: a bulk job whose counting pass cannot reach the end of failed_topic in its time fails
before replaying anything, instead of replaying the part it counted and reporting "completed".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from retryd.replay.errors import AlreadyReplayed, BrokerUnavailable
from retryd.replay.jobs import JobSpec, ReplayJob
from retryd.replay.ledger import LedgerEntry, LedgerError, ReplayLedger
from retryd.replay.records import FailedRecord
from retryd.replay.replayer import Replayer, TargetPolicy
from retryd.replay.scan import TopicScanner, to_record
from tests.integration.sidecar_support import failed_headers
from tests.support import create_topics, produce, read_topic, unique

ENTRIES = 20_000  # a read long enough that a deadline can fall inside it after connecting
DEADLINES_S = (0.002, 0.003, 0.004, 0.006, 0.008, 0.012, 0.02, 0.03, 0.05)


@dataclass
class Topics:
    bootstrap: str
    main: str
    failed: str
    ledger: str

    @property
    def common(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}


@pytest.fixture(scope="module")
def topics(bootstrap: str) -> Iterator[Topics]:
    t = Topics(bootstrap, unique("main"), unique("failed"), unique("ledger"))
    create_topics(bootstrap, [t.main, t.failed], 1)
    create_topics(bootstrap, [t.ledger], 1, {"cleanup.policy": "compact"})
    produce(
        bootstrap,
        t.failed,
        [(f"k{i}".encode(), b"v", failed_headers(t.main)) for i in range(ENTRIES)],
    )
    # The ledger: ENTRIES - 1 other records, then the entry of failed/0/0 (already replayed once).
    filler = LedgerEntry(replay_id="r-old", target_topic=t.main, by="test").to_json()
    entries = [(f"{t.failed}/9/{i}".encode(), filler) for i in range(ENTRIES - 1)]
    entries.append((f"{t.failed}/0/0".encode(), filler))
    produce(bootstrap, t.ledger, entries)
    yield t


def _record(t: Topics) -> FailedRecord:
    scanner = TopicScanner(t.common, t.failed)
    try:
        msg = scanner.read_one(0, 0)
        assert msg is not None
        return to_record(msg)
    finally:
        scanner.close()


def test_ledger_read_cut_short_is_never_taken_as_complete(topics: Topics) -> None:
    coord = f"{topics.failed}/0/0"
    cut_short = []
    # Deadlines that fall inside a read on this broker: fractions of a measured full read
    # (a fixed list fits one broker's speed only).
    full = ReplayLedger(topics.common, topics.ledger, timeout_s=30)
    try:
        started = time.perf_counter()
        full.refresh()
        whole_s = time.perf_counter() - started
    finally:
        full.close()
    deadlines = sorted({*DEADLINES_S, *(whole_s * f for f in (0.05, 0.1, 0.2, 0.35, 0.5, 0.7))})
    for _attempt in range(5):
        for deadline in deadlines:
            ledger = ReplayLedger(topics.common, topics.ledger, timeout_s=deadline)
            try:
                ledger.refresh()
            except (LedgerError, BrokerUnavailable) as exc:
                if "to its end" in str(exc):
                    cut_short.append((deadline, len(ledger)))
                    # Progress is kept: a read with time enough finishes from there.
                    ledger.timeout_s = 10
                    ledger.refresh()
                    assert len(ledger) == ENTRIES and ledger.is_replayed(coord)
                continue
            finally:
                ledger.close()
            assert len(ledger) == ENTRIES, f"deadline {deadline}: {len(ledger)} entries read"
            assert ledger.is_replayed(coord), f"deadline {deadline}: entry not seen"
        if any(n < ENTRIES for _, n in cut_short):
            break
    print(f"reads cut short by their deadline (deadline s, entries read): {cut_short}")
    # (A read may also stop after the last entry but before it saw the end: still not done.)
    assert any(n < ENTRIES for _, n in cut_short), "no deadline fell in the middle of the read"


def test_replay_on_a_cut_short_ledger_read_refuses(topics: Topics) -> None:
    rec = _record(topics)
    policy = TargetPolicy(topics.common, [topics.main])
    try:
        for deadline in DEADLINES_S:
            ledger = ReplayLedger(topics.common, topics.ledger, timeout_s=deadline)
            replayer = Replayer(topics.common, ledger, policy, timeout_s=10)
            try:
                with pytest.raises((AlreadyReplayed, BrokerUnavailable)):
                    replayer.replay(rec)
            finally:
                replayer.close()
                ledger.close()
    finally:
        policy.close()
    assert read_topic(topics.bootstrap, topics.main) == [], "a replayed record was replayed again"


def test_job_whose_count_runs_out_of_time_fails_before_replaying(topics: Topics) -> None:
    fresh_ledger = unique("ledger")
    create_topics(topics.bootstrap, [fresh_ledger], 1, {"cleanup.policy": "compact"})
    ledger = ReplayLedger(topics.common, fresh_ledger, timeout_s=10)
    policy = TargetPolicy(topics.common, [topics.main])
    try:
        job = ReplayJob(
            JobSpec(max_per_second=10_000),
            common=topics.common,
            failed_topic=topics.failed,
            ledger=ledger,
            policy=policy,
            timeout_s=10,
            count_timeout_s=0.0,
        ).start()
        assert job.wait(60)
        snap = job.snapshot()
    finally:
        policy.close()
        ledger.close()
    assert snap["state"] == "failed", snap
    assert snap["stop_reason"].startswith(
        f"the counting pass did not reach the end of {topics.failed} within 0s"
    ), snap["stop_reason"]
    assert snap["replayed"] == 0 and snap["to_replay"] < ENTRIES, snap
    assert read_topic(topics.bootstrap, topics.main) == []
