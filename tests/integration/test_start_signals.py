"""Issue 32, items 2 and 4: SIGTERM or SIGINT at any point of a worker's, a supervisor's or a
sidecar's start ends it with its documented status (0) and loses nothing.

Each test first measures, in the same test, how long a start takes on this machine: from the
moment the process catches SIGTERM (its first line ran: ``retryd.hosting.early``) to the moment
it consumes or serves. Then it starts the process again and again and signals it at points
spread over that span and past it, SIGTERM and SIGINT in turn. The points follow the measured
start, so a slow machine moves them, never the verdict. Some must land before the heavy imports
(pydantic's compiled core not yet mapped into the process): before issue 32 nothing of retryd's
caught a signal there, and the first such point ended the process with -15.

The supervisor's children are the case CI hit: a child started (or restarted) just before the
stop got the forwarded SIGTERM during its interpreter's start or its imports, before anything
of retryd could handle it, and died of it (-15). Points taken right after the supervisor logs a
child's start land there; the test checks that some did (the child did not catch SIGTERM yet
when the signal was sent). Children are spawned with the signals blocked, so such a signal
waits until the child can stop cleanly.

Not covered: the few milliseconds before a *top-level* process's first line (its interpreter's
own start). Only its parent could block the signals there; the points start once the process
catches SIGTERM.

Nothing is lost: after each stop no committed offset is past what was handled (a stop never
commits a record it did not finish), and a last worker drains the topic: every record handled.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from tests.integration.sidecar_support import Env, SidecarProcess
from tests.integration.worker_support import Deployment, deployment, stop_process
from tests.support import json_lines, read_topic, wait_for

SIGNALS = (signal.SIGTERM, signal.SIGINT)
SIGTERM_BIT = 1 << (signal.SIGTERM - 1)
STOP_S = 60.0  # shutdown_timeout_s (20 s) plus flush, commit and close, on a busy machine
START_S = 120.0  # a start on a machine as busy as CI's
PARTITIONS = 2
RECORDS = 3000
# pydantic's compiled core, loaded by the CLI's imports (settings): mapped into a process once
# its heavy imports are under way. A signal before that was caught by no code of retryd's
# before issue 32.
HEAVY = "_pydantic_core"


def catches_sigterm(pid: int) -> bool:
    """The process has a SIGTERM handler (``SigCgt`` in /proc): retryd's first line ran."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & SIGTERM_BIT)
    return False


def imported(pid: int, library: str = HEAVY) -> bool:
    """``library``'s compiled module is mapped into the process (``/proc/<pid>/maps``)."""
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return True  # gone: nothing to tell


def first_line_ran(proc: subprocess.Popen[bytes]) -> float:
    """Wait until ``proc`` catches SIGTERM; the monotonic time it was seen."""

    def ran() -> bool:
        assert proc.poll() is None, f"pid {proc.pid} exited with {proc.returncode} while starting"
        return catches_sigterm(proc.pid)

    wait_for(ran, START_S, 0.002, f"pid {proc.pid} to catch SIGTERM")
    return time.monotonic()


def spread(span: float, n: int) -> list[float]:
    """``n`` delays from 0 to 1.5 x ``span``: over the whole start and past it (a start varies
    from one to the next; the measured one also signals a process that completed its start)."""
    return [1.5 * span * i / (n - 1) for i in range(n)]


@dataclass
class Stop:
    delay_s: float
    sig: str
    status: int
    started: bool  # the process consumed or served before the signal
    importing: bool = False  # its heavy imports (``HEAVY``) had not started yet
    note: str = ""

    def __str__(self) -> str:
        when = (
            "after the start"
            if self.started
            else "before the heavy imports"
            if self.importing
            else "during the start"
        )
        return f"{self.sig} {self.delay_s:.2f}s in ({when}): {self.status} {self.note}"


def measure_start(
    spawn: Callable[[], subprocess.Popen[bytes]], started: Callable[[], bool]
) -> tuple[float, int]:
    """One start timed from its first line to ``started``, then SIGTERM: (seconds, status)."""
    proc = spawn()
    try:
        t0 = first_line_ran(proc)
        wait_for(started, START_S, 0.01, "the start to complete")
        span = time.monotonic() - t0
        proc.send_signal(signal.SIGTERM)
        return span, proc.wait(STOP_S)
    finally:
        stop_process(proc)


