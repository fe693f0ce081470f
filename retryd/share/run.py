"""One worker process in share mode: the share group's reader, and role ``all``'s tiers.

Role ``all`` runs two readers in one process: the share worker (main topics, this thread) and
the group worker of the tiers (``retryd.worker``, role ``tiers``, on a thread of its own), as
group mode's role ``all`` reads both. The tiers keep a consumer group in share mode, so every
delay stays exact (a tier is read in due-time order, partition by partition), and a retried
record comes back to the handler from its tier, never through the share group. Roles ``main``
and ``tiers`` split them over separate deployments. Either part failing stops the other, and
the process exits with the status of the first failure.
"""

from __future__ import annotations

import logging
import threading
import time

from retryd.config import Role, Settings
from retryd.errors import DeliveryError, RetrydError, RuntimeFault, SetupError
from retryd.hosting.process import (
    EXIT_DELIVERY,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_SETUP,
    StopSignals,
    tune_gc,
)
from retryd.share.gate import LockedBreaker
from retryd.tracing import Tracing, tracing_from_env

log = logging.getLogger(__name__)


def _status(exc: BaseException | None) -> int:
    if exc is None:
        return EXIT_OK
    if isinstance(exc, DeliveryError):
        return EXIT_DELIVERY
    if isinstance(exc, SetupError):
        return EXIT_SETUP
    if isinstance(exc, RuntimeFault | RetrydError):
        return EXIT_RUNTIME
    return 1


def _end_tracing(tracing: Tracing) -> None:
    try:
        tracing.shutdown()
    except Exception as exc:  # traces must never change how a worker ends
        log.warning("could not flush traces at shutdown: %s", exc)


def run_share_worker(settings: Settings, role: Role, *, instance: int = 0) -> int:
    """Run until SIGTERM/SIGINT; return the process exit status (retryd.hosting.process)."""
    signals = StopSignals("finishing the batch in hand, then close")
    from retryd.handlers.loader import load_handler
    from retryd.metrics.registry import mark_build_info, mark_consumer_mode
    from retryd.metrics.sink import PrometheusSink
    from retryd.share.build import build_share_worker
    from retryd.share.lag import start_share_lag
    from retryd.worker.assembly import build_worker
    from retryd.worker.engine import Worker
    from retryd.worker.events import Events

    def handler():  # type: ignore[no-untyped-def]
        return load_handler(
            settings.handler,
            timeout_s=settings.handler_timeout_s,
            non_retryable=settings.non_retryable,
            max_in_flight=settings.max_in_flight,
        )

    tiers: Worker | None = None
    # one provider for the process (the tiers worker's spans too); shut down (its spans
    # flushed) by the tiers worker when it ends, else here
    tracing = tracing_from_env(install_global=True)
    inflight = [0, 0]  # share worker, tiers worker: one process, one gauge of their sum

    class PartSink(PrometheusSink):
        def __init__(self, index: int) -> None:
            super().__init__(settings.plan.tier_topics)
            self.index = index

        def inflight(self, calls: int) -> None:
            inflight[self.index] = calls
            super().inflight(sum(inflight))

    try:
        events = Events([PartSink(0)])
        with_tiers = role is Role.ALL and bool(settings.plan.tier_topics)
        # one circuit per process: both readers drive it (retryd.share.gate)
        breaker = LockedBreaker(settings.breaker_policy, int(time.time() * 1000))
        share = build_share_worker(
            settings,
            handler(),
            events,
            heartbeat=not with_tiers,
            tracing=tracing,
            breaker=breaker,
        )
        if with_tiers:
            tiers = build_worker(
                settings,
                handler(),
                role=Role.TIERS,
                sinks=[PartSink(1)],
                instance=instance,
                tracing=tracing,
                breaker=breaker,
            )
    except RetrydError as exc:
        log.error("cannot start worker: %s", exc)
        return EXIT_SETUP if isinstance(exc, SetupError) else EXIT_RUNTIME

    signals.attach(share.stop)
    if tiers is not None:
        signals.attach(tiers.stop)
    mark_build_info()
    mark_consumer_mode(settings.consumer_mode.value)
    tune_gc()
    failures: list[BaseException] = []
    thread = None
    if tiers is not None:
        tier_worker = tiers

        def run_tiers() -> None:
            try:
                tier_worker.run()
            except BaseException as exc:
                failures.append(exc)
                log.exception("tiers worker stopped: %s", exc)  # with its traceback
            finally:
                share.stop()  # one process, one fate

        thread = threading.Thread(target=run_tiers, name="retryd-tiers")
        thread.start()
    lag = start_share_lag(settings, events)  # the share group's lag, off the poll loop
    try:
        share.run()
    except BaseException as exc:
        failures.append(exc)
        log.error("stopping: %s", exc)
    finally:
        lag.stop()
        if tiers is not None and thread is not None:
            tiers.stop()
            thread.join()
        else:
            _end_tracing(tracing)
    return _status(failures[0] if failures else None)
