"""``--processes N``: N worker processes on one host, restarted when they fail at runtime.

One Python process is GIL-bound, so throughput scales with processes (and partitions).

Stop signals: SIGTERM/SIGINT at any point of the supervisor's life stop every child and end it
with status 0 (or the worst status a child ended with), including while it starts (the signals
are held from the process's first line, ``retryd.hosting.early``) and while a child starts:
children are spawned with the signals blocked, so one forwarded during a child's interpreter
start or imports waits until the child can stop cleanly (exit 0) instead of killing it (-15).

A child that exits with a *runtime* status (crash, undeliverable copy, hung handlers, cluster
unreachable) is restarted after a backoff that doubles per quick failure (1 s … 60 s) and
resets once a child has run for a minute; the other children keep running meanwhile. A child
that *cannot start* as configured (exit 4: handler does not load, topics missing) stops the
whole group, since restarting it would change nothing.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import time
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

from retryd.config import Role, Settings
from retryd.hosting import early
from retryd.hosting.drain import DrainWatch
from retryd.hosting.process import EXIT_OK, EXIT_SETUP, child_main
from retryd.runtime.heartbeat import remove_heartbeat

log = logging.getLogger(__name__)

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_S = 60.0  # a child that ran this long resets the backoff


def _total_partitions(settings: Settings, role: Role) -> int:
    from retryd.kafka.clients import admin_config, common_config, new_admin
    from retryd.worker.assembly import topics_for_role

    topics = topics_for_role(settings, role)
    md = new_admin(admin_config(common_config(settings), "supervisor")).list_topics(timeout=10)
    return sum(len(md.topics[t].partitions) for t in topics if t in md.topics)


class Backoff:
    """Delay before the next restart: doubles per quick failure, resets after a stable run."""

    def __init__(self, start_s: float = BACKOFF_START_S, max_s: float = BACKOFF_MAX_S) -> None:
        self.start_s = start_s
        self.max_s = max_s
        self.next_s = start_s

    def failed(self, ran_s: float) -> float:
        if ran_s >= STABLE_S:
            self.next_s = self.start_s
        delay = self.next_s
        self.next_s = min(self.next_s * 2, self.max_s)
        return delay


def supervise(
    settings: Settings, role: Role, processes: int, *, until_drained: bool = False
) -> int:
    """Run ``processes`` children; ``until_drained`` stops them all once the group is drained."""
    ctx = multiprocessing.get_context("spawn")
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    stopping = False
    children: dict[int, tuple[BaseProcess, float]] = {}
    slots: dict[int, int] = {}  # pid -> process slot (a replacement takes its predecessor's)
    restarts: list[tuple[float, int]] = []  # (monotonic time to start a replacement, its slot)
    backoff = Backoff()
    worst = EXIT_OK

    def start_one(slot: int) -> None:
        proc = ctx.Process(
            target=child_main, args=(settings, role, False, level, slot), name="retryd-worker"
        )
        # Spawning starts multiprocessing's resource tracker the first time, and that unblocks
        # SIGTERM/SIGINT on its way out: started first, so the child inherits the blocked mask.
        resource_tracker.ensure_running()
        with early.blocked():
            # A signal to this process meanwhile is delivered when the block ends, with the
            # child already in ``children``: on_signal stops it like the others.
            proc.start()
            assert proc.pid is not None
            children[proc.pid] = (proc, time.monotonic())
            slots[proc.pid] = slot
        log.info("started worker process pid=%s role=%s", proc.pid, role)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        restarts.clear()
        for proc, _ in list(children.values()):
            if proc.is_alive() and proc.pid is not None:
                proc.terminate()  # SIGTERM: each child finishes, flushes, commits and exits

    came = early.adopt(on_signal)
    if came is not None:
        log.info("received %s while starting: no worker process started", signal.Signals(came).name)
        return EXIT_OK
    watch = (
        DrainWatch(settings.state_dir, _total_partitions(settings, role)) if until_drained else None
    )
    for slot in range(processes):
        if not stopping:
            start_one(slot)
    while children or restarts:
        now = time.monotonic()
        for due in [r for r in restarts if r[0] <= now]:
            restarts.remove(due)
            if not stopping:
                start_one(due[1])
        timeout = 0.5 if not restarts else max(0.0, min(0.5, min(restarts)[0] - now))
        ready = wait([p.sentinel for p, _ in children.values()], timeout=timeout)
        if watch is not None and not stopping and not restarts and watch.check(children):
            log.info("all %d worker processes drained the group: stopping them", len(children))
            on_signal(signal.SIGTERM, None)
        for pid, (proc, started) in list(children.items()):
            if proc.sentinel not in ready:
                continue
            proc.join()
            del children[pid]
            slot = slots.pop(pid)
            _mark_dead(pid)
            remove_heartbeat(settings.state_dir, pid)  # gone: never judged stale later
            code = proc.exitcode if proc.exitcode is not None else 1
            if code == EXIT_OK or stopping:
                log.info("worker process pid=%s exited with %s", pid, code)
                if code not in (EXIT_OK, -signal.SIGTERM):
                    worst = max(worst, abs(code))
                continue
            if code == EXIT_SETUP:
                log.error(
                    "worker process pid=%s cannot start (status %s, see its error above): "
                    "stopping the group",
                    pid,
                    code,
                )
                worst = max(worst, code)
                on_signal(signal.SIGTERM, None)
                continue
            delay = backoff.failed(time.monotonic() - started)
            log.error(
                "worker process pid=%s failed at runtime (status %s); restarting it in %.0fs",
                pid,
                code,
                delay,
            )
            restarts.append((time.monotonic() + delay, slot))
    return worst


def _mark_dead(pid: int) -> None:
    try:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
    except (ImportError, OSError, ValueError):
        pass
