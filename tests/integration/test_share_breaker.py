"""The outage circuit breaker in share mode, on a real Apache Kafka 4.4, run as users run it
(``python -m retryd worker``), and the same outage in group mode for comparison.

The handler (``outage`` below, loaded by the worker process) fails every call retryably while
a flag file exists, under steady load (40 records/s over 100 keys, one in fifty for a poison
key that always fails). Asserted in share mode: the circuit opens; while it is open the
handler is called by probes only (no record is acquired); after recovery every record ends in
exactly one place (handled once it succeeded, or the poison ones in ``failed_topic`` once
each, none because of the outage), and no record used a second delivery (every call saw
``delivery_count() == 1``; no dead letter for ``delivery_count_limit``). Measured (printed and
written to ``share-breaker-<mode>.json``): detection delay, handler calls while open, time to
close after recovery, time to handle everything after recovery.

Also: ``--until-drained`` refused in share mode through the CLI, and the group configuration
re-read (``GroupConfigWatch``) seeing a ``kafka-configs --alter`` on the real broker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from retryd.handlers.base import Message
from retryd.policy.circuit import CircuitAction
from retryd.runtime.circuit_control import write_command
from retryd.runtime.heartbeat import read_heartbeats
from retryd.share.group import GroupConfigWatch, read_group_config
from tests.integration.circuit_support import LOAD_PER_S, POISON, Load, circuit_of, read_now
from tests.integration.test_share_mode import (
    SHARE_ENV,
    calls,
    configure_group,
    share_deployment,
)
from tests.integration.test_share_mode import pytestmark as share_mark
from tests.integration.worker_support import REPO, deployment, stop_process
from tests.support import read_topic, wait_for

pytestmark = share_mark

OUTAGE_S = 20.0
HANDLER = "python:tests.integration.test_share_breaker:outage"
_FD: int | None = None
_LOCK = threading.Lock()


class Down(Exception):
    """Retryable: the downstream service is down."""


def outage(message: Message) -> None:
    """Fails while ``$RETRYD_TEST_DOWN`` exists (and always for the poison key); each call is
    one line of ``$RETRYD_TEST_LOG``: ``<S|F> <value> <delivery count> <wall clock s>`` (the
    share group's delivery count; 0 in group mode), one ``os.write`` on an O_APPEND file."""
    global _FD
    if _FD is None:
        with _LOCK:
            if _FD is None:
                _FD = os.open(
                    os.environ["RETRYD_TEST_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
                )
    value = (message.value or b"").decode()
    raw = message._raw
    count = getattr(raw, "delivery_count", None)
    deliveries = (count() or 0) if count is not None else 0
    ok = not value.startswith(POISON) and not os.path.exists(os.environ["RETRYD_TEST_DOWN"])
    os.write(_FD, f"{'S' if ok else 'F'} {value} {deliveries} {time.time():.6f}\n".encode())
    if not ok:
        raise Down("503 from the service")


def _calls(log: Path) -> list[tuple[bool, str, int, float]]:
    if not log.exists():
        return []
    complete = log.read_bytes()
    complete = complete[: complete.rfind(b"\n") + 1]
    out = []
    for line in complete.decode().splitlines():
        kind, value, deliveries, at = line.split()
        out.append((kind == "S", value, int(deliveries), float(at)))
    return out


@pytest.mark.parametrize("mode", ["share", "group"])
def test_an_outage_stops_acquiring_and_every_record_ends_in_one_place(
    bootstrap: str, tmp_path: Path, mode: str
) -> None:
    kw = {
        "sequence": "4s,4s",
        "handler": HANDLER,
        "partitions": 2,
        "circuit_breaker": True,
        # the default: the share worker's early probe (half of it) stays out of the outage
        "max_poll_interval_ms": 300_000,
    }
    if mode == "share":
        dep = share_deployment(bootstrap, tmp_path, **kw)  # type: ignore[arg-type]
        env = dict(SHARE_ENV)
    else:
        dep = deployment(bootstrap, tmp_path, **kw)  # type: ignore[arg-type]
        env = {"RETRYD_LOG_LEVEL": "INFO"}
    down = tmp_path / "down"
    log = tmp_path / "calls.log"
    state_dir = dep.settings.state_dir
    worker = dep.spawn_worker(log, env={**env, "RETRYD_TEST_DOWN": str(down)})
    load = Load(bootstrap, dep.main)
    try:
        wait_for(lambda: circuit_of(state_dir), 60, what="the worker's first heartbeat")
        load.thread.start()
        wait_for(lambda: sum(ok for ok, *_ in _calls(log)) >= 80, 90, what="records handled before")
        assert circuit_of(state_dir)["transitions"] == {}, "the poison key opened the circuit"

        down.touch()
        down_at = time.time()
        opened = wait_for(
            lambda: (c := circuit_of(state_dir)).get("state") == "open" and c,
            30,
            interval=0.05,
            what="the circuit to open",
        )
        wait_for(lambda: time.time() - down_at >= OUTAGE_S, OUTAGE_S + 5, interval=0.2)
        down.unlink()
        up_at = time.time()
        closed = wait_for(
            lambda: (c := circuit_of(state_dir)).get("state") == "closed" and c,
            90,
            interval=0.1,
            what="the circuit to close after recovery",
        )
        load.stop.set()
        load.thread.join(60)
        sent = set(load.sent)
        expected_ok = {b for b in sent if not b.startswith(POISON)}
        poison = sent - expected_ok

        def handled() -> bool:
            return expected_ok <= {v for ok, v, *_ in _calls(log) if ok}

        wait_for(handled, 120, interval=0.2, what="every record handled")
        drained_at = max(
            min(t for ok, v, _, t in _calls(log) if ok and v == body) for body in expected_ok
        )
        wait_for(
            lambda: len(read_topic(bootstrap, dep.failed, timeout=5)) >= len(poison),
            60,
            what="every poison record dead-lettered",
        )
    finally:
        load.stop.set()
        if down.exists():
            down.unlink()
        assert stop_process(worker) == 0

    calls = _calls(log)
    failed = read_topic(bootstrap, dep.failed)
    failed_bodies = [r.value.decode() for r in failed]
    # every record ends in exactly one place: handled, or (poison) dead-lettered once
    assert sorted(failed_bodies) == sorted(poison)
    assert not {v for ok, v, *_ in calls if ok} & poison
    successes = Counter(v for ok, v, *_ in calls if ok)
    assert [v for v, n in successes.items() if n > 1] == []  # none handled twice
    classes = {dict(r.headers).get("retryd_error_class") for r in failed}
    assert b"delivery_count_limit" not in classes
    open_from, open_to = opened["since_ms"] / 1000, closed["since_ms"] / 1000
    copies = [r for r in read_now(bootstrap, dep.tier("4s")) if not r.value.startswith(b"poison")]
    uncalled = [r for r in copies if dict(r.headers).get("retryd_error_class") == b"circuit_open"]
    while_open = [c for c in calls if open_from <= c[3] < open_to and not c[0]]
    report = {
        "mode": mode,
        "outage_s": OUTAGE_S,
        "load_per_s": LOAD_PER_S,
        "records": len(sent),
        "detection_delay_s": round(open_from - down_at, 3),
        "circuit_open_s": round(open_to - open_from, 2),
        "handler_calls_while_open": len(while_open),
        "probes": closed["probes"],
        "closed_after_recovery_s": round(open_to - up_at, 2),
        "all_handled_after_recovery_s": round(drained_at - up_at, 2),
        "max_delivery_count": max(d for _, _, d, _ in calls),
        "tier_copies_caused_by_the_outage": len(copies),
        "of_which_not_called_circuit_open": len(uncalled),
        "calls": len(calls),
    }
    (tmp_path / f"share-breaker-{mode}.json").write_text(json.dumps(report, indent=2))
    print("outage:", json.dumps(report))
    assert open_from - down_at < 5, report
    assert open_to - up_at <= 60 * 1.2 + 2, report  # the probe pending at recovery
    if mode == "share":
        # while open the share worker acquires nothing: the handler sees the probes (one per
        # reader of the process: the share worker's and the tiers worker's) and nothing else
        assert len(while_open) <= 2 * closed["probes"], report
        assert report["max_delivery_count"] == 1, report  # no record delivered twice


def test_until_drained_is_refused_in_share_mode(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RETRYD_CONSUMER_MODE": "share",
        "RETRYD_ORDERING": "none",
        "RETRYD_BOOTSTRAP_SERVERS": "127.0.0.1:1",  # never reached: refused before
        "RETRYD_MAIN_TOPICS": "orders",
        "RETRYD_HANDLER": HANDLER,
        "RETRYD_STATE_DIR": str(tmp_path / "state"),
    }
    for extra in ([], ["--processes", "2"]):
        done = subprocess.run(
            [sys.executable, "-m", "retryd", "worker", "--until-drained", *extra],
            env=env,
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert b"--until-drained does not work with consumer_mode=share" in done.stderr
    assert not (tmp_path / "state" / "heartbeats").exists() or not any(
        (tmp_path / "state" / "heartbeats").iterdir()
    )


def test_an_altered_lock_and_delivery_limit_are_read_again(bootstrap: str, tmp_path: Path) -> None:
    dep = share_deployment(bootstrap, tmp_path)
    group = dep.settings.share_group_id
    admin = AdminClient({"bootstrap.servers": bootstrap})
    watch = GroupConfigWatch(admin, read_group_config(admin, group), 2.0, 2.0)
    assert watch.refresh() is None  # as it was
    configure_group(
        bootstrap,
        group,
        {"share.record.lock.duration.ms": "20000", "share.delivery.count.limit": "3"},
    )
    changed = wait_for(watch.refresh, 30, 0.5, "the altered configuration")
    assert (changed.lock_ms, changed.delivery_limit) == (20_000, 3)
    assert watch.take() == changed and watch.take() is None


def test_role_main_reports_its_circuit_and_takes_orders(bootstrap: str, tmp_path: Path) -> None:
    """With role main the share worker is alone in its process: it writes the circuit into its
    heartbeat and applies the orders file itself. A record produced while an order holds the
    circuit open is not acquired until the circuit closes."""
    dep = share_deployment(bootstrap, tmp_path, circuit_breaker=True)
    state_dir = dep.settings.state_dir
    log = tmp_path / "calls.jsonl"
    # the first probe in 48-72 s (the early one, for max_poll_interval_ms=30 s, in 15 s)
    env = {**SHARE_ENV, "RETRYD_CIRCUIT_PROBE_S": "60"}
    worker = dep.spawn_worker(log, "--role", "main", env=env)
    try:
        dep.send([{"id": "before"}])
        wait_for(lambda: calls(log, "before"), 60, what="a record handled")
        assert circuit_of(state_dir)["state"] == "closed"
        write_command(state_dir, dep.settings.group_id, CircuitAction.OPEN, "ops")
        opened = wait_for(
            lambda: (c := circuit_of(state_dir)).get("state") == "open" and c, 30, what="open"
        )
        dep.send([{"id": "while-open"}])
        produced_at = time.time()
        # open for a few heartbeats after the record was produced, well before a probe
        wait_for(lambda: read_heartbeats(state_dir)[0].ts >= produced_at + 3, 30, what="heartbeats")
        assert calls(log, "while-open") == []
        assert circuit_of(state_dir)["state"] in ("open", "half_open")
        write_command(state_dir, dep.settings.group_id, CircuitAction.CLOSE, "ops")
        closed_at = time.time()
        (call,) = wait_for(lambda: calls(log, "while-open"), 60, what="handled once closed")
        assert call["called_ms"] / 1000 >= closed_at
        assert opened["reason"] == "opened by ops"
    finally:
        assert stop_process(worker) == 0
