"""Operators' orders to the circuit breakers of the workers sharing a state directory.

The sidecar (``POST /v1/circuit``) writes one small JSON file per group,
``<state_dir>/circuit/<group digest>.json``: ``{"seq", "action", "by", "at_ms", "group"}``.
Every worker process of that group reads it once per heartbeat interval and applies an order
whose ``seq`` is higher than the last it applied, so each order reaches every
``--processes`` child once, and a worker that starts later applies only orders newer than
``STALE_MS`` (an old "open" must not stop a fresh deployment). Like heartbeats, it reaches the
processes of one pod: each pod's sidecar steers its own workers.

Writers (sidecar threads, several processes) take an exclusive ``flock`` on
``<digest>.lock`` beside the file, so each order gets the next ``seq`` (unique, increasing);
the file is written under a unique temporary name, fsynced and renamed over the old one, so a
reader sees the old order or the new one, never half of one. The lock file also keeps the last
``seq`` given, so an order file that was spoiled or removed does not restart the numbering
below what the workers already applied (they would ignore the next orders).

The file is input like any other: a reader takes at most ``MAX_BYTES`` of a regular file and
parses it with bounded nesting and bounded numbers (``parse_command``, with the reader shared
with worker heartbeats: ``retryd.runtime.boundedjson``), and anything else is
"no order", logged once per file state. Nothing in the file can raise out of ``read_command``
or ``CommandReader.poll``, which the workers' heartbeat and ``GET /v1/circuit`` call. The
reader detects a new order by its ``seq``, not the file's timestamp: two orders written within
one timestamp tick (and inode numbers are reused) are still two orders.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Hashable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from retryd.policy.circuit import CircuitAction
from retryd.runtime import boundedjson

log = logging.getLogger(__name__)

STALE_MS = 60_000  # an order older than this when a worker starts is not applied
BY_MAX = 64  # characters of the orderer's name kept
MAX_BYTES = 4096  # an order is ~150 bytes; a bigger file is refused unread
MAX_DEPTH = 8  # nesting allowed (an order is one flat object): bounds json.loads' recursion
MAX_DIGITS = boundedjson.MAX_DIGITS  # of any integer in the file (int() of a long one costs)
SEQ_MAX = 2**53 - 1  # seq and at_ms stay exact in every JSON reader (JavaScript's too)
LOCK_WAIT_S = 10.0  # a writer waits this long for the lock, then the order fails (503)


def circuit_dir(state_dir: Path) -> Path:
    return state_dir / "circuit"


def command_path(state_dir: Path, group: str) -> Path:
    digest = hashlib.sha256(group.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return circuit_dir(state_dir) / f"{digest}.json"


def lock_path(path: Path) -> Path:
    """The writers' lock beside the order file; never removed (removing a lock file while
    another writer waits on it would let two writers in)."""
    return path.with_suffix(".lock")


@dataclass(frozen=True, slots=True)
class CircuitCommand:
    seq: int
    action: CircuitAction
    by: str
    at_ms: int
    group: str


class OrderRefused(boundedjson.Refused):
    """The order file's content is not a usable order (the message says why)."""


# --- reading ------------------------------------------------------------------------------------


_ACTIONS = frozenset(a.value for a in CircuitAction)


def _count(doc: dict[str, object], name: str, low: int) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= SEQ_MAX:
        raise OrderRefused(f"has no {name} (an integer from {low} to {SEQ_MAX})")
    return value


def parse_command(data: bytes) -> CircuitCommand:
    """The order in ``data`` (an order file's bytes). Raises ``OrderRefused`` and nothing else:
    the size, the brackets and every number's digits are bounded before ``json.loads`` runs
    (``retryd.runtime.boundedjson``), so it cannot recurse deeply, convert a huge number or
    allocate much."""
    try:
        doc = boundedjson.loads(
            data, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, max_digits=MAX_DIGITS
        )
    except boundedjson.Refused as exc:
        raise OrderRefused(str(exc)) from None
    if not isinstance(doc, dict):
        raise OrderRefused("is not a JSON object")
    seq = _count(doc, "seq", 1)
    at_ms = _count(doc, "at_ms", 0)
    action = doc.get("action")
    if not isinstance(action, str) or action not in _ACTIONS:
        raise OrderRefused("has no action (open, close or probe)")
    by = doc.get("by")
    # printable: no line breaks or escapes forged into the workers' log, no lone surrogates
    # (they cannot be encoded into the API's answer)
    if not isinstance(by, str) or not by.isprintable():
        raise OrderRefused("has no orderer (by: printable text)")
    group = doc.get("group")
    if not isinstance(group, str):
        raise OrderRefused("has no group")
    return CircuitCommand(seq, CircuitAction(action), by[:BY_MAX], at_ms, group)


