"""Everything one sidecar process holds: Kafka clients, the ledger, jobs, the lag monitor.

Clients are created lazily so the sidecar starts (and answers /healthz, /readyz) while the
broker is down.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from retryd.config import Settings
from retryd.kafka.clients import admin_config, new_admin
from retryd.metrics.exposition import LagMonitor, SidecarCollector
from retryd.replay.errors import BrokerUnavailable
from retryd.replay.jobs import JobSpec, ReplayJob
from retryd.replay.ledger import LedgerError, ReplayLedger
from retryd.replay.manager import JobManager
from retryd.replay.replayer import Replayer, TargetPolicy
from retryd.replay.scan import ScannerPool
from retryd.runtime.heartbeat import read_heartbeats
from retryd.runtime.paths import metrics_dir

log = logging.getLogger(__name__)


def allowed_targets(settings: Settings) -> list[str]:
    """The replay allow-list: ``replay_allowlist``, or the main topics when it is empty."""
    return list(settings.replay_allowlist or settings.main_topics)


class Sidecar:
    def __init__(self, settings: Settings, *, lag_interval_s: float = 5.0) -> None:
        self.settings = settings
        self.common = dict(settings.kafka_common())
        self.timeout_s = max(settings.readiness_timeout_s, 5.0)
        self.pool = ScannerPool(self.common, settings.failed_topic, "browse")
        self.ledger = ReplayLedger(
            self.common,
            settings.ledger_topic,
            replication_factor=settings.replication_factor,
            timeout_s=self.timeout_s,
        )
        self.policy = TargetPolicy(self.common, allowed_targets(settings))
        self.replayer = Replayer(self.common, self.ledger, self.policy, timeout_s=self.timeout_s)
        self.jobs = JobManager(self._new_job)
        self.lag = LagMonitor(
            self.common,
            settings.group_id,
            [*settings.main_topics, *settings.plan.tier_topics],
            interval_s=lag_interval_s,
        )
        self.collector = SidecarCollector(metrics_dir(settings.state_dir), self.lag)
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
        )

    def start(self) -> None:
        self.lag.start()

    def close(self) -> None:
        self.jobs.cancel_all()
        self.lag.stop()
        self.pool.close()
        self.replayer.close()
        self.policy.close()
        self.ledger.close()

    def ready_ledger(self, refresh: bool = True) -> ReplayLedger:
        """The ledger, its topic created if missing and (``refresh``) read to the end."""
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

    def readiness(self) -> dict[str, Any]:
        reasons: list[str] = []
        started = time.monotonic()
        timeout = self.settings.readiness_timeout_s
        broker: dict[str, Any] = {"bootstrap_servers": self.settings.bootstrap_servers}
        try:
            md = self._admin_client().list_topics(timeout=timeout)
            broker.update(ok=True, brokers=len(md.brokers))
        except KafkaException as exc:
            broker.update(ok=False, error=str(exc.args[0]) if exc.args else str(exc))
            reasons.append(
                f"broker {self.settings.bootstrap_servers} did not answer a metadata request "
                f"within {timeout:g}s"
            )
        broker["seconds"] = round(time.monotonic() - started, 3)
        workers = worker_states(self.settings)
        stale = self.settings.heartbeat_stale_s
        live = [w for w in workers if w["alive"]]
        if not live:
            reasons.append(
                f"no live worker process on this host (no heartbeat newer than {stale:g}s in "
                f"{self.settings.state_dir / 'heartbeats'})"
            )
        for w in workers:
            if w["pid_running"] and not w["alive"]:
                reasons.append(
                    f"worker pid {w['pid']} is running but its heartbeat is "
                    f"{w['age_seconds']:.0f}s old (stale after {stale:g}s)"
                )
        for w in workers:
            w.pop("pid_running")
        return {
            "status": "not_ready" if reasons else "ready",
            "reasons": reasons,
            "broker": broker,
            "workers": workers,
        }


def worker_states(settings: Settings) -> list[dict[str, Any]]:
    from retryd.runtime.heartbeat import pid_alive

    now = time.time()
    out = []
    for hb in read_heartbeats(settings.state_dir):
        age = max(0.0, now - hb.ts)
        running = pid_alive(hb.pid)
        out.append(
            {
                "pid": hb.pid,
                "role": hb.role,
                "group_id": hb.group_id,
                "state": hb.state,
                "age_seconds": round(age, 3),
                "alive": running and age <= settings.heartbeat_stale_s,
                "pid_running": running,
                "assigned_partitions": hb.assigned_partitions,
                "paused_partitions": hb.paused_partitions,
            }
        )
    return out
