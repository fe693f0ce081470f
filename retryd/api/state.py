"""Everything one sidecar process holds: Kafka clients, the ledger, jobs, the lag monitor.

Clients are created lazily so the sidecar starts (and answers /healthz, /readyz) while the
broker is down.

Shutdown order (``close``): refuse new replays and jobs, cancel the jobs, wait until every
copy in flight has its delivery report and its ledger record is written (both producers have
a bounded ``message.timeout.ms``, so this wait is bounded), and only then close the ledger and
the producers. A copy is never left without its ledger entry because the sidecar stopped.
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka.admin import AdminClient

from retryd.api.readiness import ReadinessReport, alive_workers, probe
from retryd.config import ConsumerMode, Settings
from retryd.kafka.clients import admin_config, new_admin
from retryd.metrics.exposition import SidecarCollector
from retryd.metrics.lag import LagMonitor
from retryd.metrics.replays import LedgerTail
from retryd.replay.clients import KAFKA, ReplayClients
from retryd.replay.errors import BrokerUnavailable
from retryd.replay.jobs import JobSpec, ReplayJob
from retryd.replay.ledger import LedgerError, ReplayLedger
from retryd.replay.manager import JobManager
from retryd.replay.ratelimit import SharedRateLimit
from retryd.replay.replayer import Replayer, TargetPolicy
from retryd.replay.scan import ScannerPool
from retryd.replay.sources import dead_letter_topics, foreign_formats
from retryd.replay.targets import reserved_topics
from retryd.runtime.paths import metrics_dir
from retryd.tracing import tracing_from_env

log = logging.getLogger(__name__)


def allowed_targets(settings: Settings) -> list[str]:
    """The replay allow-list: ``replay_allowlist``, or the main topics when it is empty."""
    return list(settings.replay_allowlist or settings.main_topics)


class Sidecar:
    def __init__(
        self,
        settings: Settings,
        *,
        lag_interval_s: float | None = None,
        clients: ReplayClients = KAFKA,
    ) -> None:
        """Builds every replay part once, all with the same client factories (``clients``)."""
        self.settings = settings
        self.common = dict(settings.kafka_common())
        self.timeout_s = max(settings.readiness_timeout_s, 5.0)
        # Every replay producer reports each message within this; shutdown waits for it.
        self.delivery_timeout_s = self.timeout_s * 3
        self.pool = ScannerPool(
            # one scanner for every browse and replay request that can run at once: none waits
            self.common,
            settings.failed_topic,
            "browse",
            size=2 * settings.sidecar_max_inflight,
            clients=clients,
            formats=foreign_formats(settings),
        )
        self.ledger = ReplayLedger(
            self.common,
            settings.ledger_topic,
            replication_factor=settings.replication_factor,
            timeout_s=self.timeout_s,
            delivery_timeout_s=self.delivery_timeout_s,
            clients=clients,
        )
        self.policy = TargetPolicy(
            self.common,
            allowed_targets(settings),
            reserved=reserved_topics(settings),
            clients=clients,
        )
        self.ceiling = SharedRateLimit(settings.replay_max_per_second)
        self.tracing = tracing_from_env()  # replayed copies' traces (OTEL_* variables)
        self.replayer = Replayer(
            self.common,
            self.ledger,
            self.policy,
            timeout_s=self.timeout_s,
            delivery_timeout_s=self.delivery_timeout_s,
            ceiling=self.ceiling,
            tracing=self.tracing,
        )
        self.jobs = JobManager(self._new_job)
        # error routes' dead-letter topics, then foreign ones: backlog and replays measured alike
        dlt_topics = dead_letter_topics(settings)[1:]
        self.ledger_tail = LedgerTail(
            self.common, settings.ledger_topic, settings.failed_topic, dlt_topics=dlt_topics
        )
        # share mode: the main topics are read by a share group, whose progress is not a
        # consumer group's committed offsets: the share workers report it (retryd.share.lag)
        measured = settings.plan.tier_topics
        share = settings.consumer_mode is ConsumerMode.SHARE
        if not share:
            measured = [*settings.main_topics, *measured]
        self.lag = LagMonitor(
            self.common,
            settings.group_id,
            measured,
            interval_s=lag_interval_s or settings.metrics_interval_s,
            backlog_topics=[settings.failed_topic, *dlt_topics],
            also=[self.ledger_tail.tail_once],
        )
        self.collector = SidecarCollector(
            metrics_dir(settings.state_dir),
            self.lag,
            group=settings.group_id,
            main_topics=settings.main_topics,
            workers_alive=lambda: alive_workers(settings),
            ledger=self.ledger_tail,
            share_group=settings.share_group_id if share else None,
        )
        self._admin: AdminClient | None = None
        self._ledger_ready = False
        self._lock = threading.Lock()

    def _new_job(self, spec: JobSpec) -> ReplayJob:
        return ReplayJob(
            spec,
            common=self.common,
            failed_topic=self.settings.failed_topic,
            ledger=self.ledger,
            policy=self.policy,
            timeout_s=self.timeout_s,
            delivery_timeout_s=self.delivery_timeout_s,
            ceiling=self.ceiling,
            tracing=self.tracing,
            formats=self.pool.formats,
        )

    def start(self) -> None:
        self.lag.start()

    def _end_tracing(self) -> None:
        """Export the replay spans still buffered (bounded by the exporter's timeouts)."""
        try:
            self.tracing.shutdown()
        except Exception as exc:  # traces must never change how the sidecar ends
            log.warning("could not flush traces at shutdown: %s", exc)

    def close(self) -> None:
        """Stop in the order of the module docstring."""
        still_running = self.jobs.shutdown()
        replays_left = self.replayer.close()
        self.lag.stop()
        self.ledger_tail.close()
        self.pool.close()
        self.policy.close()
        self._end_tracing()
        if still_running or replays_left:
            # Beyond every delivery bound: a bug. Leave the ledger producer to the process
            # exit rather than close it under a writer.
            log.error(
                "shutdown: %d job(s) and %d replay(s) still running past their bounds; "
                "the replay ledger is not closed under them",
                len(still_running),
                replays_left,
            )
            return
        self.ledger.close()

    def ready_ledger(self, refresh: bool = True) -> ReplayLedger:
        """The ledger, its topic created (or checked) and (``refresh``) read to the end."""
        with self._lock:
            if not self._ledger_ready:
                try:
                    self.ledger.ensure_topic()
                except LedgerError as exc:
                    raise BrokerUnavailable(str(exc)) from exc
                self._ledger_ready = True
        if not refresh:
            return self.ledger
        try:
            self.ledger.refresh()
        except LedgerError as exc:
            raise BrokerUnavailable(f"cannot read the replay ledger: {exc}") from exc
        return self.ledger

    # ------------------------------------------------------------------ readiness
    def _admin_client(self) -> AdminClient:
        with self._lock:
            if self._admin is None:
                self._admin = new_admin(admin_config(self.common, "readiness", log_level=3))
            return self._admin

    def readiness(self) -> ReadinessReport:
        return probe(self.settings, self._admin_client)
