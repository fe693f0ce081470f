"""Operators' orders to the circuit breakers of the workers sharing a state directory.

The sidecar (``POST /v1/circuit``) writes one small JSON file per group,
``<state_dir>/circuit/<group digest>.json``: ``{"seq", "action", "by", "at_ms", "group"}``,
rewritten atomically with a higher ``seq`` each time. Every worker process of that group reads
it at most once per heartbeat interval (one ``stat`` when nothing changed) and applies an order
whose ``seq`` it has not applied yet, so each order reaches every ``--processes`` child once,
and a worker that starts later applies only orders newer than ``STALE_MS`` (an old "open"
must not stop a fresh deployment). Like heartbeats, it reaches the processes of one pod: each
pod's sidecar steers its own workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from retryd.policy.circuit import CircuitAction

log = logging.getLogger(__name__)

STALE_MS = 60_000  # an order older than this when a worker starts is not applied
BY_MAX = 64  # characters of the orderer's name kept


def circuit_dir(state_dir: Path) -> Path:
    return state_dir / "circuit"


def command_path(state_dir: Path, group: str) -> Path:
    digest = hashlib.sha256(group.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return circuit_dir(state_dir) / f"{digest}.json"


@dataclass(frozen=True, slots=True)
class CircuitCommand:
    seq: int
    action: CircuitAction
    by: str
    at_ms: int
    group: str


def write_command(state_dir: Path, group: str, action: CircuitAction, by: str) -> CircuitCommand:
    """Write the next order for ``group`` (atomically) and return it. Raises ``OSError``."""
    path = command_path(state_dir, group)
    path.parent.mkdir(parents=True, exist_ok=True)
    last = read_command(path)
    cmd = CircuitCommand(
        (last.seq + 1) if last is not None else 1,
        action,
        by[:BY_MAX],
        int(time.time() * 1000),
        group,
    )
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(
        json.dumps(
            {
                "seq": cmd.seq,
                "action": cmd.action.value,
                "by": cmd.by,
                "at_ms": cmd.at_ms,
                "group": group,
            }
        ),
        encoding="utf-8",
    )
    os.replace(tmp, path)
    return cmd


def read_command(path: Path) -> CircuitCommand | None:
    """The order in ``path``; None when there is none or it cannot be read (logged)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return CircuitCommand(
            int(doc["seq"]),
            CircuitAction(doc["action"]),
            str(doc.get("by", "operator"))[:BY_MAX],
            int(doc.get("at_ms", 0)),
            str(doc.get("group", "")),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("circuit order %s cannot be read (%s); ignored", path, type(exc).__name__)
        return None


class CommandReader:
    """A worker's view of its group's orders: ``poll`` returns each new one once."""

    def __init__(self, state_dir: Path, group: str) -> None:
        self.path = command_path(state_dir, group)
        self.group = group
        self._mtime_ns: int | None = None
        existing = read_command(self.path)
        now_ms = int(time.time() * 1000)
        # orders written before this worker started are done, unless they are recent
        if existing is None:
            self._seq = 0
        elif now_ms - existing.at_ms <= STALE_MS:
            self._seq = existing.seq - 1
        else:
            self._seq = existing.seq

    def poll(self) -> CircuitCommand | None:
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            return None
        if mtime == self._mtime_ns:
            return None
        self._mtime_ns = mtime
        cmd = read_command(self.path)
        if cmd is None or cmd.seq <= self._seq or cmd.group != self.group:
            return None
        self._seq = cmd.seq
        return cmd


__all__ = [
    "CircuitCommand",
    "CommandReader",
    "circuit_dir",
    "command_path",
    "read_command",
    "write_command",
]
