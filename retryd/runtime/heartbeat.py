"""Worker heartbeats: one small JSON file per worker process, rewritten atomically.

The sidecar's readiness check, its ``retryd_workers_alive`` gauge and ``retryd health`` read
them to tell whether the workers sharing the state directory are alive. Liveness is judged
from the file alone (``liveness``): how fresh it is and the state the worker wrote, never by
looking for the process. A sidecar in a Kubernetes pod does not share the workers' PID
namespace (and should not need to), and a PID seen from another namespace means nothing.

A worker removes its file when it stops cleanly and the ``--processes`` supervisor removes the
file of a child that died; ``prune_stale`` (run when ``retryd worker`` starts) removes the
files that a killed container left in a state directory that outlived it (an ``emptyDir``
survives container restarts).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from retryd.runtime.paths import heartbeat_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pid: int
    role: str
    group_id: str
    ts: float  # wall-clock seconds
    assigned_partitions: int
    paused_partitions: int
    state: str  # starting | running | stopping
    drained: bool = False  # every assigned partition at its end, nothing in flight or waiting
    # "topic/partition" -> next offset to consume, for the partitions this process owns
    positions: dict[str, int] = field(default_factory=dict)
    # "topic/partition" -> one past the last routed copy this process had acknowledged there
    produced: dict[str, int] = field(default_factory=dict)
    # this process's circuit breaker (``CircuitSnapshot.as_dict``); empty before the first beat
    circuit: dict[str, object] = field(default_factory=dict)


class HeartbeatWriter:
    """Writes this process's heartbeat. A write that fails (disk full, read-only or missing
    volume) never stops the worker: processing matters more than being seen. The failure is
    logged once when it starts and once when it ends, counted in ``write_failures``, and kept
    in ``failing``; meanwhile the sidecar sees the heartbeat go stale, and its readiness and
    ``retryd health --worker`` say so (``worker_heartbeat_stale``), which is the truth from
    where they stand: they cannot tell a worker that cannot write from one that is gone."""

    def __init__(self, state_dir: Path, role: str, group_id: str, interval_s: float = 1.0) -> None:
        self.dir = heartbeat_dir(state_dir)
        self.path = heartbeat_path(state_dir, os.getpid())
        self.role = role
        self.group_id = group_id
        self.interval_s = interval_s
        self._last = 0.0
        self.failing: str | None = None  # why the last write failed; None while writes work
        self.write_failures = 0
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._failed(exc)

    def beat(
        self,
        assigned: int,
        paused: int,
        state: str = "running",
        force: bool = False,
        drained: bool = False,
        positions: dict[str, int] | None = None,
        produced: dict[str, int] | None = None,
        circuit: dict[str, object] | None = None,
    ) -> None:
        now = time.time()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        hb = Heartbeat(
            os.getpid(),
            self.role,
            self.group_id,
            now,
            assigned,
            paused,
            state,
            drained,
            positions or {},
            produced or {},
            circuit or {},
        )
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(asdict(hb)), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            self._failed(exc)
            return
        if self.failing is not None:
            log.warning(
                "heartbeat %s written again (it failed %d times)", self.path, self.write_failures
            )
            self.failing = None

    def _failed(self, exc: OSError) -> None:
        self.write_failures += 1
        reason = f"{type(exc).__name__}: {exc.strerror or exc}"
        if self.failing is None:
            log.error(
                "cannot write the heartbeat %s (%s); the worker keeps processing, but the "
                "sidecar will report it stale until the state directory is writable again",
                self.path,
                reason,
            )
        self.failing = reason

    def remove(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot remove the heartbeat %s: %s", self.path, exc)


def read_heartbeats(state_dir: Path) -> list[Heartbeat]:
    out = []
    for path in sorted(heartbeat_dir(state_dir).glob("*.json")):
        try:
            out.append(Heartbeat(**json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError):
            continue
    return out


ALIVE = "alive"
STOPPING = "stopping"
STALE = "stale"


def liveness(hb: Heartbeat, now: float, stale_s: float) -> str:
    """``alive`` (fresh, and not shutting down), ``stopping`` (fresh, finishing its work before
    it exits: it takes nothing new) or ``stale`` (no beat for ``stale_s``: hung, or killed
    without a chance to remove its file)."""
    if now - hb.ts > stale_s:
        return STALE
    return STOPPING if hb.state == STOPPING else ALIVE


def heartbeat_path(state_dir: Path, pid: int) -> Path:
    return heartbeat_dir(state_dir) / f"{pid}.json"


def remove_heartbeat(state_dir: Path, pid: int) -> None:
    """Forget the heartbeat of a process that is known to be gone (the supervisor's child)."""
    heartbeat_path(state_dir, pid).unlink(missing_ok=True)


def prune_stale(state_dir: Path, stale_s: float, now: float | None = None) -> int:
    """Remove heartbeat files older than ``stale_s``; returns how many. Run at worker start-up:
    a file that old belongs to a process that is gone (or hung past any use), and left in
    place it would keep readiness and ``retryd health`` failing for the new workers."""
    now = time.time() if now is None else now
    removed = 0
    for hb in read_heartbeats(state_dir):
        if now - hb.ts > stale_s and hb.pid != os.getpid():
            remove_heartbeat(state_dir, hb.pid)
            removed += 1
    return removed


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs in *this* PID namespace (tests and the supervisor's own children
    only: never a liveness judgement across containers)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
