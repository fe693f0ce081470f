"""One worker process: load the handler, run the loop, turn signals into a clean stop.

Exit statuses (also in the README), so a supervisor can tell "restart me" from "fix me":

====  =====================================================================================
0     stopped cleanly (SIGTERM/SIGINT) or drained
1     unexpected error (a bug): restart
2     invalid configuration (reported by the CLI before anything starts): do not restart
3     a routed copy could not be delivered; its input stays uncommitted: restart
4     cannot start as configured (handler does not load, topics missing): do not restart
5     runtime fault (cluster unreachable, fatal client error, hung handlers): restart
====  =====================================================================================
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

from retryd.config import Role, Settings
from retryd.errors import DeliveryError, RetrydError, RuntimeFault, SetupError
from retryd.hosting import early

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_CONFIG = 2
EXIT_DELIVERY = 3
EXIT_SETUP = 4
EXIT_RUNTIME = 5

RESTARTABLE = {EXIT_CRASH, EXIT_DELIVERY, EXIT_RUNTIME}


class StopSignals:
    """SIGTERM/SIGINT handling for the whole of a worker's start.

    Building a worker takes seconds (handler import, metadata, a strict key-state read), and
    before that the interpreter and the CLI start. A SIGTERM in that window used to find
    Python's default disposition and end the process with -15, which a supervisor or a rolling
    update reads as a crash. The process's first line holds the signals
    (``retryd.hosting.early``); this takes them over and remembers a request made at any point
    before; a worker attached later is stopped at once, so its ``run`` returns through the
    normal clean shutdown (exit 0) without starting to consume.
    """

    def __init__(self, message: str) -> None:
        self._message = message
        self._targets: list[Callable[[], None]] = []
        self.requested = False
        came = early.adopt(self._on_signal)
        if came is not None:
            log.info("received %s while starting: %s", signal.Signals(came).name, message)
            self.requested = True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("received %s: %s", signal.Signals(signum).name, self._message)
        self.requested = True
        for stop in list(self._targets):
            stop()

    def attach(self, stop: Callable[[], None]) -> None:
        """Forward signals to ``stop`` from now on; call it now if one already came."""
        self._targets.append(stop)
        if self.requested:
            stop()


def run_worker(
    settings: Settings, role: Role, *, until_drained: bool = False, instance: int = 0
) -> int:
    """Run until SIGTERM/SIGINT (or drained); return the process exit status. ``instance`` is
    the process slot under a supervisor (kept across restarts: the transactional id's end)."""
    from retryd.config import ConsumerMode

    if settings.consumer_mode is ConsumerMode.SHARE and role is not Role.TIERS:
        if until_drained:
            log.error("--until-drained: a share group has no end to drain to (consumer_mode=share)")
            return EXIT_CONFIG
        from retryd.share.run import run_share_worker

        return run_share_worker(settings, role, instance=instance)
    signals = StopSignals("finishing consumed records, then flush, commit, close")
    from retryd.handlers.loader import load_handler
    from retryd.metrics.registry import mark_build_info, mark_consumer_mode
    from retryd.metrics.sink import PrometheusSink
    from retryd.worker.assembly import build_worker

    try:
        handler = load_handler(
            settings.handler,
            timeout_s=settings.handler_timeout_s,
            non_retryable=settings.non_retryable,
            max_in_flight=settings.max_in_flight,
            batch=settings.handler_batch,
        )
        worker = build_worker(
            settings,
            handler,
            role=role,
            sinks=[PrometheusSink(settings.plan.tier_topics)],
            instance=instance,
        )
    except SetupError as exc:
        log.error("cannot start worker: %s", exc)
        return EXIT_SETUP
    except RetrydError as exc:
        log.error("cannot start worker: %s", exc)
        return EXIT_RUNTIME

    signals.attach(worker.stop)
    mark_build_info()
    mark_consumer_mode(settings.consumer_mode.value)
    tune_gc()
    try:
        summary = worker.run(until_drained=until_drained)
    except DeliveryError as exc:
        log.error("stopping: %s", exc)
        return EXIT_DELIVERY
    except SetupError as exc:
        log.error("cannot start worker: %s", exc)
        return EXIT_SETUP
    except RuntimeFault as exc:
        log.error("stopping: %s", exc)
        return EXIT_RUNTIME
    except RetrydError as exc:
        log.error("stopping: %s", exc)
        return EXIT_RUNTIME
    finally:
        _live_gauges_gone()
    log.info("worker summary %s", json.dumps(summary.as_dict(), sort_keys=True))
    return EXIT_OK


def _live_gauges_gone() -> None:
    """This process's live gauges (circuit state, in-flight calls, paused partitions) leave
    the shared metrics dir with it: a stale "open" must not outlive the worker that wrote it
    (the ``--processes`` supervisor does the same for a child that died)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    try:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())
    except (ImportError, OSError, ValueError):
        pass


def tune_gc() -> None:
    """The worker allocates a few short-lived objects per record, freed by reference counting;
    the cyclic collector would scan every buffered record thousands of times a second for
    nothing. Freeze what start-up created and collect young objects far less often."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def child_main(
    settings: Settings, role: Role, until_drained: bool, log_level: str, instance: int = 0
) -> None:
    """Entry point of a supervised child (spawned: a fresh interpreter). The supervisor spawned
    it with SIGTERM/SIGINT blocked (``early.blocked``), so a stop signal sent at any point of
    its start, its interpreter's included, waits until ``hold`` can record it."""
    early.hold()
    from retryd.runtime.logs import configure

    configure(log_level, settings.log_format.value)
    sys.exit(run_worker(settings, role, until_drained=until_drained, instance=instance))
