"""Bulk HTTP mode end to end: ``retryd worker --handler http://…/bulk --handler-batch n`` on
a real broker against the Go business service. Each record's value says what the service
answers for it: ``ok`` (SUCCESS), ``status:DEAD`` (DEAD), ``BOOM`` (RETRY, every time: its
tier, then exhausted). Every record ends in exactly one place, every offset is committed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from bench import goservice
from retryd.policy import headers as h
from tests.integration.worker_support import deployment, stop_process
from tests.support import produce, read_topic, wait_for

KINDS = (b"ok", b"status:DEAD", b"BOOM")
N = 300
PARTITIONS = 3
BATCH = 50


@pytest.fixture
def service() -> Iterator[goservice.Service]:
    with goservice.start(fail_match="BOOM") as svc:
        yield svc


def _committed(bootstrap: str, group: str, topic: str) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        wanted = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return [tp.offset for tp in c.committed(wanted, timeout=10)]
    finally:
        c.close()


def test_bulk_mode_through_the_cli(
    bootstrap: str, tmp_path: Path, service: goservice.Service
) -> None:
    dep = deployment(
        bootstrap, tmp_path, sequence="1s", partitions=PARTITIONS, handler=service.bulk_url
    )
    specs = {str(i): KINDS[i % 3] for i in range(N)}
    acks = produce(bootstrap, dep.main, [(k.encode(), v) for k, v in specs.items()])
    ends = Counter(p for p, _ in acks)
    proc = dep.spawn_worker(
        tmp_path / "worker.log", "--until-drained", "--handler-batch", str(BATCH)
    )
    try:
        wait_for(lambda: proc.poll() is not None, 180, interval=0.2, what="the worker drained")
        assert proc.returncode == 0
    finally:
        stop_process(proc)

    stats = service.stats()
    assert stats["records"] == N + N // 3  # every record once, the BOOM ones again in the tier
    assert stats["requests"] < stats["records"] / 2  # many records per request
    tier = read_topic(bootstrap, dep.tier("1s"), expect=N // 3)
    assert Counter(specs[(r.key or b"").decode()] for r in tier) == {b"BOOM": N // 3}
    failed = read_topic(bootstrap, dep.failed, expect=2 * N // 3)
    reasons = {
        (r.key or b"").decode(): (r.header(h.DEAD_REASON), r.header(h.ERROR_CLASS)) for r in failed
    }
    assert len(reasons) == len(failed) == 2 * N // 3  # one dead letter per record
    for key, reason in reasons.items():
        expected = {
            b"status:DEAD": (b"non_retryable", b"http_200"),
            b"BOOM": (b"exhausted", b"http_200"),
        }
        assert reason == expected[specs[key]], key
    assert set(reasons) == {k for k, v in specs.items() if v != b"ok"}
    assert _committed(bootstrap, dep.settings.group_id, dep.main) == [
        ends[p] for p in range(PARTITIONS)
    ]