def signal_at(
    spawn: Callable[[], subprocess.Popen[bytes]],
    started: Callable[[], bool],
    delay_s: float,
    sig: signal.Signals,
) -> Stop:
    """Start a process, signal it ``delay_s`` after its first line ran, wait for its exit."""
    proc = spawn()
    try:
        first_line_ran(proc)
        time.sleep(delay_s)  # the fault schedule: where in the start the signal lands
        was_started = started()
        importing = not imported(proc.pid)  # checked last: the signal follows at once
        proc.send_signal(sig)
        return Stop(delay_s, sig.name, proc.wait(STOP_S), was_started, importing)
    finally:
        stop_process(proc)


# --------------------------------------------------------------------------- nothing lost
def committed_past_handled(dep: Deployment, log: Path) -> None:
    """No partition's committed offset is past the highest offset handled on it (nothing is
    committed where nothing was handled): a stop never commits a record it did not finish.

    Not "exactly past": a stop that lands while the group rebalances (a member joining, as in
    every start here) may find its final commit refused (``ILLEGAL_GENERATION``, logged); the
    records it finished are then redone by the next owner, as after any rebalance."""
    handled: dict[int, int] = {}
    for call in json_lines(log):
        handled[call["partition"]] = max(handled.get(call["partition"], -1), call["offset"])
    reader = Consumer({"bootstrap.servers": dep.bootstrap, "group.id": dep.settings.group_id})
    try:
        tps = [TopicPartition(dep.main, p) for p in range(PARTITIONS)]
        committed = reader.committed(tps, timeout=30)
    finally:
        reader.close()
    for tp in committed:
        if tp.partition in handled:
            assert tp.offset <= handled[tp.partition] + 1, (tp, handled)
        else:
            assert tp.offset < 0, f"nothing handled on {tp.partition} but {tp.offset} committed"


def drain_and_count(dep: Deployment, log: Path, specs: list[dict]) -> Counter[str]:
    """A last worker handles what is left: every record handled (at least once: see
    ``committed_past_handled``), none failed. The calls per id."""
    last = dep.spawn_worker(log, "--until-drained")
    try:
        assert last.wait(START_S) == 0
    finally:
        stop_process(last)
    ids = Counter(c["id"] for c in json_lines(log))
    assert set(ids) == {s["id"] for s in specs}, "records lost"
    assert read_topic(dep.bootstrap, dep.failed) == []
    return ids


def _records(prefix: str) -> list[dict]:
    return [{"id": f"{prefix}{i}", "mode": "slow", "seconds": 0.01} for i in range(RECORDS)]


# --------------------------------------------------------------------------- a worker
def test_sigterm_at_any_point_of_a_worker_start(bootstrap: str, tmp_path: Path) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s", partitions=PARTITIONS)
    specs = _records("w")
    dep.send(specs)
    log = tmp_path / "calls.log"
    procs: list[subprocess.Popen[bytes]] = []

    def spawn() -> subprocess.Popen[bytes]:
        procs.append(dep.spawn_worker(log))
        return procs[-1]

    def started() -> bool:
        return dep.started(procs[-1])

    span, status = measure_start(spawn, started)
    assert status == 0, dep.outputs[procs[-1].pid].read_text()[-3000:]
    stops = []
    for i, delay in enumerate(spread(span, 10)):
        stop = signal_at(spawn, started, delay, SIGNALS[i % 2])
        stops.append(stop)
        assert stop.status == 0, f"{stop}\n{dep.outputs[procs[-1].pid].read_text()[-3000:]}"
        committed_past_handled(dep, log)
    report = f"start {span:.2f}s; " + "; ".join(map(str, stops))
    print("\n" + report)
    assert any(s.importing for s in stops), "no signal before the heavy imports: " + report
    twice = sum(n > 1 for n in drain_and_count(dep, log, specs).values())
    print(f"handled more than once (redone after a refused commit): {twice}")


