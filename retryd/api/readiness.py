"""Readiness: is the broker answering, and are the workers sharing the state dir alive?

Workers are judged by their heartbeat files alone (``retryd.runtime.heartbeat.liveness``):
fresh within ``heartbeat_stale_s`` and not ``stopping``. No PID is looked up, so the sidecar
works in its own container of a Kubernetes pod (no ``shareProcessNamespace``), in compose
without ``pid: service:…``, or on another host sharing the directory.

Two views of one probe. Anyone may ask ``/readyz`` (Kubernetes does, without credentials) and
gets the status and reason *codes* from ``REASONS`` only: no bootstrap hosts, paths, PIDs or
group ids, which would tell a stranger where the cluster is. A caller with a valid API token
(any scope) also gets the sentences, the broker answer, the worker heartbeats and their circuits.

The circuit breaker is reported, never judged: the detailed view names each worker process's
circuit and the worst of them with its last error, but an open circuit does not make the
sidecar unready. An open circuit means the handler's downstream is out; restarting or
removing pods cannot fix that, and would only move the held records around.

The probe blocks (a metadata request of up to ``readiness_timeout_s``), so it runs on a thread
of its own, one at a time: concurrent ``/readyz`` requests share the probe in progress
(``ReadinessProbe``) instead of each taking a thread, so a flood of probes while the broker is
down costs one thread, not one per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from retryd.api.circuit import state_of, worst
from retryd.config import Settings
from retryd.runtime.heartbeat import ALIVE, STALE, STOPPING, liveness, read_heartbeats

BROKER_UNREACHABLE = "broker_unreachable"
NO_LIVE_WORKER = "no_live_worker"
WORKER_HEARTBEAT_STALE = "worker_heartbeat_stale"
REASONS = (BROKER_UNREACHABLE, NO_LIVE_WORKER, WORKER_HEARTBEAT_STALE)


@dataclass
class ReadinessReport:
    reasons: list[str] = field(default_factory=list)  # codes from REASONS, each once
    details: list[str] = field(default_factory=list)  # one sentence per problem
    broker: dict[str, Any] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)
    # the worst circuit among the fresh heartbeats, and its last error (informative only)
    circuit: dict[str, Any] = field(default_factory=dict)
    # The two JSON bodies, rendered once per probe: every request sharing a probe sends bytes.
    rendered: dict[bool, bytes] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "not_ready" if self.reasons else "ready"

    def add(self, code: str, sentence: str) -> None:
        if code not in self.reasons:
            self.reasons.append(code)
        self.details.append(sentence)

    def public(self) -> dict[str, Any]:
        return {"status": self.status, "reasons": list(self.reasons)}

    def detailed(self) -> dict[str, Any]:
        return {
            **self.public(),
            "details": self.details,
            "broker": self.broker,
            "workers": self.workers,
            "circuit": self.circuit,
        }

    def body(self, detailed: bool, render: Callable[[dict[str, Any]], bytes]) -> bytes:
        """The JSON body of one view, rendered by ``render`` the first time it is asked."""
        if detailed not in self.rendered:
            self.rendered[detailed] = render(self.detailed() if detailed else self.public())
        return self.rendered[detailed]


def probe(settings: Settings, admin: Callable[[], AdminClient]) -> ReadinessReport:
    """One readiness check (blocking)."""
    report = ReadinessReport()
    started = time.monotonic()
    timeout = settings.readiness_timeout_s
    broker: dict[str, Any] = {"bootstrap_servers": settings.bootstrap_servers}
    try:
        md = admin().list_topics(timeout=timeout)
        broker.update(ok=True, brokers=len(md.brokers))
    except KafkaException as exc:
        broker.update(ok=False, error=str(exc.args[0]) if exc.args else str(exc))
        report.add(
            BROKER_UNREACHABLE,
            f"broker {settings.bootstrap_servers} did not answer a metadata request "
            f"within {timeout:g}s",
        )
    broker["seconds"] = round(time.monotonic() - started, 3)
    report.broker = broker
    workers = worker_states(settings)
    stale = settings.heartbeat_stale_s
    if not any(w["liveness"] == ALIVE for w in workers):
        stopping = sum(1 for w in workers if w["liveness"] == STOPPING)
        report.add(
            NO_LIVE_WORKER,
            f"no live worker process (no heartbeat newer than {stale:g}s"
            + (f"; {stopping} stopping" if stopping else "")
            + f" in {settings.state_dir / 'heartbeats'})",
        )
    for w in workers:
        if w["liveness"] == STALE:
            report.add(
                WORKER_HEARTBEAT_STALE,
                f"worker pid {w['pid']} stopped beating {w['age_seconds']:.0f}s ago (stale "
                f"after {stale:g}s): hung, or killed without removing its heartbeat",
            )
    report.workers = workers
    report.circuit = circuit_summary(workers)
    return report


def circuit_summary(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst circuit of the processes that are not stale, with that process's last
    error. Never a readiness reason (see the module docstring)."""
    fresh = [w for w in workers if w["liveness"] != STALE]
    state = worst(state_of(w["circuit_state"]) for w in fresh)
    errors = [w for w in fresh if w["circuit_state"] == state and w["circuit_last_error"]]
    return {
        "state": state.value if state is not None else None,
        "last_error": errors[0]["circuit_last_error"] if errors else None,
    }


def worker_states(settings: Settings, now: float | None = None) -> list[dict[str, Any]]:
    """Every heartbeat in the state dir with its liveness (see the module docstring)."""
    now = time.time() if now is None else now
    out = []
    for hb in read_heartbeats(settings.state_dir):
        judged = liveness(hb, now, settings.heartbeat_stale_s)
        circuit = hb.circuit if isinstance(hb.circuit, dict) else {}
        state = state_of(circuit.get("state"))
        last_error = circuit.get("last_error")
        out.append(
            {
                "pid": hb.pid,
                "role": hb.role,
                "group_id": hb.group_id,
                "state": hb.state,
                "age_seconds": round(max(0.0, now - hb.ts), 3),
                "alive": judged == ALIVE,
                "liveness": judged,
                "assigned_partitions": hb.assigned_partitions,
                "paused_partitions": hb.paused_partitions,
                "circuit_state": state.value if state is not None else None,
                "circuit_last_error": last_error if isinstance(last_error, str) else None,
            }
        )
    return out


def alive_workers(settings: Settings, now: float | None = None) -> int:
    """How many worker processes are alive: the ``retryd_workers_alive`` gauge."""
    now = time.time() if now is None else now
    stale = settings.heartbeat_stale_s
    return sum(1 for hb in read_heartbeats(settings.state_dir) if liveness(hb, now, stale) == ALIVE)


class ReadinessProbe:
    """Runs ``check`` on one dedicated thread; callers that arrive while it runs share it."""

    def __init__(self, check: Callable[[], ReadinessReport]) -> None:
        self.check = check
        self._limiter = anyio.CapacityLimiter(1)
        self._running: asyncio.Future[ReadinessReport] | None = None

    async def report(self) -> ReadinessReport:
        running = self._running
        if running is None or running.done():
            running = self._running = asyncio.ensure_future(
                anyio.to_thread.run_sync(self.check, limiter=self._limiter)
            )
        # shield: a caller that goes away does not cancel the probe the others wait for
        return await asyncio.shield(running)
