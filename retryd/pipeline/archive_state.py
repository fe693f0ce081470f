"""The archive's own state, stored beside the data in ``<out>/_retryd_archive/``.

A write-once log, so it works on every Hadoop file system (no in-place replace needed):

- ``pending/<N>.json``: the offset ranges of batch N, fixed before anything is written, so a
  re-run after a crash redoes exactly the same ranges;
- ``commits/<N>.json``: batch N is done. It holds the next offset to archive per partition
  (cumulative: the newest commit is the checkpoint), the record count and the files. Only the
  newest ``KEEP_COMMITS`` are kept; continuous runs commit every trigger.

One archive run per directory at a time: on a local file system an exclusive ``flock`` (the
kernel drops it when the process dies); elsewhere a lock file created only if absent, removed
at the end (a run killed with SIGKILL leaves it behind, and the next run says which file to
delete once no run is active). Archives written by earlier versions (``checkpoint.json`` and
``pending.json``, replaced in place) are read and carried on.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from retryd.errors import RetrydError
from retryd.pipeline.hadoopfs import HadoopFS, StoreError
from retryd.pipeline.offsets import OffsetRange

log = logging.getLogger(__name__)
STATE_DIR = "_retryd_archive"
KEEP_COMMITS = 50


class ArchiveError(RetrydError):
    """The archive directory is unusable (another topic's archive, locked, corrupt state)."""


def _batch_numbers(names: list[str]) -> list[int]:
    stems = (n.removesuffix(".json") for n in names if n.endswith(".json"))
    return sorted(int(stem) for stem in stems if stem.isdigit())


class ArchiveState:
    """Checkpoint, pending batch and lock of one archive directory."""

    def __init__(self, store: HadoopFS, topic: str) -> None:
        self.store = store
        self.topic = topic

    def _rel(self, *parts: str) -> str:
        return "/".join((STATE_DIR, *parts))

    def _check_topic(self, data: Mapping[str, Any], where: str) -> None:
        if data.get("topic") != self.topic:
            raise ArchiveError(
                f"{self.store.uri} archives topic {data.get('topic')!r}, not {self.topic!r} "
                f"(see {where})"
            )

    def _read(self, rel: str) -> Any:
        try:
            return self.store.read_json(rel)
        except StoreError as exc:
            raise ArchiveError(f"archive state is unreadable: {exc}") from exc

    def commits(self) -> list[int]:
        return _batch_numbers(self.store.list_names(self._rel("commits")))

    def latest(self) -> tuple[int, dict[int, int]]:
        """(last committed batch, next offset per partition); (0, {}) for a new archive."""
        numbers = self.commits()
        if numbers:
            rel = self._rel("commits", f"{numbers[-1]}.json")
            data = self._read(rel)
        else:
            rel = self._rel("checkpoint.json")  # written by earlier versions
            data = self._read(rel)
            if data is None:
                return 0, {}
        self._check_topic(data, self.store.child_uri(rel))
        try:
            return int(data["batch"]), {int(p): int(o) for p, o in data["offsets"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ArchiveError(f"{self.store.child_uri(rel)} is not a checkpoint: {exc}") from exc

    def pending(self, batch: int) -> list[OffsetRange] | None:
        """The fixed ranges of ``batch`` if a run planned it and did not commit it."""
        data = self._read(self._rel("pending", f"{batch}.json"))
        if data is None:
            legacy = self._read(self._rel("pending.json"))
            data = legacy if legacy is not None and legacy.get("batch") == batch else None
        if data is None:
            return None
        self._check_topic(data, f"pending batch {batch}")
        return [
            OffsetRange(self.topic, int(r["partition"]), int(r["start"]), int(r["end"]))
            for r in data["ranges"]
        ]

    def pending_batches(self) -> list[int]:
        found = _batch_numbers(self.store.list_names(self._rel("pending")))
        legacy = self._read(self._rel("pending.json"))
        if legacy is not None:
            found.append(int(legacy["batch"]))
        return sorted(set(found))

    def drop_pending(self, batch: int) -> None:
        self.store.delete(self._rel("pending", f"{batch}.json"))
        legacy = self._read(self._rel("pending.json"))
        if legacy is not None and int(legacy.get("batch", -1)) <= batch:
            self.store.delete(self._rel("pending.json"))

    def write_pending(self, batch: int, ranges: list[OffsetRange]) -> None:
        rel = self._rel("pending", f"{batch}.json")
        self.store.delete(rel)  # an older plan of this batch never committed anything
        rows = [{"partition": r.partition, "start": r.start, "end": r.end} for r in ranges]
        self.store.write_json_new(rel, {"topic": self.topic, "batch": batch, "ranges": rows})

    def commit(self, batch: int, offsets: Mapping[int, int], manifest: Mapping[str, Any]) -> None:
        """Batch ``batch`` is done once ``commits/<batch>.json`` exists."""
        data = {
            **manifest,
            "topic": self.topic,
            "batch": batch,
            "offsets": {str(p): o for p, o in sorted(offsets.items())},
            "committed_ms": int(time.time() * 1000),
        }
        try:
            self.store.write_json_new(self._rel("commits", f"{batch}.json"), data)
        except StoreError as exc:
            raise ArchiveError(f"cannot commit batch {batch}: {exc}") from exc
        self.drop_pending(batch)
        for name in ("checkpoint.json", "pending.json"):  # superseded by the log
            self.store.delete(self._rel(name))
        for old in self.commits()[:-KEEP_COMMITS]:
            self.store.delete(self._rel("commits", f"{old}.json"))

    def manifest(self, batch: int) -> dict[str, Any] | None:
        data = self._read(self._rel("commits", f"{batch}.json"))
        return None if data is None else dict(data)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory's lock for the duration (see the module docstring)."""
        self.store.mkdirs(STATE_DIR)
        if self.store.is_local:
            with self._local_lock():
                yield
        else:
            with self._lock_file():
                yield

    @contextmanager
    def _local_lock(self) -> Iterator[None]:
        path = self.store.local_path(self._rel("lock"))
        with open(path, "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise ArchiveError(f"another archive run is using {self.store.uri}") from exc
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextmanager
    def _lock_file(self) -> Iterator[None]:
        rel = self._rel("lock.json")
        owner = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since_ms": int(time.time() * 1000),
        }
        try:
            self.store.create_exclusive(rel, json.dumps(owner).encode("utf-8"))
        except StoreError as exc:
            holder = self._read(rel)
            raise ArchiveError(
                f"another archive run is using {self.store.uri} (lock {self.store.child_uri(rel)}"
                f" held by {holder}); if no run is active, delete that file"
            ) from exc
        try:
            yield
        finally:
            self.store.delete(rel)
