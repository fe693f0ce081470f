"""``--processes N``: N worker processes on one host, restarted when they crash.

One Python process is GIL-bound, so throughput scales with processes (and partitions).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

from retryd.config import Role, Settings
from retryd.worker.drain import DrainWatch
from retryd.worker.process import EXIT_OK, EXIT_SETUP, child_main

log = logging.getLogger(__name__)

MAX_QUICK_FAILURES = 5
QUICK_S = 10.0


def _total_partitions(settings: Settings, role: Role) -> int:
    from retryd.kafka.clients import admin_config, common_config, new_admin
    from retryd.worker.engine import topics_for_role

    topics = topics_for_role(settings, role)
    md = new_admin(admin_config(common_config(settings), "supervisor")).list_topics(timeout=10)
    return sum(len(md.topics[t].partitions) for t in topics if t in md.topics)


def supervise(
    settings: Settings, role: Role, processes: int, *, until_drained: bool = False
) -> int:
    """Run ``processes`` children; ``until_drained`` stops them all once the group is drained."""
    ctx = multiprocessing.get_context("spawn")
    watch = (
        DrainWatch(settings.state_dir, _total_partitions(settings, role)) if until_drained else None
    )
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    stopping = False
    children: dict[int, tuple[BaseProcess, float]] = {}
    quick_failures = 0
    worst = EXIT_OK

    def start_one() -> None:
        proc = ctx.Process(
            target=child_main, args=(settings, role, False, level), name="retryd-worker"
        )
        proc.start()
        assert proc.pid is not None
        children[proc.pid] = (proc, time.monotonic())
        log.info("started worker process pid=%s role=%s", proc.pid, role)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for proc, _ in list(children.values()):
            if proc.is_alive() and proc.pid is not None:
                proc.terminate()  # SIGTERM: each child flushes, commits and exits

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for _ in range(processes):
        start_one()
    while children:
        ready = wait([p.sentinel for p, _ in children.values()], timeout=0.5)
        if watch is not None and not stopping and watch.check(children):
            log.info("all %d worker processes drained the group: stopping them", len(children))
            on_signal(signal.SIGTERM, None)
        for pid, (proc, started) in list(children.items()):
            if proc.sentinel not in ready:
                continue
            proc.join()
            del children[pid]
            _mark_dead(pid)
            code = proc.exitcode if proc.exitcode is not None else 1
            if code == EXIT_OK or stopping:
                log.info("worker process pid=%s exited with %s", pid, code)
                if code not in (EXIT_OK, -signal.SIGTERM):
                    worst = max(worst, abs(code))
                continue
            log.error("worker process pid=%s died with status %s", pid, code)
            quick_failures = quick_failures + 1 if time.monotonic() - started < QUICK_S else 0
            if code == EXIT_SETUP or quick_failures >= MAX_QUICK_FAILURES:
                log.error("not restarting: the worker cannot start (see its error above)")
                worst = max(worst, abs(code))
                stopping = True
                on_signal(signal.SIGTERM, None)
                continue
            start_one()
    return worst


def _mark_dead(pid: int) -> None:
    try:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
    except (ImportError, OSError, ValueError):
        pass
