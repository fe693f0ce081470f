"""What the share worker reports: its batches' counts and durations, the calls in flight, the
acknowledgements by type, the heartbeat with its circuit, refused acknowledgements. Part of
``ShareWorker`` (``retryd.share.worker``), kept apart to keep each module small."""

from __future__ import annotations

import logging
import time
from typing import Any

from retryd.metrics.registry import SHARE_ACKNOWLEDGEMENTS
from retryd.share.calls import Calls
from retryd.share.gate import ShareGate
from retryd.worker.events import BatchStats, Events

log = logging.getLogger(__name__)

GAUGE_S = 0.2  # retryd_handler_inflight is published at most this often


class Reports:
    """The reporting half of ``ShareWorker`` (which sets these attributes)."""

    parts: Any  # ShareParts
    calls: Calls
    events: Events
    gate: ShareGate
    stats: BatchStats
    acks: dict[str, int]
    _inflight_seen: int
    _gauge_at: float
    _beat_at: float

    def _gauge(self, now: float | None) -> None:
        """Calls in flight, published when it changed, at most every ``GAUGE_S`` (``None``:
        now, at a batch's end)."""
        running = self.calls.running
        if running == self._inflight_seen:
            return
        if now is not None and now - self._gauge_at < GAUGE_S:
            return
        self._inflight_seen = running
        self._gauge_at = time.monotonic()
        self.events.inflight(running)

    def _committed(self, offsets: Any, exc: Any) -> None:
        if exc is not None:
            log.warning(
                "share acknowledgements refused (%s): those records are handed out again", exc
            )

    def _publish(self, started: float) -> None:
        stats, self.stats = self.stats, BatchStats()
        stats.quick_retries, stats.quick_rescued = self.parts.quick.take()
        for kind, n in self.acks.items():
            if n:
                SHARE_ACKNOWLEDGEMENTS.labels(type=kind).inc(n)
        self.acks = {"accept": 0, "release": 0}
        if stats:
            self.events.batch(stats, started, time.monotonic())

    def _beat(self, state: str) -> None:
        """This process's heartbeat, with its circuit (role main: role all's tiers worker
        writes it otherwise), at most once per the writer's interval."""
        hb = self.parts.heartbeat
        if hb is None:
            return
        now = time.monotonic()
        if now - self._beat_at < hb.interval_s:
            return
        self._beat_at = now
        hb.beat(0, 0, state, circuit=self.gate.snapshot())
