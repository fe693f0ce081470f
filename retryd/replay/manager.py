"""The replay jobs of one process, kept in memory for its lifetime."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from retryd.replay.errors import ReplayError
from retryd.replay.jobs import JobSpec, ReplayJob


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

    def create(self, spec: JobSpec) -> ReplayJob:
        with self._lock:
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


class TooManyJobs(ReplayError):
    """The per-process limit of concurrently running jobs is reached."""
