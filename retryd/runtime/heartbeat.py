"""Worker heartbeats: one small JSON file per worker process, rewritten atomically.

The sidecar's readiness check reads them to tell whether the workers on this host are alive.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from retryd.runtime.paths import heartbeat_dir


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


class HeartbeatWriter:
    def __init__(self, state_dir: Path, role: str, group_id: str, interval_s: float = 1.0) -> None:
        self.dir = heartbeat_dir(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"{os.getpid()}.json"
        self.role = role
        self.group_id = group_id
        self.interval_s = interval_s
        self._last = 0.0

    def beat(
        self,
        assigned: int,
        paused: int,
        state: str = "running",
        force: bool = False,
        drained: bool = False,
        positions: dict[str, int] | None = None,
        produced: dict[str, int] | None = None,
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
        )
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(hb)), encoding="utf-8")
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def read_heartbeats(state_dir: Path) -> list[Heartbeat]:
    out = []
    for path in sorted(heartbeat_dir(state_dir).glob("*.json")):
        try:
            out.append(Heartbeat(**json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError):
            continue
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
