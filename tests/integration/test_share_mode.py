"""consumer_mode = share on a real Apache Kafka 4.4 broker, run as users run it: ``python -m
retryd worker`` processes.

Each outcome (success, a retry through its tier and back to the handler, a dead letter with
its payload and reason), a SIGKILL mid-call (the record is handed out again after its lock
and handled, nothing lost), the last delivery (dead-lettered by retryd, not archived by the
broker), the start-up refusals and the lock check. The share group's record lock is set to
15 s, the broker's minimum (a killed worker's records come back when it expires, or sooner
when the broker sees the connection close); joining a share group takes a few seconds.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer

from tests.integration.worker_support import Deployment, deployment, stop_process
from tests.support import (
    ON_TANSU,
    broker_older_than,
    json_lines,
    produce,
    read_topic,
    set_group_configs,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    ON_TANSU or broker_older_than(4, 2),
    reason="share groups (KIP-932) need Apache Kafka 4.2 or newer",
)

LOCK_MS = 15_000  # the broker's minimum (group.share.min.record.lock.duration.ms)
SHARE_ENV = {"RETRYD_CONSUMER_MODE": "share", "RETRYD_LOG_LEVEL": "INFO"}


def share_deployment(bootstrap: str, tmp_path: Path, *, limit: int = 5, **kw: Any) -> Deployment:
    d = deployment(bootstrap, tmp_path, ordering="none", consumer_mode="share", **kw)
    configure_group(
        bootstrap,
        d.settings.share_group_id,
        {
            "share.record.lock.duration.ms": str(LOCK_MS),
            "share.delivery.count.limit": str(limit),
        },
    )
    return d


def configure_group(bootstrap: str, group: str, entries: dict[str, str]) -> None:
    set_group_configs(bootstrap, group, entries, 15)


def spawn(d: Deployment, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return d.spawn_worker(log, env={**SHARE_ENV, **env})


def calls(log: Path, ident: str) -> list[dict]:
    return [c for c in json_lines(log) if c["id"] == ident]


def output(proc: subprocess.Popen[bytes], log: Path) -> str:
    """What the worker printed (spawn_worker writes it next to the handler's log)."""
    return "\n".join(p.read_text() for p in sorted(log.parent.glob(f"{log.stem}.*.stderr")))


def left_in_group(d: Deployment, sentinel: str) -> list[int]:
    """Offsets the share group still hands out, up to a sentinel produced now: the records
    no worker acknowledged come first (lower offsets, available again)."""
    produce(d.bootstrap, d.main, [(b"s", json.dumps({"id": sentinel}).encode())])
    consumer = ShareConsumer(
        {
            "bootstrap.servers": d.bootstrap,
            "group.id": d.settings.share_group_id,
            "share.acknowledgement.mode": "explicit",
        }
    )
    seen: list[int] = []
    try:
        consumer.subscribe([d.main])

        def reached() -> bool:
            got = False
            for msg in consumer.poll(0.5):
                assert msg.error() is None, msg.error()
                consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                if json.loads(msg.value())["id"] == sentinel:
                    got = True
                else:
                    seen.append(msg.offset())
            consumer.commit_sync(10)
            return got

        wait_for(reached, 40, 0, "the sentinel through the share group")
    finally:
        consumer.close()
    return seen


def test_each_outcome_through_the_cli(bootstrap: str, tmp_path: Path) -> None:
    d = share_deployment(bootstrap, tmp_path, sequence="1s", non_retryable=["PoisonError"])
    d.send(
        [
            {"id": "ok"},
            {"id": "again", "mode": "fail_k", "k": 1},  # fails on the main topic only
            {"id": "poison", "mode": "non_retryable"},
            {"id": "always", "mode": "always"},  # main, its one tier, then exhausted
        ]
    )
    log = tmp_path / "calls.jsonl"
    worker = spawn(d, log)
    try:
        wait_for(
            lambda: len(calls(log, "again")) == 2 and len(calls(log, "always")) == 2,
            60,
            what="the retried records back from their tier",
        )
        dead = read_topic(bootstrap, d.failed, expect=2, timeout=30)
        by_id = {json.loads(r.value)["id"]: r for r in dead}
        assert sorted(by_id) == ["always", "poison"]
        assert by_id["poison"].header("retryd_dead_reason") == b"non_retryable"
        assert by_id["poison"].key == b"poison"  # the payload goes with the reason
        assert json.loads(by_id["poison"].value)["mode"] == "non_retryable"
        assert by_id["always"].header("retryd_dead_reason") == b"exhausted"
        tier = read_topic(bootstrap, d.tier("1s"), expect=2)
        assert {json.loads(r.value)["id"] for r in tier} == {"again", "always"}
        for copy in tier:
            assert copy.header("retry_number") == b"1"
            assert int(copy.header("retry_timestamp") or 0) >= copy.timestamp + 1000
            assert copy.header("retryd_original_topic") == d.main.encode()
        again = calls(log, "again")
        assert [c["topic"] for c in again] == [d.main, d.tier("1s")]
        assert again[1]["called_ms"] >= again[1]["retry_timestamp"]  # never early
        assert [c["topic"] for c in calls(log, "ok")] == [d.main]
        assert [c["topic"] for c in calls(log, "poison")] == [d.main]
        # the main topic's records went through the share group, the tiers through the group
        assert "share worker: share group " + d.settings.share_group_id in output(worker, log)
    finally:
        assert stop_process(worker) == 0
    assert left_in_group(d, "sentinel") == []  # every record was acknowledged


def test_a_worker_killed_mid_call_loses_nothing(bootstrap: str, tmp_path: Path) -> None:
    d = share_deployment(bootstrap, tmp_path, handler_timeout_s=10.0)
    d.send([{"id": "slow", "mode": "slow", "seconds": 4}, *({"id": f"r{i}"} for i in range(6))])
    log = tmp_path / "calls.jsonl"
    first = spawn(d, log)
    try:
        wait_for(lambda: calls(log, "slow"), 40, what="the slow call to start")
        first.send_signal(signal.SIGKILL)  # mid-call: nothing of its batch was acknowledged
        first.wait(10)
    finally:
        stop_process(first)
    killed = {c["pid"] for c in json_lines(log)}
    second = spawn(d, log)
    try:
        # the broker hands the records out again once their lock expires (15 s), or as soon as
        # it sees the killed worker's connection close: none of its batch was acknowledged,
        # so all of it comes back
        every = {"slow", *(f"r{i}" for i in range(6))}
        wait_for(
            lambda: {c["id"] for c in json_lines(log) if c["pid"] == second.pid} >= every,
            60,
            what="the killed worker's records handled again",
        )
        slow = calls(log, "slow")
        assert {c["pid"] for c in slow} == killed | {second.pid}
    finally:
        assert stop_process(second) == 0
    assert read_topic(bootstrap, d.failed) == []
    assert left_in_group(d, "sentinel") == []


def test_the_last_delivery_is_dead_lettered_not_archived(bootstrap: str, tmp_path: Path) -> None:
    d = share_deployment(bootstrap, tmp_path, limit=2, handler_timeout_s=10.0)
    d.send([{"id": "crashes", "mode": "slow", "seconds": 8}])
    log = tmp_path / "calls.jsonl"
    first = spawn(d, log)
    try:
        wait_for(lambda: calls(log, "crashes"), 40, what="the first delivery's call")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        stop_process(first)
    second = spawn(d, log)
    try:
        (dead,) = read_topic(bootstrap, d.failed, expect=1, timeout=60)
    finally:
        assert stop_process(second) == 0
    assert dead.key == b"crashes" and json.loads(dead.value)["seconds"] == 8
    assert dead.header("retryd_dead_reason") == b"exhausted"
    assert dead.header("retryd_error_class") == b"delivery_count_limit"
    assert b"delivered 2 times (share.delivery.count.limit=2)" in (
        dead.header("retryd_error_message") or b""
    )
    assert dead.header("retryd_original_topic") == d.main.encode()
    assert len(calls(log, "crashes")) == 1  # the last delivery does not call the handler
    assert left_in_group(d, "sentinel") == []


def test_sigterm_finishes_the_call_in_hand_and_releases_the_rest(
    bootstrap: str, tmp_path: Path
) -> None:
    d = share_deployment(bootstrap, tmp_path, max_in_flight=1)
    d.send([{"id": "slow", "mode": "slow", "seconds": 3}, {"id": "waits"}])
    log = tmp_path / "calls.jsonl"
    worker = spawn(d, log)
    try:
        wait_for(lambda: calls(log, "slow"), 40, what="the slow call to start")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        stop_process(worker)
    text = output(worker, log)
    assert calls(log, "waits") == [], text  # nothing starts after the signal
    # the call in hand ended and was accepted; the record that had not started was released
    # (by the worker, or by the broker when the worker left the group, if it was still in the
    # client's next fetch), so the group hands it out again
    assert left_in_group(d, "sentinel") == [1], text


def test_sigterm_while_starting_exits_zero_and_takes_nothing(
    bootstrap: str, tmp_path: Path
) -> None:
    """A SIGTERM while the share worker still builds (its handler import blocks) ends the
    start with exit 0, and the record stays with the group for the next member."""
    d = share_deployment(bootstrap, tmp_path)
    d.send([{"id": "kept"}])
    code, text = d.stopped_while_starting(tmp_path / "calls.jsonl", SHARE_ENV)
    assert code == 0, text
    assert "received SIGTERM" in text
    assert left_in_group(d, "sentinel") == [0], text  # "kept" (offset 0), never taken


def _exit(d: Deployment, tmp_path: Path, name: str, **env: str) -> tuple[int, str]:
    log = tmp_path / f"{name}.jsonl"
    proc = spawn(d, log, **env)
    try:
        code = proc.wait(60)
    finally:
        stop_process(proc)
    return code, output(proc, log)


def test_start_up_refusals(bootstrap: str, tmp_path: Path) -> None:
    d = share_deployment(bootstrap, tmp_path)
    code, text = _exit(d, tmp_path, "order", RETRYD_ORDERING="key")
    assert code == 2, text
    assert "consumer_mode=share needs ordering=none (ordering=key)" in text
    code, text = _exit(d, tmp_path, "strict", RETRYD_KEY_ORDER="strict")
    assert code == 2 and "does not work with key_order=strict" in text, text
    code, text = _exit(d, tmp_path, "eos", RETRYD_EXACTLY_ONCE="true")
    assert code == 2 and "does not work with exactly_once" in text, text
    # the lock check reads the group's lock (15 s): 14 s + 2 s to route and acknowledge is over
    code, text = _exit(d, tmp_path, "lock", RETRYD_HANDLER_TIMEOUT_S="14")
    assert code == 4, text
    assert (
        f"handler_timeout_s=14 plus 2s to route and acknowledge must stay below share group "
        f"{d.settings.share_group_id}'s record lock, share.record.lock.duration.ms=15000"
    ) in text
    # quick retries count: 3 x 4 s + 2 x 0.5 s = 13 s
    code, text = _exit(
        d,
        tmp_path,
        "quick",
        RETRYD_HANDLER_TIMEOUT_S="4",
        RETRYD_RETRY_SEQUENCE="1s, quick=2@500ms",
    )
    assert code == 4 and "handler_timeout_s=4 (13s with its quick retries)" in text, text


def test_the_share_worker_sets_a_new_group_to_start_at_the_beginning(
    bootstrap: str, tmp_path: Path
) -> None:
    d = deployment(bootstrap, tmp_path, ordering="none", consumer_mode="share")
    d.send([{"id": "before"}])  # produced before any member of the group exists
    log = tmp_path / "calls.jsonl"
    worker = spawn(d, log, RETRYD_HANDLER_TIMEOUT_S="2", RETRYD_PROCESSES="1")
    try:
        wait_for(lambda: calls(log, "before"), 40, what="the record produced before the join")
        assert "share.auto.offset.reset set to earliest" in output(worker, log)
    finally:
        assert stop_process(worker) == 0


def test_role_main_leaves_the_tiers_to_a_tiers_worker(bootstrap: str, tmp_path: Path) -> None:
    d = share_deployment(bootstrap, tmp_path, sequence="1s")
    d.send([{"id": "again", "mode": "fail_k", "k": 1}])
    log = tmp_path / "calls.jsonl"
    main = spawn(d, log, RETRYD_ROLE="main")
    tiers = subprocess.Popen(
        [sys.executable, "-m", "retryd", "worker", "--role", "tiers"],
        env={**d.env(), "RETRYD_TEST_LOG": str(log), **SHARE_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: len(calls(log, "again")) == 2, 60, what="the retry from its tier")
        by_pid = {c["topic"]: c["pid"] for c in calls(log, "again")}
        assert by_pid == {d.main: main.pid, d.tier("1s"): tiers.pid}
    finally:
        assert stop_process(main) == 0
        assert stop_process(tiers) == 0


def test_traces_go_from_the_share_call_to_its_tier_copy(bootstrap: str, tmp_path: Path) -> None:
    """With tracing on (OTEL_* variables), a main-topic call is a span of the producer's trace
    and its tier copy carries that call's traceparent, so the tier call joins the same trace."""
    producer_span = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    d = share_deployment(bootstrap, tmp_path, sequence="1s")
    d.send([{"id": "traced", "mode": "fail_k", "k": 1}], headers=[("traceparent", producer_span)])
    log = tmp_path / "calls.jsonl"
    worker = spawn(d, log, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="share-test")
    try:
        wait_for(lambda: len(calls(log, "traced")) == 2, 60, what="the call and its retry")
    finally:
        assert stop_process(worker) == 0
    (copy,) = read_topic(bootstrap, d.tier("1s"), expect=1)
    parent = (copy.header("traceparent") or b"").decode()
    _, trace_id, span_id, _ = parent.split("-")
    assert trace_id == "0af7651916cd43dd8448eb211c80319c"  # the producer's trace
    assert span_id != "b7ad6b7169203331"  # the share call's own span
    text = output(worker, log)
    assert text.count('"trace_id": "0x0af7651916cd43dd8448eb211c80319c"') >= 2, text[-3000:]


def test_the_sidecar_names_the_mode_and_counts_acknowledgements(
    bootstrap: str, tmp_path: Path
) -> None:
    from tests.integration.sidecar_support import SidecarProcess
    from tests.integration.test_sidecar_metrics import scrape, sidecar_env, value

    d = share_deployment(bootstrap, tmp_path, sequence="1s")
    d.send([{"id": f"ok{i}"} for i in range(5)] + [{"id": "again", "mode": "fail_k", "k": 1}])
    log = tmp_path / "calls.jsonl"
    worker = spawn(d, log, RETRYD_PROCESSES="2")
    env = sidecar_env(d, d.settings.state_dir, "1s")
    env.extra.update(RETRYD_CONSUMER_MODE="share", RETRYD_ORDERING="none")
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    try:
        wait_for(lambda: len(calls(log, "again")) == 2, 60, what="the retry from its tier")
        with sidecar:

            def counted() -> dict:
                m = scrape(sidecar.url)
                accepted = value(m, "retryd_share_acknowledgements_total", type="accept")
                return m if accepted == 6 else {}

            m = wait_for(counted, 30, what="6 acknowledgements in /metrics")
            assert value(m, "retryd_consumer_mode", mode="share") == 1
            assert value(m, "retryd_consumer_mode", mode="group") == 0
            assert value(m, "retryd_share_acknowledgements_total", type="release") == 0
            assert value(m, "retryd_messages_total", topic=d.main, outcome="success") == 5
            assert value(m, "retryd_messages_total", topic=d.main, outcome="retried") == 1
            assert value(m, "retryd_messages_total", topic=d.tier("1s"), outcome="success") == 1
            # lag: the main topic's is the share group's (reported by the worker, labelled
            # share_group; tests/integration/test_share_lag.py), never the consumer group's
            for name, labels in m:
                if name == "retryd_consumer_lag" and dict(labels)["topic"] == d.main:
                    assert dict(labels).get("share_group") == d.settings.share_group_id, labels
    finally:
        assert stop_process(worker) == 0
