"""A batch handler end to end on a real broker, through ``retryd worker --handler-batch``: mixed
outcomes inside each call, every record in exactly one place (handled, its tier, or
``failed_topic``), every offset committed, nothing lost.

``handle_batch`` below is the handler the worker process loads; the value of each record says
what happens to it: ``ok``; ``flaky`` (an exception instance on the main topic, success in its
tier); ``dead`` (``retryd.Dead``); ``retry`` (``retryd.Retry`` every time: exhausted). Each call
is logged as one JSON line to ``$RETRYD_TEST_LOG``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

import retryd
from retryd.handlers.base import Message
from retryd.policy import headers as h
from tests.integration.handlers import append_log_line
from tests.integration.worker_support import deployment, stop_process
from tests.support import produce, read_topic, wait_for

KINDS = ("ok", "flaky", "dead", "retry")
N = 400
PARTITIONS = 3
BATCH = 25


def handle_batch(records: list[Message]) -> list[object]:
    out: list[object] = []
    for m in records:
        kind = json.loads(m.value or b"{}")["kind"]
        if kind == "flaky":
            out.append(None if m.retry_number else ConnectionError("flaky"))
        elif kind == "dead":
            out.append(retryd.Dead("bad_iban"))
        elif kind == "retry":
            out.append(retryd.Retry("rate_limited"))
        else:
            out.append(True)
    append_log_line(
        {"records": [[m.key.decode() if m.key else "", m.retry_number] for m in records]}
    )
    return out


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        wanted = [TopicPartition(topic, p) for p in range(partitions)]
        return [tp.offset for tp in c.committed(wanted, timeout=10)]
    finally:
        c.close()


def test_mixed_outcomes_per_batch_end_each_record_in_one_place(
    bootstrap: str, tmp_path: Path
) -> None:
    dep = deployment(
        bootstrap,
        tmp_path,
        sequence="1s",
        partitions=PARTITIONS,
        handler=f"python:{__name__}:handle_batch",
    )
    specs = {str(i): KINDS[i % 4] for i in range(N)}
    acks = produce(
        bootstrap,
        dep.main,
        [(k.encode(), json.dumps({"kind": v}).encode()) for k, v in specs.items()],
    )
    ends = Counter(p for p, _ in acks)
    log = tmp_path / "calls.jsonl"
    proc = dep.spawn_worker(log, "--until-drained", "--handler-batch", str(BATCH))
    try:
        wait_for(lambda: proc.poll() is not None, 180, interval=0.2, what="the worker drained")
        assert proc.returncode == 0
    finally:
        stop_process(proc)

    calls = [json.loads(line)["records"] for line in log.read_text().splitlines()]
    sizes = [len(c) for c in calls]
    assert max(sizes) > 1 and max(sizes) <= BATCH, sizes
    handled = Counter(
        key
        for call in calls
        for key, retry in call
        if specs[key] == "ok" or (specs[key] == "flaky" and retry == 1)
    )
    assert all(n == 1 for n in handled.values())  # handled once each (no redo, no crash)

    tier = read_topic(bootstrap, dep.tier("1s"), expect=N // 2)
    assert Counter(specs[(r.key or b"").decode()] for r in tier) == {
        "flaky": N // 4,
        "retry": N // 4,
    }
    failed = read_topic(bootstrap, dep.failed, expect=N // 2)
    reasons = {
        (r.key or b"").decode(): (r.header(h.DEAD_REASON), r.header(h.ERROR_CLASS)) for r in failed
    }
    assert len(reasons) == len(failed) == N // 2  # one dead letter per record
    for key, reason in reasons.items():
        expected = {
            "dead": (b"non_retryable", b"bad_iban"),
            "retry": (b"exhausted", b"rate_limited"),
        }
        assert reason == expected[specs[key]], key
    # exactly one terminal place each, and nothing lost
    assert not set(handled) & set(reasons)
    assert set(handled) | set(reasons) == set(specs)
    # every input offset committed, on the main topic and in the tier
    main = _committed(bootstrap, dep.settings.group_id, dep.main, PARTITIONS)
    assert main == [ends[p] for p in range(PARTITIONS)]
    tier_ends = Counter(r.partition for r in tier)
    tier_committed = _committed(bootstrap, dep.settings.group_id, dep.tier("1s"), PARTITIONS)
    assert tier_committed == [tier_ends.get(p, -1001) for p in range(PARTITIONS)]
