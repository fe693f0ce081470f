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

The files are input like any other (``read_heartbeats``): a reader takes at most
``MAX_BYTES`` of a regular file named ``<pid>.json`` (not following a symlink), parses it with
bounded nesting and numbers (``retryd.runtime.boundedjson``, shared with the circuit orders)
and checks every field's type; any other file is skipped, logged once per file state (its
name and why, never its content). Nothing in a file can raise out of ``read_heartbeats``,
which the sidecar's readiness, metrics and ``GET /v1/circuit`` call. The writer stays within
that bound (``HeartbeatWriter.beat``): with so many partitions that their positions would not
fit, it leaves them out.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import time
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from retryd.runtime import boundedjson
from retryd.runtime.boundedjson import Refused
from retryd.runtime.paths import heartbeat_dir

log = logging.getLogger(__name__)

# The biggest heartbeat file read. A worker writes ~0.5 KiB plus ~50 bytes per partition it
# owns or routed copies to (topic names of ~30 characters): 2,000 partitions and 2,000 routed
# to take ~210 KiB; with 64-character names ~345 KiB. Beyond this the writer leaves the
# positions out (``HeartbeatWriter.beat``). Well below what a hostile file may hold (a megabyte
# is refused unread), and what a reader parses per request stays a few milliseconds.
MAX_BYTES = 512 * 1024
MAX_DEPTH = 8  # a heartbeat nests 3 levels (circuit -> transitions): bounds json.loads' recursion
PID_MAX = 2**31 - 1
COUNT_MAX = 2**53 - 1  # partition counts stay exact in every JSON reader
INT64 = 2**63  # offsets and milliseconds: Kafka's and the clock's 64-bit integers


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
        self.trimmed = False  # the last heartbeat was written without positions (too many)
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
            data = self._bounded(hb)
            tmp.write_bytes(data)
            os.replace(tmp, self.path)
        except OSError as exc:
            self._failed(exc)
            return
        if self.failing is not None:
            log.warning(
                "heartbeat %s written again (it failed %d times)", self.path, self.write_failures
            )
            self.failing = None

    def _bounded(self, hb: Heartbeat) -> bytes:
        """The heartbeat's file content, at most ``MAX_BYTES`` (what readers take). With too
        many partitions for their positions to fit, they are left out, and ``drained`` is
        false: the ``--processes`` supervisor cannot judge the group drained without them
        (``retryd.hosting.drain``), while liveness, readiness and the circuit views are
        unaffected. Raises ``OSError`` (EFBIG) when even the rest does not fit."""
        doc = asdict(hb)
        data = _encode(doc)
        full = len(data)
        if full > MAX_BYTES:
            doc.update(drained=False, positions={}, produced={})
            data = _encode(doc)
        if full > MAX_BYTES and not self.trimmed:
            log.warning(
                "heartbeat %s would be %d bytes with the positions of %d partitions (at most "
                "%d are read): written without them, so this process is never seen drained "
                "by `--processes N --until-drained` while this lasts",
                self.path,
                full,
                len(hb.positions) + len(hb.produced),
                MAX_BYTES,
            )
        elif full <= MAX_BYTES and self.trimmed:
            log.warning("heartbeat %s holds the partitions' positions again", self.path)
        self.trimmed = full > MAX_BYTES
        if len(data) > MAX_BYTES:
            raise OSError(errno.EFBIG, f"the heartbeat is more than {MAX_BYTES} bytes")
        return data

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


def _encode(doc: dict[str, Any]) -> bytes:
    # UTF-8 as it is, and a lone surrogate (from a handler's error text) as "?": a reader
    # refuses the escape of one, which no HTTP answer could carry
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "replace")


# --- reading ------------------------------------------------------------------------------------

_NAME = re.compile(r"([1-9][0-9]{0,9})\.json")
_refusals = boundedjson.Refusals(limit=1024)


