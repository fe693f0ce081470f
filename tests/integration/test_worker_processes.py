"""Worker processes under failure: SIGKILL mid-stream loses nothing; SIGTERM exits cleanly."""

from __future__ import annotations

import json
import re
import signal
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from retryd.runtime.paths import heartbeat_dir
from tests.integration.worker_support import deployment, stop_process
from tests.support import json_lines, read_topic, wait_for


def _lines(path: Path) -> list[dict]:
    return json_lines(path)


def _specs(n: int) -> list[dict]:
    specs = []
    for i in range(n):
        if i % 10 == 3:
            specs.append({"id": f"m{i}", "mode": "fail_k", "k": 1})
        elif i % 10 == 7:
            specs.append({"id": f"m{i}", "mode": "non_retryable"})
        else:
            specs.append({"id": f"m{i}", "mode": "slow", "seconds": 0.001})
    return specs


def _terminal_handled(calls: list[dict], specs: dict[str, dict]) -> Counter[str]:
    """Ids whose handler call succeeded (a fail_k message succeeds on its k-th retry)."""
    done: Counter[str] = Counter()
    for call in calls:
        spec = specs[call["id"]]
        if spec["mode"] == "slow" or (
            spec["mode"] == "fail_k" and call["retry_number"] >= spec["k"]
        ):
            done[call["id"]] += 1
    return done


def test_sigterm_during_load_exits_zero_with_offsets_committed(
    bootstrap: str, tmp_path: Path
) -> None:
    n = 3000
    dep = deployment(bootstrap, tmp_path, sequence="1s", partitions=2)
    specs = [{"id": f"t{i}", "mode": "slow", "seconds": 0.002} for i in range(n)]
    dep.send(specs)
    log1 = tmp_path / "w1.log"
    w1 = dep.spawn_worker(log1)
    try:
        wait_for(lambda: len(_lines(log1)) > 500, 60, what="worker busy")
        w1.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = w1.wait(20)
        took = time.monotonic() - t0
    finally:
        stop_process(w1)
    assert code == 0
    first = _lines(log1)
    assert len(first) < n, "finished before SIGTERM: make the stream longer"
    print(f"\nSIGTERM: exited 0 in {took:.2f}s after {len(first)} messages")

    # committed offsets cover exactly what was handled, partition by partition
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": dep.settings.group_id})
    try:
        committed = reader.committed([TopicPartition(dep.main, p) for p in (0, 1)], timeout=10)
    finally:
        reader.close()
    handled_max: dict[int, int] = {}
    for c in first:
        handled_max[c["partition"]] = max(handled_max.get(c["partition"], -1), c["offset"])
    for tp in committed:
        if tp.partition in handled_max:
            assert tp.offset == handled_max[tp.partition] + 1, (tp, handled_max)
        else:
            assert tp.offset < 0, f"nothing handled on {tp.partition} but {tp.offset} committed"

    # a second worker finishes the rest: nothing lost, nothing handled twice
    log2 = tmp_path / "w2.log"
    w2 = dep.spawn_worker(log2, "--until-drained")
    try:
        assert w2.wait(120) == 0
    finally:
        stop_process(w2)
    ids = Counter(c["id"] for c in first + _lines(log2))
    assert set(ids) == {s["id"] for s in specs}
    assert max(ids.values()) == 1
    assert read_topic(bootstrap, dep.failed) == []


def test_supervisor_with_two_processes_drains_the_group_and_exits_zero(
    bootstrap: str, tmp_path: Path
) -> None:
    n = 600
    dep = deployment(bootstrap, tmp_path, sequence="1s,1s", partitions=2)
    specs = _specs(n)
    by_id = {s["id"]: s for s in specs}
    dep.send(specs)
    log = tmp_path / "sup.log"
    sup = dep.spawn_worker(log, "--processes", "2", "--until-drained")
    try:
        code = sup.wait(120)
    finally:
        stop_process(sup)
    assert code == 0
    calls = _lines(log)
    assert len({c["pid"] for c in calls}) == 2, "both processes took part"
    handled = _terminal_handled(calls, by_id)
    dead = read_topic(bootstrap, dep.failed)
    dead_ids = {json.loads(r.value or b"{}")["id"] for r in dead}
    assert set(handled) | dead_ids == set(by_id)
    assert dead_ids == {s["id"] for s in specs if s["mode"] == "non_retryable"}


def test_main_and_tier_roles_in_separate_processes(bootstrap: str, tmp_path: Path) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s,1s", partitions=2)
    specs = [{"id": f"r{i}", "mode": "always" if i % 2 else "fail_k", "k": 1} for i in range(20)]
    dep.send(specs)
    log_main, log_tiers = tmp_path / "main.log", tmp_path / "tiers.log"
    main = dep.spawn_worker(log_main, "--role", "main")
    tiers = dep.spawn_worker(log_tiers, "--role", "tiers")
    try:
        dead = read_topic(bootstrap, dep.failed, expect=10, timeout=90)
        wait_for(lambda: len(_lines(log_tiers)) >= 10 + 20, 60, what="every tier call")
    finally:
        assert stop_process(main) == 0
        assert stop_process(tiers) == 0
    main_calls, tier_calls = _lines(log_main), _lines(log_tiers)
    assert {c["topic"] for c in main_calls} == {dep.main}
    assert {c["topic"] for c in tier_calls} == {dep.tier("1s")}
    assert sorted(c["id"] for c in main_calls) == sorted(s["id"] for s in specs)
    assert {json.loads(r.value or b"{}")["id"] for r in dead} == {f"r{i}" for i in range(1, 20, 2)}


