"""The double-replay race of a bulk job and a single replay, on the in-memory stub broker: the
replay code takes its clients from injected factories (``ReplayClients``), so the whole of it
(scanner, ledger, target policy, job, single replay) runs here in milliseconds, and the window
is widened exactly (the job's decision is held until the single replay has run)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from retryd.policy import headers as h
from retryd.replay.errors import AlreadyReplayed, ReplayFailed
from retryd.replay.jobs import JobSpec, ReplayJob
from retryd.replay.ledger import ReplayLedger
from retryd.replay.records import RecordFilter
from retryd.replay.replayer import Replayer, TargetPolicy
from retryd.replay.scan import TopicScanner, to_record
from tests.stub_kafka import StubBroker, replay_clients

COMMON = {"bootstrap.servers": "stub:9092"}
FAILED, MAIN, LEDGER = "orders.failed", "orders", "retryd-ledger"


def _failed_record(broker: StubBroker) -> None:
    broker.append(
        FAILED,
        b"k",
        b"v",
        [
            (h.RETRY_NUMBER, b"3"),
            (h.ORIGINAL_TOPIC, MAIN.encode()),
            (h.ORIGINAL_PARTITION, b"0"),
            (h.ORIGINAL_OFFSET, b"0"),
            (h.DEAD_REASON, b"exhausted"),
        ],
    )


@pytest.mark.parametrize("iteration", range(5))
def test_a_job_and_a_single_replay_replay_one_record_once(monkeypatch: Any, iteration: int) -> None:
    broker = StubBroker()
    for topic in (FAILED, MAIN, LEDGER):
        broker.create(topic, 1)
    _failed_record(broker)
    clients = replay_clients(broker)
    ledger = ReplayLedger(COMMON, LEDGER, timeout_s=2, clients=clients)
    policy = TargetPolicy(COMMON, [MAIN], clients=clients)
    replayer = Replayer(COMMON, ledger, policy, timeout_s=2)
    scanner = TopicScanner(COMMON, FAILED, clients=clients)
    msg = scanner.read_one(0, 0)
    assert msg is not None
    rec = to_record(msg)

    deciding, single_done = threading.Event(), threading.Event()
    decisions: list[int] = []
    original = ReplayJob._decide

    def slow_decide(self: ReplayJob, r: Any) -> Any:
        decided = original(self, r)  # the ledger says: not replayed yet
        decisions.append(1)
        if len(decisions) > 1:  # the replay pass (the first is the counting pass)
            deciding.set()
            single_done.wait(2)
        return decided

    monkeypatch.setattr(ReplayJob, "_decide", slow_decide)
    outcomes: list[str] = []

    def single() -> None:
        deciding.wait(10)
        try:
            replayer.replay(rec, actor="test")
            outcomes.append("replayed")
        except AlreadyReplayed:
            outcomes.append("already_replayed")
        except ReplayFailed as exc:  # the job holds the claim: refused, nothing written
            assert "being replayed by another request" in str(exc)
            outcomes.append("busy")
        finally:
            single_done.set()

    t = threading.Thread(target=single, daemon=True)
    t.start()
    job = ReplayJob(
        JobSpec(filter=RecordFilter(original_topic=MAIN), max_per_second=1000),
        common=COMMON,
        failed_topic=FAILED,
        ledger=ledger,
        policy=policy,
        timeout_s=2,
    ).start()
    assert job.wait(20), "the job did not finish"
    t.join(10)
    copies = Counter(dict(r.headers).get(h.REPLAYED_FROM) for r in broker.records(MAIN))
    assert sum(copies.values()) == 1, (job.snapshot(), outcomes)
