"""Engine v2 against a real broker: ordering under concurrency, rebalances with calls in flight,
SIGKILL with 64 calls in flight, groups sharing tiers, absurd due times."""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from retryd.config import load_settings
from retryd.handlers.loader import load_handler
from retryd.policy import headers as h
from retryd.worker.assembly import build_worker
from tests.integration import handlers
from tests.integration.worker_support import deployment, stop_process
from tests.support import (
    TEST_SESSION_TIMEOUT_MS,
    create_topics,
    json_lines,
    produce,
    read_topic,
    unique,
    wait_for,
)

TIMED = "python:tests.integration.handlers:timed"


def _lines(path: Path) -> list[dict[str, Any]]:
    return json_lines(path)


def _assert_no_overlap_in_offset_order(calls: list[dict[str, Any]], group_by: tuple[str, ...]):
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for c in calls:
        groups[tuple(c[k] for k in group_by)].append(c)
    for key, items in groups.items():
        items.sort(key=lambda c: c["start"])
        offsets = [c["offset"] for c in items]
        assert offsets == sorted(offsets), f"{key}: out of offset order {offsets[:10]}"
        for a, b in itertools.pairwise(items):
            assert b["start"] >= a["end"], f"{key}: offsets {a['offset']} and {b['offset']} overlap"
    return groups


def _max_concurrency(calls: list[dict[str, Any]]) -> int:
    events = sorted([(c["start"], 1) for c in calls] + [(c["end"], -1) for c in calls])
    now = best = 0
    for _, delta in events:
        now += delta
        best = max(best, now)
    return best


@pytest.mark.parametrize("ordering", ["key", "partition"])
def test_ordering_holds_at_64_calls_in_flight(
    bootstrap: str, tmp_path: Path, ordering: str
) -> None:
    dep = deployment(
        bootstrap,
        tmp_path,
        sequence="1s",
        partitions=3,
        handler=TIMED,
        max_in_flight=64,
        ordering=ordering,
    )
    specs = []
    for i in range(900):
        spec: dict[str, Any] = {"id": f"o{i}", "mode": "slow", "seconds": 0.004}
        if i % 5 == 0:
            spec = {"id": f"o{i}", "mode": "fail_k", "k": 1}
        specs.append(spec)
    # 30 keys over 3 partitions: each key lives on one partition, with many records
    records = [(f"k{i % 30}".encode(), json.dumps(s).encode()) for i, s in enumerate(specs)]
    produce(bootstrap, dep.main, records)

    dep.run()

    calls = handlers.CALLS
    main = [c for c in calls if c["topic"] == dep.main]
    tier = [c for c in calls if c["topic"] != dep.main]
    assert len(main) == 900 and len(tier) == 180
    group_by = ("topic", "partition", "key") if ordering == "key" else ("topic", "partition")
    _assert_no_overlap_in_offset_order(main, group_by)
    _assert_no_overlap_in_offset_order(tier, group_by)
    assert any(c["failed"] for c in main) and not all(c["failed"] for c in main)
    concurrency = _max_concurrency(main)
    print(f"\nordering={ordering}: up to {concurrency} calls in flight")
    if ordering == "partition":
        assert 1 < concurrency <= 3  # partitions in parallel, one call each
    else:
        assert concurrency > 10  # 30 keys: many keys in parallel