# --------------------------------------------------------------------------- a supervisor
STARTED_CHILD = re.compile(r"started worker process pid=(\d+)")
CHILD_EXIT = re.compile(r"worker process pid=(\d+) exited with (-?\d+)")


def children_statuses(output: str) -> dict[str, str]:
    """Every child the supervisor started, with the status it logged for it ("?": none)."""
    exits = dict(CHILD_EXIT.findall(output))
    return {pid: exits.get(pid, "?") for pid in STARTED_CHILD.findall(output)}


def test_sigterm_at_any_point_of_a_supervisor_start(bootstrap: str, tmp_path: Path) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s", partitions=PARTITIONS)
    specs = _records("s")
    dep.send(specs)
    log = tmp_path / "calls.log"
    procs: list[subprocess.Popen[bytes]] = []

    def spawn() -> subprocess.Popen[bytes]:
        procs.append(dep.spawn_worker(log, "--processes", "2"))
        return procs[-1]

    def output() -> str:
        return dep.outputs[procs[-1].pid].read_text(errors="replace")

    def started() -> bool:
        return output().count("worker role=") >= 2  # both children consume

    def check(stop: Stop) -> None:
        statuses = children_statuses(output())
        stop.note = f"{stop.note} children {statuses}".strip()
        assert stop.status == 0, f"{stop}\n{output()[-3000:]}"
        assert all(code == "0" for code in statuses.values()), (
            f"a child did not stop cleanly: {statuses} ({stop})\n{output()[-3000:]}"
        )
        committed_past_handled(dep, log)

    span, status = measure_start(spawn, started)
    check(Stop(span, "SIGTERM", status, True))
    stops = []
    for i, delay in enumerate(spread(span, 8)):
        stops.append(signal_at(spawn, started, delay, SIGNALS[i % 2]))
        check(stops[-1])

    # Right after the supervisor started a child: the forwarded signal finds the child in its
    # interpreter's start or its imports, before it could handle anything.
    in_child_start = 0
    for i, delay in enumerate((0.0, 0.0, 0.02, 0.05, 0.1, 0.2)):
        proc = spawn()
        try:
            child = int(wait_for(lambda: STARTED_CHILD.search(output()), START_S, 0.002)[1])
            time.sleep(delay)  # the fault schedule: how far into the child's start
            early = not catches_sigterm(child)
            in_child_start += early
            proc.send_signal(SIGNALS[i % 2])
            stop = Stop(delay, SIGNALS[i % 2].name, proc.wait(STOP_S), False)
            stop.note = "before the child's first line" if early else ""
        finally:
            stop_process(proc)
        stops.append(stop)
        check(stop)
    report = f"start {span:.2f}s; " + "; ".join(map(str, stops))
    print("\n" + report)
    assert any(s.importing for s in stops), "no signal before the heavy imports: " + report
    assert in_child_start > 0, "no signal reached a child before its first line: " + report
    twice = sum(n > 1 for n in drain_and_count(dep, log, specs).values())
    print(f"handled more than once (redone after a refused commit): {twice}")


# --------------------------------------------------------------------------- a sidecar
def test_sigterm_at_any_point_of_a_sidecar_start(bootstrap: str, tmp_path: Path) -> None:
    env = Env(bootstrap, tmp_path / "state").create()
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")

    def started() -> bool:
        """Listening: uvicorn bound its port (a refused connect costs nothing, so a check just
        before a signal does not move it)."""
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", sidecar.port)) == 0

    def check(stop: Stop) -> None:
        out = sidecar.log_path.read_text(errors="replace")
        assert stop.status == 0, f"{stop}\n{out[-3000:]}"
        assert "Traceback" not in out, out[-3000:]

    span, status = measure_start(sidecar.spawn, started)
    check(Stop(span, "SIGTERM", status, True))
    stops = []
    for i, delay in enumerate(spread(span, 8)):
        stops.append(signal_at(sidecar.spawn, started, delay, SIGNALS[i % 2]))
        check(stops[-1])
    report = f"start {span:.2f}s; " + "; ".join(map(str, stops))
    print("\n" + report)
    assert any(s.importing for s in stops), "no signal before the heavy imports: " + report
