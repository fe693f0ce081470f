"""The share group's lag, measured in the background and reported like group mode's lag.

A share group has no committed offsets: its progress is the share-partition start offset
Kafka keeps per partition (``retryd.kafka.share_offsets``), and from Kafka 4.2 the broker's
own lag (records from the start offset to the high watermark not yet acknowledged, which
counts records acknowledged out of order past the start offset as done). The broker's figure
is preferred: besides those records, the start offset it reports is the persisted one, which
on Kafka 4.4 moves one acknowledgement write late (a drained partition of 10 records showed
start offset 0, lag 0, until the next acknowledgement). A broker that returns none
(DescribeShareGroupOffsets v0) gets high watermark - start offset, the high watermark from a
ListOffsets request. A partition the group holds no
state for yet (nothing acquired from it: ``kafka-share-groups.sh --describe`` shows ``-``)
counts every record still in the log (high watermark - log start offset) when the group starts
at the earliest record, as retryd sets a new share group to: a worker that never acquires
anything, from its very start, shows its lag and trips the lag alert; a group that starts at
the latest record shows none there.

The values go through ``Events.lag``, the path of group mode's lag, so they reach the
``retryd_consumer_lag`` gauge (``kind="main"``; the sidecar adds ``share_group``) and the
dashboard and alerts built on it. Measured on a thread of its own every ``interval_s``, never
on the poll loop; a configuration this reader cannot serve (SASL) is logged once and ends the
thread, naming the Kafka script to use instead.

Any other failure of one read, whatever it raises, leaves the thread running
(``retryd.metrics.lag.ReaderHealth``): logged once per new cause and at recovery, and
``retryd_share_lag_reader_up`` goes to 0 until a read works again. The lag gauge keeps its
last value meanwhile (a gauge cannot say "unknown"), so that 0 is what tells a frozen lag
from a steady one. Issue 31 fault 7: a FindCoordinator answer whose host the IDNA codec
refused raised ``UnicodeError`` past the loop's handler, the thread died, the gauge froze,
and a stuck share worker no longer tripped the lag alert.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from retryd.kafka.clients import admin_config, new_admin
from retryd.kafka.share_offsets import (
    ShareOffsetsClient,
    ShareOffsetsUnsupported,
    SharePartitionOffset,
)
from retryd.metrics.lag import ReaderHealth
from retryd.worker.events import Sink

log = logging.getLogger(__name__)

STOP_WAIT_S = 2.0


def lags_of(
    offsets: list[SharePartitionOffset], high: Mapping[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    """Lag per partition: the broker's figure, else ``high`` - start offset (never below 0);
    partitions without state, with an error, or without a known high watermark left out."""
    out: dict[tuple[str, int], int] = {}
    for p in offsets:
        key = (p.topic, p.partition)
        if p.error_code or p.start_offset < 0:
            continue
        if p.lag >= 0:
            out[key] = p.lag
        elif high.get(key, -1) >= 0:
            out[key] = max(0, high[key] - p.start_offset)
    return out


def _report_up(up: bool) -> None:
    """``retryd_share_lag_reader_up``; the registry is imported on first use, as everywhere in
    the worker, once the CLI has set the multiprocess directory."""
    from retryd.metrics.registry import SHARE_LAG_READER_UP

    SHARE_LAG_READER_UP.set(1 if up else 0)


class ShareLagReader:
    """Reads the share group's lag of ``topics`` every ``interval_s`` and reports it."""

    def __init__(
        self,
        common: Mapping[str, Any],
        group: str,
        topics: list[str],
        events: Sink,
        *,
        interval_s: float = 15.0,
        timeout_s: float = 5.0,
    ) -> None:
        self.common = common
        self.group = group
        self.topics = list(topics)
        self.events = events
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.client: ShareOffsetsClient | None = None
        self.last: dict[tuple[str, int], int] = {}
        self.health = ReaderHealth(
            f"share group {group}: lag", log, every_s=interval_s, report=_report_up
        )
        self._admin: AdminClient | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def failing(self) -> str | None:
        """The error of the current outage (None while reads work)."""
        return self.health.failing

    @property
    def failures(self) -> int:
        """Failed reads since start."""
        return self.health.failures

    def start(self) -> ShareLagReader:
        if self._thread is None:
            self.health.down()  # nothing read yet: the gauge exists, at 0, from the start
            self._thread = threading.Thread(target=self._loop, name="share-lag", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the thread at its next wait; waits for it briefly only (a read in progress
        during a broker outage may take a few request timeouts: a worker's shutdown does not
        wait for it, the thread is a daemon)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)

    def _loop(self) -> None:
        """Ends only when stopped or on a configuration it cannot serve: a failed read, of
        any kind, is the next period's to retry (module docstring)."""
        while not self._stop.is_set():
            try:
                self.read_once()
            except ShareOffsetsUnsupported as exc:
                log.warning("share group %s: no lag reported: %s", self.group, exc)
                self.health.down()
                return
            except Exception as exc:  # any: a dead thread would freeze the lag gauge
                self.health.failed(exc)
            else:
                self.health.ok()
            self._stop.wait(self.interval_s)

    def read_once(self) -> dict[tuple[str, int], int]:
        """One measurement, reported through ``events.lag`` (and kept in ``last``)."""
        if self.client is None:
            self.client = ShareOffsetsClient(self.common, self.group, timeout_s=self.timeout_s)
        offsets = self.client.describe(self.topics)
        need = [p for p in offsets if p.lag < 0 and p.start_offset >= 0 and not p.error_code]
        lags = lags_of(offsets, self.high_watermarks(need) if need else {})
        lags.update(self.unstarted(offsets))
        if lags:
            self.events.lag(lags)
        self.last = lags
        return lags

    def high_watermarks(self, parts: list[SharePartitionOffset]) -> dict[tuple[str, int], int]:
        asked = [(p.topic, p.partition) for p in parts]
        return self._offsets(asked, OffsetSpec.latest())

    def unstarted(self, offsets: list[SharePartitionOffset]) -> dict[tuple[str, int], int]:
        """Lag of the partitions of ``topics`` the group holds no state for (module
        docstring): high watermark - log start offset if the group starts at the earliest
        record, else nothing."""
        admin = self._the_admin()
        known = {(p.topic, p.partition) for p in offsets if p.start_offset >= 0}
        meta = admin.list_topics(timeout=self.timeout_s).topics
        missing = [
            (topic, partition)
            for topic in self.topics
            if topic in meta and meta[topic].error is None
            for partition in meta[topic].partitions
            if (topic, partition) not in known
        ]
        if not missing:
            return {}
        from retryd.share.group import read_group_config

        if read_group_config(admin, self.group).reset != "earliest":
            return {}
        high = self._offsets(missing, OffsetSpec.latest())
        low = self._offsets(missing, OffsetSpec.earliest())
        return {k: max(0, high[k] - low[k]) for k in missing if k in high and k in low}

    def _the_admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = new_admin(admin_config(self.common, "share-lag", log_level=3))
        return self._admin

    def _offsets(
        self, parts: list[tuple[str, int]], spec: OffsetSpec
    ) -> dict[tuple[str, int], int]:
        asked = {TopicPartition(topic, partition): spec for topic, partition in parts}
        futures = self._the_admin().list_offsets(asked, request_timeout=self.timeout_s)
        return {
            (tp.topic, tp.partition): fut.result(self.timeout_s).offset
            for tp, fut in futures.items()
        }


def start_share_lag(settings: Any, events: Sink) -> ShareLagReader:
    """The share worker's lag reader, every ``metrics_interval_s`` (the sidecar's period)."""
    from retryd.kafka.clients import common_config

    return ShareLagReader(
        common_config(settings),
        settings.share_group_id,
        list(settings.main_topics),
        events,
        interval_s=settings.metrics_interval_s,
    ).start()