def test_sigkill_one_of_two_workers_with_64_calls_in_flight(bootstrap: str, tmp_path: Path) -> None:
    n = 10_000
    # One tier partition: with 4 + 1 partitions the classic cooperative-sticky assignor must
    # give the second member at least one main-topic partition (with 4 + 4 it may hand it
    # just the tier, and then A does nearly all the work before B is busy).
    dep = deployment(
        bootstrap, tmp_path, sequence="1s", partitions=4, tier_partitions=1, handler=TIMED
    )
    specs = []
    for i in range(n):
        if i % 10 == 3:
            specs.append({"id": f"m{i}", "mode": "fail_k", "k": 1})
        elif i % 10 == 7:
            specs.append({"id": f"m{i}", "mode": "non_retryable"})
        else:
            specs.append({"id": f"m{i}", "mode": "slow", "seconds": 0.02})
    by_id = {s["id"]: s for s in specs}
    env = {"RETRYD_MAX_IN_FLIGHT": "64"}
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = dep.spawn_worker(log_a, env=env)
    b = dep.spawn_worker(log_b, env=env)
    try:
        # both members own main-topic partitions before the load arrives, so A is killed in
        # the middle of its share instead of after one member raced through the backlog
        wait_for(
            lambda: all(dep.owned(p.pid).get(dep.main) for p in (a, b)),
            60,
            interval=0.2,
            what="each worker to own main-topic partitions",
        )
        produce(
            bootstrap,
            dep.main,
            [(f"k{i % 500}".encode(), json.dumps(s).encode()) for i, s in enumerate(specs)],
        )
        # kill A while it has (nearly) 64 calls in flight and B is busy too
        wait_for(
            lambda: (
                any(c["inflight"] >= 60 for c in _lines(log_a)[-200:]) and len(_lines(log_b)) > 200
            ),
            90,
            interval=0.05,
            what="both workers busy, A with ~64 calls in flight",
        )
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        killed_at = len(_lines(log_a))
        assert killed_at < n * 0.8, "worker A finished before it was killed"

        expected_dead = {s["id"] for s in specs if s["mode"] == "non_retryable"}

        def handled() -> Counter[str]:
            done: Counter[str] = Counter()
            for c in _lines(log_a) + _lines(log_b):
                if not c["failed"]:
                    done[c["id"]] += 1
            return done

        wait_for(
            lambda: set(handled()) >= set(by_id) - expected_dead,
            180,
            interval=0.5,
            what="every message handled",
        )

        def dead_letters() -> list[Any]:
            records = read_topic(bootstrap, dep.failed)
            ids = {json.loads(r.value or b"{}")["id"] for r in records}
            return records if ids >= expected_dead else []

        dead = wait_for(dead_letters, 60, interval=0.5, what="every poison message dead-lettered")
    finally:
        for proc in (a, b):
            stop_process(proc)
    done = handled()
    dead_ids = Counter(json.loads(r.value or b"{}")["id"] for r in dead)
    assert set(dead_ids) == expected_dead
    assert not (set(done) & set(dead_ids)), "a message ended in two places"
    assert set(done) | set(dead_ids) == set(by_id), "lost messages"
    dup_handled = sum(c - 1 for c in done.values())
    dup_dead = sum(c - 1 for c in dead_ids.values())
    print(
        f"\nSIGKILL with 64 in flight: {n} messages, A killed after {killed_at} calls; "
        f"duplicates: {dup_handled} handled twice, {dup_dead} dead-lettered twice"
    )


def test_revoke_with_calls_in_flight_settles_them_before_committing(
    bootstrap: str, tmp_path: Path
) -> None:
    # role=main: the group's only partitions are the main topic's, so B must take some of A's
    dep = deployment(
        bootstrap,
        tmp_path,
        sequence="1s",
        partitions=4,
        handler=TIMED,
        max_in_flight=32,
        role="main",
    )
    n = 3000  # ~9 s of work for one worker at 32 calls of 0.1 s: B joins well before the end
    specs = [{"id": f"r{i}", "mode": "slow", "seconds": 0.1} for i in range(n)]
    produce(
        bootstrap,
        dep.main,
        [(f"k{i % 200}".encode(), json.dumps(s).encode()) for i, s in enumerate(specs)],
    )
    handler = load_handler(
        dep.settings.handler,
        timeout_s=dep.settings.handler_timeout_s,
        max_in_flight=dep.settings.max_in_flight,
    )
    worker_a = build_worker(dep.settings, handler)
    thread = threading.Thread(target=worker_a.run, daemon=True)
    thread.start()
    log_b = tmp_path / "b.log"
    b = None
    try:
        wait_for(lambda: len(handlers.CALLS) > 100, 60, what="worker A busy")
        b = dep.spawn_worker(log_b, "--role", "main")
        wait_for(lambda: worker_a.summary.rebalances["revoke"] >= 1, 60, what="a revoke on A")
        wait_for(lambda: _lines(log_b), 60, what="B handling the partitions it took over")
        wait_for(
            lambda: len({c["id"] for c in handlers.CALLS} | {c["id"] for c in _lines(log_b)}) == n,
            120,
            interval=0.5,
            what="every message handled",
        )
    finally:
        worker_a.stop()
        thread.join(30)
        if b is not None:
            stop_process(b)
    a_calls, b_calls = list(handlers.CALLS), _lines(log_b)
    assert b_calls, "the second worker took over some partitions"
    ids = Counter(c["id"] for c in a_calls + b_calls)
    assert set(ids) == {s["id"] for s in specs}, "lost messages"
    # A's in-flight calls on the revoked partitions were settled and committed before the
    # partitions moved, and its queued records were left to B: nothing ran twice.
    twice = [i for i, k in ids.items() if k > 1]
    assert twice == [], f"{len(twice)} messages handled by both workers: {twice[:5]}"


