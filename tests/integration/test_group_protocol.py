"""The group protocol decides whether a member that joins later gets its share of the main
topic. On the classic protocol librdkafka's cooperative-sticky assignor balances partition
*counts* over every subscribed topic: measured on Apache Kafka 4.4.0 with a main topic and a
tier of 6 partitions each, the first member kept every main-topic partition and the second
got the 6 tier partitions, so the second process did none of the main topic's work. With
``group_protocol=consumer`` (KIP-848, range assignor) each topic is split evenly, and
partition i of the main topic and of the tier land on one member."""

from __future__ import annotations

from pathlib import Path

import pytest

from retryd.kafka.apache import resolve_version
from tests.integration.worker_support import Deployment, deployment, stop_process
from tests.support import ON_TANSU, json_lines, wait_for

pytestmark = pytest.mark.skipif(
    ON_TANSU or int(resolve_version().split(".")[0]) < 4,
    reason="the broker-driven group protocol is generally available from Kafka 4.0",
)

PARTITIONS = 6


def _owned(dep: Deployment, pid: int) -> dict[str, set[int]]:
    return dep.owned(pid)


def test_a_member_that_joins_later_gets_half_of_every_topic(bootstrap: str, tmp_path: Path) -> None:
    dep = deployment(
        bootstrap, tmp_path, sequence="1s", partitions=PARTITIONS, group_protocol="consumer"
    )
    tier = dep.tier("1s")
    log = tmp_path / "calls.jsonl"
    first = dep.spawn_worker(log)
    second = None
    try:
        wait_for(
            lambda: _owned(dep, first.pid).get(dep.main) == set(range(PARTITIONS)),
            60,
            what="the first member to own the whole main topic",
        )
        second = dep.spawn_worker(log)

        def split() -> bool:
            a, b = _owned(dep, first.pid), _owned(dep, second.pid)
            return all(
                len(a.get(t, ())) == len(b.get(t, ())) == PARTITIONS // 2
                and a.get(t, set()) | b.get(t, set()) == set(range(PARTITIONS))
                for t in (dep.main, tier)
            )

        wait_for(split, 60, interval=0.2, what="each member to own half of every topic")

        # and the group works: every record fails once, then succeeds on its retry
        dep.send([{"id": f"r{i}", "mode": "fail_k", "k": 1} for i in range(300)])

        def retried() -> set[str]:
            return {c["id"] for c in json_lines(log) if c["retry_number"] == 1}

        wait_for(lambda: len(retried()) == 300, 90, interval=0.5, what="300 retries handled")
        assert {c["pid"] for c in json_lines(log)} == {first.pid, second.pid}
    finally:
        stop_process(first)
        if second is not None:
            stop_process(second)
    assert first.returncode == 0 and second is not None and second.returncode == 0
