"""The outage circuit breaker on real Kafka, with the CLI worker at its default breaker settings
calling a real HTTP business service: the service answers 503 to everything for 30 s under
steady load.

Asserted: no record reaches ``failed_topic`` because of the outage, the tier copies made
before the circuit opened are bounded by the detection window, nothing is lost, processing
resumes within one probe interval of the service's recovery, and a poison key under the same
load goes its normal way to ``failed_topic`` without ever opening the circuit. Measured (printed
and written to ``circuit-outage.json`` in the test's directory): detection delay, tier copies,
calls spent on the dead service per minute while open, time to resume.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from retryd.policy.circuit import CircuitAction
from retryd.runtime.circuit_control import write_command
from tests.integration.circuit_support import (
    LOAD_PER_S,
    POISON,
    Load,
    Service,
    circuit_of,
    circuits,
    ok_bodies,
    read_now,
    service,
)
from tests.integration.worker_support import deployment, stop_process
from tests.support import read_topic, wait_for

__all__ = ["service"]  # the fixture

OUTAGE_S = 30.0


def test_a_30s_outage_opens_the_circuit_and_loses_nothing(
    bootstrap: str, tmp_path: Path, service: str
) -> None:
    # tier delays longer than detection takes: a copy made while detecting is held when it
    # comes due, never dead-lettered (a 1 s sequence could run out before the circuit opens)
    dep = deployment(
        bootstrap, tmp_path, sequence="4s,4s", handler=service, partitions=2, circuit_breaker=True
    )
    state_dir = dep.settings.state_dir
    worker = dep.spawn_worker(tmp_path / "worker.log")
    load = Load(bootstrap, dep.main)
    try:
        wait_for(lambda: circuit_of(state_dir), 60, what="the worker's first heartbeat")
        load.thread.start()
        # warm: the poison key fails its way to failed_topic, the circuit stays closed
        wait_for(
            lambda: len(read_now(bootstrap, dep.failed)) >= 2,
            60,
            what="poison records dead-lettered before the outage",
        )
        assert circuit_of(state_dir)["transitions"] == {}, "the poison key opened the circuit"

        Service.down = True
        down_at = time.time()
        opened = wait_for(
            lambda: (c := circuit_of(state_dir)).get("state") == "open" and c,
            30,
            interval=0.05,
            what="the circuit to open",
        )
        detection_s = opened["since_ms"] / 1000 - down_at
        wait_for(lambda: time.time() - down_at >= OUTAGE_S, OUTAGE_S + 5, interval=0.2)
        Service.down = False
        up_at = time.time()
        closed = wait_for(
            lambda: (c := circuit_of(state_dir)).get("state") == "closed" and c,
            90,
            interval=0.1,
            what="the circuit to close after recovery",
        )
        resumed_s = closed["since_ms"] / 1000 - up_at
        load.stop.set()
        load.thread.join(60)

        sent = set(load.sent)
        expected_ok = {b for b in sent if not b.startswith(POISON)}
        poison = sent - expected_ok

        def handled() -> bool:
            with Service.lock:
                ok = {body for _, body, status in Service.calls if status == 200}
            return expected_ok <= ok

        wait_for(handled, 120, interval=0.2, what="every record handled")
        wait_for(
            lambda: len(read_now(bootstrap, dep.failed)) >= len(poison),
            60,
            what="every poison record dead-lettered",
        )
    finally:
        load.stop.set()
        assert stop_process(worker) == 0

    failed = read_topic(bootstrap, dep.failed)
    failed_bodies = [r.value.decode() for r in failed]
    assert sorted(failed_bodies) == sorted(poison)  # 0 caused by the outage, each poison once
    tier_bodies = [
        r.value.decode() for delay in ("4s",) for r in read_topic(bootstrap, dep.tier(delay))
    ]
    outage_copies = [b for b in tier_bodies if not b.startswith(POISON)]
    with Service.lock:
        calls = list(Service.calls)
    open_s = closed["since_ms"] / 1000 - opened["since_ms"] / 1000
    dead_calls = [
        c
        for c in calls
        if opened["since_ms"] / 1000 <= c[0] < closed["since_ms"] / 1000 and c[2] == 503
    ]
    report = {
        "outage_s": OUTAGE_S,
        "load_per_s": LOAD_PER_S,
        "detection_delay_s": round(detection_s, 3),
        "tier_copies_caused_by_the_outage": len(outage_copies),
        "failed_topic_records_caused_by_the_outage": len(failed_bodies) - len(poison),
        "circuit_open_s": round(open_s, 2),
        "calls_on_the_dead_service_while_open": len(dead_calls),
        "calls_per_minute_while_open": round(len(dead_calls) / (open_s / 60), 1),
        "resumed_after_recovery_s": round(resumed_s, 2),
        "probes": closed["probes"],
        "held_in_place": closed["held"],
        "records": len(sent),
    }
    (tmp_path / "circuit-outage.json").write_text(json.dumps(report, indent=2))
    print("circuit outage:", json.dumps(report))

    # issue 23: "opens the circuit within 2 s". The window needs half of its last 100 calls
    # failed: ~50 failures, 1.25 s at this load, seen in the idle worker's polls (0.5 s
    # apart, so 1.0-1.75 s), then one confirming call of a failed record (milliseconds)
    assert detection_s < 2, report
    # before it opened: the detection window (min 20 failures, 50 % of the last 100 calls),
    # plus the calls in flight (max_in_flight 16)
    assert len(outage_copies) <= 100 + 16, report
    # the probe interval doubles from 5 s (+-20 %) up to 60 s: the one pending at recovery
    assert resumed_s <= 60 * 1.2 + 2, report
    assert closed["held"] > 0


def test_with_processes_each_child_decides_alone_and_every_child_takes_orders(
    bootstrap: str, tmp_path: Path, service: str
) -> None:
    dep = deployment(
        bootstrap,
        tmp_path,
        sequence="30s",
        handler=service,
        partitions=2,
        # each child gets one main partition (the classic protocol may give one child every
        # main partition and the other only the tier's: README, "Group protocol")
        group_protocol="consumer",
        circuit_breaker=True,
    )
    state_dir = dep.settings.state_dir
    sup = dep.spawn_worker(tmp_path / "worker.log", "--processes", "2")
    load = Load(bootstrap, dep.main)

    def states() -> list[str]:
        return sorted(str(c.get("state")) for c in circuits(state_dir).values())

    try:
        wait_for(lambda: len(circuits(state_dir)) == 2, 60, what="both children's heartbeats")
        # each child sees the failures of its own main partition (a child owning only tier
        # partitions would see none, and rightly stay closed)
        wait_for(
            lambda: all(dep.owned(pid).get(dep.main) for pid in circuits(state_dir)),
            60,
            what="each child to own a main partition",
        )
        write_command(state_dir, dep.settings.group_id, CircuitAction.OPEN, "ops")
        wait_for(lambda: states() == ["open", "open"], 30, what="the order in both children")
        write_command(state_dir, dep.settings.group_id, CircuitAction.CLOSE, "ops")
        wait_for(lambda: states() == ["closed", "closed"], 30, what="closed in both")

        load.thread.start()
        wait_for(lambda: len(ok_bodies()) >= 40, 60, what="both children to handle records")
        Service.down = True  # each child sees its own partition's failures and opens alone
        wait_for(lambda: states() == ["open", "open"], 30, interval=0.05, what="both open")
        Service.down = False
        wait_for(lambda: states() == ["closed", "closed"], 90, what="both closed again")
    finally:
        load.stop.set()
        assert stop_process(sup) == 0
    # the copies made while a child was detecting wait 30 s in their tier, longer than it
    # takes each child to open (each sees half the load, so detects later than one process)
    failed = [r.value.decode() for r in read_now(bootstrap, dep.failed)]
    assert all(body.startswith(POISON) for body in failed), failed