def _load(path: Path) -> tuple[CircuitCommand | None, str | None, Hashable]:
    """(order, None, _) or (None, why it is refused, the file state refused); (None, None, _)
    when there is no file. Reads at most ``MAX_BYTES + 1`` bytes, of a regular file only
    (``boundedjson.read_regular``: opening never waits)."""
    data, problem, state = boundedjson.read_regular(path, MAX_BYTES)
    if data is None:
        return None, problem, state
    try:
        return parse_command(data), None, state
    except OrderRefused as exc:
        return None, str(exc), state


_refusals = boundedjson.Refusals()


def read_command(path: Path) -> CircuitCommand | None:
    """The order in ``path``; None when there is none or it is not a usable order (logged once
    per file state). Never raises."""
    cmd, problem, state = _load(path)
    if problem is None:
        _refusals.forget(str(path))
    elif _refusals.first(str(path), (problem, state)):
        log.warning("circuit order file %s %s: no order is taken from it", path, problem)
    return cmd


# --- writing ------------------------------------------------------------------------------------


@contextmanager
def _locked(path: Path) -> Iterator[int]:
    """The writers' exclusive lock (a file descriptor of the lock file). Waits at most
    ``LOCK_WAIT_S``: a writer stuck while holding it must not hang every later order."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        errno.ETIMEDOUT,
                        f"another order kept the order file locked for {LOCK_WAIT_S:g} s",
                    ) from None
                time.sleep(pause)  # flock cannot wait with a timeout
                pause = min(pause * 2, 0.05)
        yield fd  # closing the descriptor releases the lock
    finally:
        os.close(fd)


def _last_given(lock_fd: int) -> int:
    """The last seq given, as the lock file keeps it; 0 when it does not (yet)."""
    text = os.pread(lock_fd, 32, 0).strip()
    value = int(text) if text.isdigit() and len(text) <= MAX_DIGITS else 0
    return value if value <= SEQ_MAX else 0  # (spoiled: the order file's seq decides)


def _record_given(lock_fd: int, seq: int) -> None:
    data = f"{seq}\n".encode()
    os.pwrite(lock_fd, data, 0)
    os.ftruncate(lock_fd, len(data))


def _remove_leftovers(path: Path) -> None:
    """Temporary files of writers that died before renaming theirs (called under the lock:
    no live writer has one)."""
    for tmp in path.parent.glob(f"{path.name}.*.tmp"):
        with suppress(OSError):
            tmp.unlink()


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # the rename itself survives a crash once the directory is synced
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems cannot sync a directory; the order is written all the same


def write_command(state_dir: Path, group: str, action: CircuitAction, by: str) -> CircuitCommand:
    """Write the next order for ``group`` and return it: its ``seq`` is one more than the
    highest given so far (whatever the order file holds now), unique among all writers.
    Raises ``OSError`` (``TimeoutError`` when the lock is not had in ``LOCK_WAIT_S``)."""
    path = command_path(state_dir, group)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(lock_path(path)) as lock_fd:
        current = read_command(path)
        last = max(_last_given(lock_fd), current.seq if current is not None else 0)
        if last >= SEQ_MAX:
            raise OSError(
                errno.EOVERFLOW,
                f"the order numbers are used up (seq {last}); remove the state dir's circuit "
                "directory to restart them, then restart the workers",
            )
        # what the readers accept: printable (token ids are; this keeps it so whoever calls)
        by = "".join(c if c.isprintable() else "?" for c in by[:BY_MAX])
        cmd = CircuitCommand(last + 1, action, by, int(time.time() * 1000), group)
        doc = {"seq": cmd.seq, "action": action.value, "by": cmd.by, "at_ms": cmd.at_ms}
        _remove_leftovers(path)
        _replace(path, json.dumps({**doc, "group": group}).encode())  # (ASCII: escaped)
        _record_given(lock_fd, cmd.seq)
    return cmd


# --- the workers' side --------------------------------------------------------------------------


class CommandReader:
    """A worker's view of its group's orders: ``poll`` returns each new one once. It reads the
    small file at every poll (once per heartbeat) and compares ``seq``s: a file's timestamp,
    size and inode can be the same for two orders."""

    def __init__(self, state_dir: Path, group: str) -> None:
        self.path = command_path(state_dir, group)
        self.group = group
        existing = self._read()
        now_ms = int(time.time() * 1000)
        # orders written before this worker started are done, unless they are recent
        if existing is None:
            self._seq = 0
        elif now_ms - existing.at_ms <= STALE_MS:
            self._seq = existing.seq - 1
        else:
            self._seq = existing.seq

    def _read(self) -> CircuitCommand | None:
        cmd = read_command(self.path)
        return cmd if cmd is not None and cmd.group == self.group else None

    def poll(self) -> CircuitCommand | None:
        """The order written since the last one applied, or None. Never raises."""
        cmd = self._read()
        if cmd is None or cmd.seq <= self._seq:
            return None
        self._seq = cmd.seq
        return cmd


__all__ = [
    "MAX_BYTES",
    "CircuitCommand",
    "CommandReader",
    "OrderRefused",
    "circuit_dir",
    "command_path",
    "lock_path",
    "parse_command",
    "read_command",
    "write_command",
]