def psutil_alive(pid: int) -> bool:
    from retryd.runtime.heartbeat import pid_alive

    return pid_alive(pid)


def _stderr(log: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in log.parent.glob(f"{log.stem}.*.stderr"))


def test_supervisor_restarts_a_child_that_fails_at_runtime_and_keeps_the_others(
    bootstrap: str, tmp_path: Path
) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s", partitions=2, handler_timeout_s=0.5)
    log = tmp_path / "sup.log"
    sup = dep.spawn_worker(
        log,
        "--processes",
        "2",
        env={"RETRYD_MAX_ABANDONED_HANDLERS": "1", "RETRYD_ORDERING": "none"},
    )
    try:
        # The records come once the group has settled (each child owns one main partition,
        # every tier partition is owned): a child that hung while the group still rebalanced
        # could have its final commit refused (ILLEGAL_GENERATION), and the next owner of
        # partition 0 would then hang on the same records and exit too.
        def settled() -> bool:
            pids = re.findall(r"started worker process pid=(\d+)", _stderr(log))
            assigned = []
            for pid in pids:
                path = heartbeat_dir(dep.settings.state_dir) / f"{pid}.json"
                try:
                    assigned.append(json.loads(path.read_text())["assigned_partitions"])
                except (OSError, ValueError, KeyError):
                    return False
            # each child's main member owns one main partition, its tiers member one tier's
            return assigned == [2, 2]

        wait_for(settled, 90, what="each child to own its partitions")
        # Two hung calls in the process that owns partition 0 exceed max_abandoned_handlers=1:
        # that child exits with the runtime-fault status and must be restarted.
        hangs = [
            (b"h%d" % i, json.dumps({"id": f"hang{i}", "mode": "hang"}).encode()) for i in range(2)
        ]
        from tests.support import produce

        produce(bootstrap, dep.main, hangs, partition=0)
        oks = [{"id": f"ok{i}", "mode": "slow", "seconds": 0.01} for i in range(400)]
        dep.send(oks)
        wait_for(
            lambda: "failed at runtime (status 5); restarting it" in _stderr(log),
            60,
            what="the supervisor to restart the failed child",
        )
        wanted = {s["id"] for s in oks} | {"hang0", "hang1"}
        wait_for(
            lambda: (
                {c["id"] for c in _lines(log) if not c["id"].startswith("hang")}
                | {c["id"] for c in _lines(log) if c["retry_number"] == 1}
                >= wanted
            ),
            90,
            what="every message handled (the hung ones on their retry)",
        )
        started = wait_for(
            lambda: (s := re.findall(r"started worker process pid=(\d+)", _stderr(log)))[2:] and s,
            30,
            what="the replacement child (after the restart backoff)",
        )
        assert len(started) == 3, f"two children plus one replacement: {started}"
        failed = re.findall(r"worker process pid=(\d+) failed at runtime", _stderr(log))
        assert len(failed) == 1
        survivor = next(pid for pid in started[:2] if pid != failed[0])
        assert psutil_alive(int(survivor)), "the other child kept running"
        assert psutil_alive(int(started[2])), "the replacement is running"
        assert sup.poll() is None, "the supervisor keeps running"
    finally:
        code = stop_process(sup)
    assert code == 0
    hung = [c for c in _lines(log) if c["id"].startswith("hang")]
    assert {c["retry_number"] for c in hung} == {0, 1}  # timed out, retried, handled


def test_supervisor_stops_the_group_when_a_child_cannot_start(
    bootstrap: str, tmp_path: Path
) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s", partitions=2)
    log = tmp_path / "bad.log"
    sup = dep.spawn_worker(
        log, "--processes", "2", env={"RETRYD_HANDLER": "python:tests.no_such_module_xyz:f"}
    )
    try:
        code = sup.wait(60)
    finally:
        stop_process(sup)
    assert code == 4
    err = _stderr(log)
    assert "cannot import module 'tests.no_such_module_xyz'" in err
    assert "cannot start" in err and "stopping the group" in err
    assert "restarting" not in err


def test_sigterm_while_starting_exits_zero_without_consuming(
    bootstrap: str, tmp_path: Path
) -> None:
    """A SIGTERM that arrives while the worker is still building (here: its handler import
    blocks) ends the start cleanly: exit 0, nothing consumed or committed. Before, Python's
    default disposition was still in place and the process died with -15."""
    dep = deployment(bootstrap, tmp_path, sequence="1s")
    dep.send([{"id": "s1", "mode": "ok"}])
    code, output = dep.stopped_while_starting(tmp_path / "w.log", {})
    assert code == 0, output
    assert "received SIGTERM" in output
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": dep.settings.group_id})
    try:
        committed = consumer.committed([TopicPartition(dep.main, 0)], timeout=10)
    finally:
        consumer.close()
    assert committed[0].offset < 0  # nothing committed: the worker never consumed