def test_absurd_retry_timestamp_is_handled_a_tier_delay_after_it_was_written(
    bootstrap: str, tmp_path: Path
) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s")
    worker = build_worker(dep.settings, load_handler(dep.settings.handler, timeout_s=2.0))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(worker.book.parts) == 2, 60, what="the worker to own its partitions")
        written = int(time.time() * 1000)
        tier_headers = [
            (h.RETRY_NUMBER, b"1"),
            (h.RETRY_TIMESTAMP, str(written + 10 * 86_400_000).encode()),  # ten days
            (h.ORIGINAL_TOPIC, dep.main.encode()),
            (h.ORIGINAL_PARTITION, b"0"),
            (h.ORIGINAL_OFFSET, b"0"),
        ]
        produce(bootstrap, dep.tier("1s"), [(b"skew", b'{"id": "skew"}', tier_headers)])
        wait_for(lambda: [c for c in handlers.CALLS if c["id"] == "skew"], 10, what="the call")
    finally:
        worker.stop()
        thread.join(30)
    record = read_topic(bootstrap, dep.tier("1s"), expect=1)[0]
    [call] = [c for c in handlers.CALLS if c["id"] == "skew"]
    waited = call["called_ms"] - record.timestamp
    assert 1000 - 50 <= waited < 2500, f"handled {waited} ms after it was written"


def test_two_groups_sharing_default_tier_names_each_handle_only_their_own(
    bootstrap: str, tmp_path: Path
) -> None:
    # Default template "retry_{delay}"; an unusual delay keeps the shared tier to this test.
    sequence = "1013ms"
    deps = []
    for name in ("alpha", "beta"):
        group, main = unique(name), unique(f"{name}-main")
        settings = load_settings(
            bootstrap_servers=bootstrap,
            main_topics=main,
            retry_sequence=sequence,
            failed_topic=f"{group}.failed",
            group_id=group,
            handler="python:tests.integration.handlers:behave",
            handler_timeout_s=2.0,
            session_timeout_ms=TEST_SESSION_TIMEOUT_MS,
            max_poll_interval_ms=30_000,
            state_dir=tmp_path / name,
            poll_timeout_s=0.2,
            circuit_breaker=False,  # most records fail on purpose, from many keys
        )
        assert settings.plan.tier_topics == ["retry_1013ms"]
        create_topics(bootstrap, [main, "retry_1013ms", settings.failed_topic], 2)
        deps.append(settings)
    handlers.CALLS.clear()
    for settings in deps:
        produce(
            bootstrap,
            settings.main_topics[0],
            [
                (
                    f"{settings.group_id}-{i}".encode(),
                    json.dumps(
                        {"id": f"{settings.group_id}-{i}", "mode": "fail_k", "k": 1}
                    ).encode(),
                )
                for i in range(20)
            ],
        )
    workers = [
        build_worker(s, load_handler(s.handler, timeout_s=2.0), drain_grace_s=1.5) for s in deps
    ]
    results: dict[str, Any] = {}
    threads = [
        threading.Thread(
            target=lambda w=w: results.__setitem__(w.settings.group_id, w.run(until_drained=True))
        )
        for w in workers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    calls = handlers.CALLS
    for settings in deps:
        group = settings.group_id
        mine = [c for c in calls if c["id"].startswith(group)]
        assert sorted(c["retry_number"] for c in mine) == [0] * 20 + [1] * 20
        summary = results[group]
        assert summary.skipped == {"other_group": 20}, summary.skipped
        assert summary.total("success") == 20 and summary.total("retried") == 20
    tier = read_topic(bootstrap, "retry_1013ms", expect=40)
    assert Counter(r.header(h.GROUP) for r in tier) == {
        deps[0].group_id.encode(): 20,
        deps[1].group_id.encode(): 20,
    }
