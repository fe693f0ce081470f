"""The outage circuit breaker under SIGKILL: two CLI workers call a real HTTP service that goes
down under steady load; a worker is SIGKILLed while its circuit is open (holding failed records
in place, uncommitted), another right after the service came back (while circuits close), and
each is restarted. Nothing is lost, nothing reaches ``failed_topic`` because of the outage, and
every record of the poison key ends there."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.circuit_support import (
    POISON,
    Load,
    Service,
    circuits,
    ok_bodies,
    read_now,
    service,
)
from tests.integration.worker_support import deployment, stop_process
from tests.support import read_topic, wait_for

__all__ = ["service"]  # the fixture

BREAKER = {"RETRYD_CIRCUIT_PROBE_S": "1", "RETRYD_CIRCUIT_PROBE_MAX_S": "2"}


@pytest.mark.chaos
def test_sigkill_workers_while_the_circuit_is_open_and_closing(
    bootstrap: str, tmp_path: Path, service: str
) -> None:
    # tier delays longer than detection takes (a restarted worker detects the outage anew):
    # a copy made while detecting is held when it comes due, never dead-lettered
    dep = deployment(
        bootstrap, tmp_path, sequence="8s,8s", handler=service, partitions=4, circuit_breaker=True
    )
    state_dir = dep.settings.state_dir
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = [dep.spawn_worker(logs / f"w{i}.log", env=BREAKER) for i in range(2)]
    load = Load(bootstrap, dep.main)
    kills = 0

    def open_circuits() -> int:
        return sum(1 for c in circuits(state_dir).values() if c.get("state") != "closed")

    def kill_and_restart(i: int) -> None:
        nonlocal kills
        workers[i].kill()  # SIGKILL: held records and unacknowledged work die with it
        workers[i].wait(10)
        kills += 1
        workers[i] = dep.spawn_worker(logs / f"w{i}-{kills}.log", env=BREAKER)

    try:
        wait_for(lambda: len(circuits(state_dir)) == 2, 60, what="two workers' heartbeats")
        load.thread.start()
        wait_for(lambda: len(ok_bodies()) >= 40, 60, what="the workers to handle records")

        Service.down = True
        wait_for(lambda: open_circuits() >= 1, 30, interval=0.05, what="a circuit to open")
        kill_and_restart(0)
        wait_for(lambda: open_circuits() >= 1, 60, interval=0.1, what="a circuit open again")
        kill_and_restart(1)
        wait_for(lambda: open_circuits() >= 1, 60, interval=0.1, what="a circuit open again")
        time.sleep(3)  # the outage's length (the fault schedule, not a synchronisation)
        Service.down = False
        kill_and_restart(0)  # while the circuits close
        load.stop.set()
        load.thread.join(60)

        expected_ok = {b for b in load.sent if not b.startswith(POISON)}
        poison = set(load.sent) - expected_ok
        wait_for(lambda: expected_ok <= ok_bodies(), 180, interval=0.2, what="every record")
        # by body, not by count: a kill may write one poison record's dead letter twice, and
        # a count would then be reached while another is still on its way
        wait_for(
            lambda: poison <= {r.value.decode() for r in read_now(bootstrap, dep.failed)},
            120,
            what="every poison record dead-lettered",
        )
    finally:
        load.stop.set()
        codes = [stop_process(w) for w in workers]
    assert codes == [0, 0]

    failed = [r.value.decode() for r in read_topic(bootstrap, dep.failed)]
    # none because of the outage; every poison record (a kill between its dead letter's
    # acknowledgement and its offset's commit may write one twice: at-least-once)
    assert set(failed) == poison
    assert kills == 3
