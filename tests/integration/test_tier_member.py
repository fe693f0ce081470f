"""Role ``all`` reads its tiers on a group member of their own (retryd.worker.split_consumer),
on Apache Kafka: a worker process that joins late gets its share of the main topic (on the
classic protocol a shared consumer could be given only tier partitions), and nothing is lost
or handled twice across the handover."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from confluent_kafka.admin import AdminClient

from tests.integration.worker_support import deployment, stop_process
from tests.support import json_lines, wait_for


def test_a_late_joiner_gets_its_share_of_the_main_topic(bootstrap: str, tmp_path: Path) -> None:
    n = 4000  # 16 calls of 50 ms at a time: about 12 s for one member alone
    # 2 main partitions and 3 tiers x 2 partitions: a member sharing one consumer owns 8
    # partitions, of which a joiner's fair half may be tiers only
    dep = deployment(bootstrap, tmp_path, sequence="1s,2s,3s", partitions=2)
    specs = [{"id": f"j{i}", "mode": "slow", "seconds": 0.05} for i in range(n)]
    dep.send(specs)
    log1, log2 = tmp_path / "w1.log", tmp_path / "w2.log"
    w1 = dep.spawn_worker(log1)
    w2 = None
    try:
        wait_for(lambda: len(json_lines(log1)) >= 100, 90, what="the first member busy")
        w2 = dep.spawn_worker(log2)
        wait_for(lambda: len(json_lines(log2)) >= 50, 90, what="the joiner handling records")
        wait_for(
            lambda: len({c["id"] for c in json_lines(log1) + json_lines(log2)}) == n,
            180,
            what="every record handled",
        )
        members = _members(bootstrap, dep.settings.group_id)
    finally:
        stop_process(w1)
        if w2 is not None:
            stop_process(w2)
    first, late = json_lines(log1), json_lines(log2)
    assert {c["topic"] for c in late} == {dep.main}
    assert len({c["partition"] for c in late}) == 1, "the joiner owns one of the 2 partitions"
    ids = Counter(c["id"] for c in first + late)
    assert set(ids) == {s["id"] for s in specs}  # nothing lost
    # two processes, each a main member and a tiers member, in the one group
    assert Counter(members) == {"retryd-worker-all": 2, "retryd-worker-all-tiers": 2}


def _members(bootstrap: str, group: str) -> list[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return [m.client_id for m in desc.members]
