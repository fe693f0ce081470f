"""The replay jobs of one process, kept in memory for its lifetime."""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable

from retryd.replay.errors import ReplayError, ShuttingDown
from retryd.replay.jobs import JobSpec, ReplayJob

log = logging.getLogger(__name__)


class JobManager:
    """Jobs of this process, kept in memory for its lifetime (the oldest finished ones are
    dropped past ``keep``)."""

    def __init__(
        self, factory: Callable[[JobSpec], ReplayJob], keep: int = 1000, max_running: int = 4
    ) -> None:
        self.factory = factory
        self.keep = keep
        self.max_running = max_running
        self._jobs: dict[str, ReplayJob] = {}
        self._lock = threading.Lock()
        self._closing = False

    def create(self, spec: JobSpec) -> ReplayJob:
        with self._lock:
            if self._closing:
                raise ShuttingDown("the sidecar is shutting down: no new replay job starts")
            running = sum(1 for j in self._jobs.values() if not j.finished)
            if running >= self.max_running:
                raise TooManyJobs(
                    f"{running} replay jobs are running (limit {self.max_running}); "
                    "wait for one to finish or cancel one"
                )
            job = self.factory(spec)
            self._jobs[job.id] = job
            finished = [j for j in self._jobs.values() if j.finished]
            for old in finished[: max(0, len(self._jobs) - self.keep)]:
                del self._jobs[old.id]
            # Started under the lock: shutdown() sees every job that will ever run.
            return job.start()

    def get(self, job_id: str) -> ReplayJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def list(self) -> list[ReplayJob]:
        with self._lock:
            return list(self._jobs.values())

    def cancel_all(self, timeout_s: float = 10.0) -> None:
        jobs = self.list()
        for job in jobs:
            job.cancel()
        deadline = time.monotonic() + timeout_s
        for job in jobs:
            job.wait(max(0.0, deadline - time.monotonic()))

    def shutdown(self, timeout_s: float | None = None) -> builtins.list[ReplayJob]:
        """Refuse new jobs, cancel the running ones and wait until each has stopped: its
        copies in flight acknowledged and recorded in the ledger, or known failed. Waits
        each job's own bound (``ReplayJob.shutdown_bound_s``) unless ``timeout_s`` is given;
        returns the jobs still running after it (a bug: the caller must not close the
        ledger under them)."""
        with self._lock:
            self._closing = True
            jobs = [j for j in self._jobs.values() if not j.finished]
        for job in jobs:
            job.cancel()
        bound = timeout_s
        if bound is None:
            bound = max((j.shutdown_bound_s() for j in jobs), default=0.0)
        deadline = time.monotonic() + bound
        for job in jobs:
            if not job.wait(max(0.0, deadline - time.monotonic())):
                log.error("replay job %s did not stop within %.0fs of shutdown", job.id, bound)
        return [j for j in jobs if not j.finished]


class TooManyJobs(ReplayError):
    """The per-process limit of concurrently running jobs is reached."""
