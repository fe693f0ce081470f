"""Exactly-once routing on the real broker: routed copies and input offsets in one transaction.

The SIGKILL loop is the proof: a worker killed between a copy's acknowledgement and the next
offset commit redoes that input, so in the default (at-least-once) mode the copy exists twice;
with ``exactly_once`` the killed worker's open transaction is aborted when its successor (the
same transactional id) starts, and ``read_committed`` readers never see its copies. The same
test runs in both modes: it must find duplicates in the default mode (so it can see them) and
none in exactly-once mode.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from retryd.policy import headers as h
from tests.integration.worker_support import (
    Deployment,
    calls_for,
    deployment,
    stop_process,
)
from tests.support import ON_TANSU, json_lines, produce, read_topic, unique, wait_for

pytestmark = pytest.mark.skipif(ON_TANSU, reason="the embedded stand-in shows aborted data")


def _ids(records: list) -> Counter[str]:
    return Counter((r.key or b"").decode() for r in records)


def _log_end(bootstrap: str, topic: str) -> int:
    """High watermark of partition 0 (transaction markers take offsets too)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("wm")})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


def _read_uncommitted(bootstrap: str, topic: str, expect: int) -> int:
    """How many records a read_uncommitted reader sees (aborted ones included)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("ru"),
            "isolation.level": "read_uncommitted",
            "enable.partition.eof": True,
        }
    )
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    seen = 0
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(500, 0.2)
            if any(m.error() for m in msgs) and seen >= expect:
                break
            seen += sum(1 for m in msgs if not m.error())
    finally:
        c.close()
    return seen


def test_copies_and_offsets_commit_in_transactions(bootstrap: str, tmp_path: Path) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s,1s", exactly_once=True)
    dep.send(
        [{"id": f"a{i}", "mode": "always"} for i in range(5)]
        + [{"id": f"k{i}", "mode": "fail_k", "k": 1} for i in range(5)]
        + [{"id": f"ok{i}", "mode": "ok"} for i in range(5)]
    )

    summary = dep.run()

    dead = read_topic(bootstrap, dep.failed, expect=5)
    assert _ids(dead) == Counter({f"a{i}": 1 for i in range(5)})
    assert {r.header(h.DEAD_REASON) for r in dead} == {b"exhausted"}
    tier = read_topic(bootstrap, dep.tier("1s"), expect=15)
    # a0..a4 twice (retry 1 and 2), k0..k4 once: one copy per hop, no more
    expected = {**{f"a{i}": 2 for i in range(5)}, **{f"k{i}": 1 for i in range(5)}}
    assert _ids(tier) == Counter(expected)
    assert [c["retry_number"] for c in calls_for("k0")] == [0, 1]
    assert summary.total("dead") == 5 and summary.total("retried") == 15
    # The copies were written in transactions: each commit adds a marker to the log, and a
    # read_uncommitted reader sees no record a read_committed one does not (nothing aborted).
    assert _log_end(bootstrap, dep.failed) > len(dead)
    assert _read_uncommitted(bootstrap, dep.failed, len(dead)) == len(dead)
    # the group's offsets were committed by the transactions (auto-commit is off)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": dep.settings.group_id})
    try:
        [main] = c.committed([TopicPartition(dep.main, 0)], timeout=10)
    finally:
        c.close()
    assert main.offset == 15


def _called(log: Path, pid: int, *, tier: bool) -> bool:
    """``pid`` has handled a record (of a tier, with ``tier``)."""
    if not log.exists():
        return False
    return any(c["pid"] == pid and (not tier or c["retry_number"] > 0) for c in json_lines(log))


def _sigkill_loop(dep: Deployment, tmp_path: Path, messages: int, kills: int) -> Counter[str]:
    """Produce ``messages`` always-failing records while one worker process is SIGKILLed
    ``kills`` times (restarted at once); returns the count of dead letters per id once every
    id has one, after checking the tier copies too."""
    rng = random.Random(7)
    log = tmp_path / "calls.jsonl"
    specs = [{"id": f"m{i}", "mode": "always"} for i in range(messages)]
    records = [(s["id"].encode(), json.dumps(s).encode()) for s in specs]
    proc = dep.spawn_worker(log)
    try:
        chunk = messages // (kills + 1)
        for i in range(kills + 1):
            produce(dep.bootstrap, dep.main, records[i * chunk : (i + 1) * chunk])
            if i == kills:
                break
            # every process works before it is killed (a restarted one first waits for the
            # killed members' sessions to time out): main records, and their tier copies
            wait_for(
                lambda pid=proc.pid: _called(log, pid, tier=True),  # type: ignore[misc]
                90,
                what="the worker to handle tier records",
            )
            # let it route part of the chunk, then kill it mid-flight
            time.sleep(rng.uniform(0.05, 0.3))  # while its tier copies are being routed
            assert proc.poll() is None, "the worker exited on its own"
            proc.kill()
            proc.wait(30)
            proc = dep.spawn_worker(log)
        produce(dep.bootstrap, dep.main, records[(kills + 1) * chunk :])

        def all_dead() -> bool:
            got = _ids(read_topic(dep.bootstrap, dep.failed, timeout=30))
            return len(got) == messages

        wait_for(all_dead, 240, interval=2, what=f"{messages} ids in failed_topic")
        assert proc.poll() is None, "the worker exited on its own"
    finally:
        stop_process(proc)
    dead = _ids(read_topic(dep.bootstrap, dep.failed, timeout=30))
    tier = _ids(read_topic(dep.bootstrap, dep.tier("1s"), timeout=30))
    assert set(tier) == set(dead) == {s["id"] for s in specs}  # nothing lost
    return dead + tier


@pytest.mark.slow
@pytest.mark.parametrize("exactly_once", [False, True], ids=["default", "exactly_once"])
def test_sigkill_loop_duplicate_copies(bootstrap: str, tmp_path: Path, exactly_once: bool) -> None:
    dep = deployment(
        bootstrap,
        tmp_path,
        sequence="1s",
        partitions=2,
        exactly_once=exactly_once,
        handler_timeout_s=5.0,
    )
    copies = _sigkill_loop(dep, tmp_path, messages=3000, kills=4)
    duplicates = sum(n - 2 for n in copies.values() if n > 2)  # one tier copy + one dead letter
    print(f"\nexactly_once={exactly_once}: {duplicates} duplicate copies over 4 SIGKILLs")
    if exactly_once:
        assert duplicates == 0, copies.most_common(5)
    else:
        # at-least-once: acknowledged copies whose inputs were not yet committed are redone
        assert duplicates > 0, "the SIGKILL loop produced no duplicate in the default mode"


def _when(found: dict[str, str], count: int) -> dict[str, str] | None:
    return found if len(found) == count else None


def _stderr(log: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in log.parent.glob(f"{log.stem}.*.stderr"))


def test_a_restarted_process_keeps_its_transactional_id(bootstrap: str, tmp_path: Path) -> None:
    """Zombie fencing needs the id to survive the restart: the supervisor starts the
    replacement of a SIGKILLed child in its slot, so it registers the same transactional id
    (aborting whatever the dead one left open), and routing goes on without a duplicate."""
    import os
    import re
    import signal

    dep = deployment(bootstrap, tmp_path, sequence="1s", partitions=2, exactly_once=True)
    log = tmp_path / "sup.log"
    n = 400
    dep.send([{"id": f"e{i}", "mode": "always"} for i in range(n)])
    sup = dep.spawn_worker(log, "--processes", "2")

    def ids() -> dict[str, str]:
        """pid -> transactional id, from each child's start-up line."""
        found = re.findall(r" (\d+) retryd\.worker\.assembly: exactly-once routing: "
                           r"transactional id (\S+)", _stderr(log))  # fmt: skip
        return dict(found)

    try:
        first = wait_for(lambda: _when(ids(), 2), 60, what="2 children")
        assert sorted(first.values()) == sorted({*first.values()}) and all(
            v.endswith(("-0", "-1")) for v in first.values()
        ), first
        victim = next(iter(first))
        os.kill(int(victim), signal.SIGKILL)
        after = wait_for(
            lambda: _when(ids(), 3), 60, what="the replacement child (after the restart backoff)"
        )
        [new_id] = [i for p, i in after.items() if p not in first]
        assert new_id == first[victim], (first, after)

        def all_dead() -> bool:
            return len({r.key for r in read_topic(bootstrap, dep.failed, timeout=30)}) == n

        wait_for(all_dead, 120, interval=1, what=f"{n} dead letters")
    finally:
        stop_process(sup)
    dead = _ids(read_topic(bootstrap, dep.failed, timeout=30))
    tier = _ids(read_topic(bootstrap, dep.tier("1s"), timeout=30))
    assert set(dead) == set(tier) == {f"e{i}" for i in range(n)}
    assert max(dead.values()) == 1 and max(tier.values()) == 1, "a duplicate copy"