def read_heartbeats(state_dir: Path) -> list[Heartbeat]:
    """Every usable heartbeat in the state dir (by file name). A file that is not one is
    skipped (``read_heartbeat``); no directory, or one that cannot be listed, has none.
    Never raises."""
    directory = heartbeat_dir(state_dir)
    try:
        with os.scandir(directory) as entries:
            names = sorted(e.name for e in entries if e.name.endswith(".json"))
    except OSError:
        return []
    out = []
    for name in names:
        hb = read_heartbeat(directory / name)
        if hb is not None:
            out.append(hb)
    return out


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The heartbeat in ``path``; None when there is none or the file is not a usable
    heartbeat: logged once per file state, by name and why (never its content). A file that
    stays refused costs an ``open`` and a ``stat`` per read after the first. Never raises."""
    hb, problem, state = _load(path)
    if problem is None:
        _refusals.forget(str(path))
    elif _refusals.first(str(path), state):
        # (the name is quoted: a file name may hold line breaks)
        log.warning("heartbeat file %r %s: skipped, not counted as a worker", str(path), problem)
    return hb


def _load(path: Path) -> tuple[Heartbeat | None, str | None, Hashable]:
    """(heartbeat, None, _) or (None, why it is refused, the file state refused)."""
    named = _NAME.fullmatch(path.name)
    if named is None:
        return None, "is not named <pid>.json", ("name",)
    data, problem, state = boundedjson.read_regular(
        path, MAX_BYTES, follow_symlinks=False, refusals=_refusals
    )
    if data is None:
        return None, problem, state
    try:
        doc = boundedjson.loads(data, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, unicode_only=True)
        hb = parse_heartbeat(doc)
    except Refused as exc:
        return None, str(exc), state
    if hb.pid != int(named[1]):
        return None, "holds another pid than its name", state
    return hb, None, state


def _int(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _field_int(doc: dict[str, Any], name: str, low: int, high: int) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or not _int(value, low, high):
        raise Refused(f"has no {name} (an integer from {low} to {high})")
    return value


def _field_text(doc: dict[str, Any], name: str) -> str:
    value = doc.get(name)
    if not isinstance(value, str):
        raise Refused(f"has no {name} (text)")
    return value


def _offsets(doc: dict[str, Any], name: str) -> dict[str, int]:
    value = doc.get(name, {})
    if not isinstance(value, dict) or not all(_int(v, -INT64, INT64 - 1) for v in value.values()):
        raise Refused(f"has no {name} (an object of topic/partition: offset)")
    return value


# the circuit's fields (``CircuitSnapshot.as_dict``): each may be missing or null
_CIRCUIT_TEXT = ("state", "reason", "last_error")
_CIRCUIT_INT = ("since_ms", "next_probe_ms", "held", "probes")


def _circuit(doc: dict[str, Any]) -> dict[str, object]:
    """The circuit report, of its known fields only, each null or of its type: a garbled one
    is left out (the views show it as unknown) while the heartbeat still counts, since the
    process's liveness does not depend on it (tests/unit/test_circuit_api.py)."""
    value = doc.get("circuit")
    if not isinstance(value, dict):
        return {}
    out: dict[str, object] = {}
    for name in _CIRCUIT_TEXT:
        if name in value and (value[name] is None or isinstance(value[name], str)):
            out[name] = value[name]
    for name in _CIRCUIT_INT:
        if name in value and (value[name] is None or _int(value[name], -INT64, INT64 - 1)):
            out[name] = value[name]
    transitions = value.get("transitions")
    if isinstance(transitions, dict):
        out["transitions"] = {k: n for k, n in transitions.items() if _int(n, 0, INT64 - 1)}
    return out


def parse_heartbeat(doc: object) -> Heartbeat:
    """The heartbeat in a parsed heartbeat file, every field of its type (fields this
    version does not know are ignored; the circuit report is cleaned, ``_circuit``). Raises
    ``Refused``, saying which field is wrong (never its value)."""
    if not isinstance(doc, dict):
        raise Refused("is not a JSON object")
    ts = doc.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise Refused("has no ts (a finite number of seconds)")
    drained = doc.get("drained", False)
    if not isinstance(drained, bool):
        raise Refused("has no drained (true or false)")
    return Heartbeat(
        pid=_field_int(doc, "pid", 1, PID_MAX),
        role=_field_text(doc, "role"),
        group_id=_field_text(doc, "group_id"),
        ts=float(ts),
        assigned_partitions=_field_int(doc, "assigned_partitions", 0, COUNT_MAX),
        paused_partitions=_field_int(doc, "paused_partitions", 0, COUNT_MAX),
        state=_field_text(doc, "state"),
        drained=drained,
        positions=_offsets(doc, "positions"),
        produced=_offsets(doc, "produced"),
        circuit=_circuit(doc),
    )


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
