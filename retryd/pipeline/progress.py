"""Progress output for the Spark jobs: one rich bar per step, filled from Spark's task counts.

Each step runs its Spark actions under its own job group; a background thread reads the
status tracker (completed / total tasks of the group's stages) twice a second.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
_POLL_S = 0.5


class JobProgress:
    """Use as a context manager; wrap each phase of a job in ``with progress.step("..."):``."""

    def __init__(self, spark: SparkSession, console: Console | None = None) -> None:
        self.spark = spark
        self.console = console or Console(stderr=True)
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tasks"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self._prefix = f"retryd-{uuid.uuid4().hex[:8]}"
        self._active: tuple[str, TaskID] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.timings: dict[str, float] = {}

    def __enter__(self) -> JobProgress:
        self._progress.start()
        self._thread = threading.Thread(target=self._poll, name="spark-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._progress.stop()

    @contextmanager
    def step(self, description: str) -> Iterator[None]:
        """Run Spark actions of one phase under a job group shown as one progress bar."""
        sc = self.spark.sparkContext
        group = f"{self._prefix}-{len(self.timings)}"
        task = self._progress.add_task(description, total=None)
        sc.setJobGroup(group, description)
        started = time.monotonic()
        with self._lock:
            self._active = (group, task)
        try:
            yield
        finally:
            with self._lock:
                self._active = None
            total, _ = self._task_counts(group)
            self._progress.update(task, total=max(total, 1), completed=max(total, 1))
            self.timings[description] = time.monotonic() - started
            log.info("%s: %d tasks in %.1fs", description, total, self.timings[description])

    def note(self, text: str) -> None:
        self._progress.console.print(text)

    def _task_counts(self, group: str) -> tuple[int, int]:
        tracker = self.spark.sparkContext.statusTracker()
        total = done = 0
        for job_id in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job_id)
            for stage_id in info.stageIds if info else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    total += stage.numTasks
                    done += stage.numCompletedTasks
        return total, done

    def _poll(self) -> None:
        while not self._stop.wait(_POLL_S):
            with self._lock:
                active = self._active
            if active is None:
                continue
            try:
                total, done = self._task_counts(active[0])
            except Exception as exc:  # the context may be stopping; progress is best effort
                log.debug("progress poll failed: %s", exc)
                continue
            if total:
                self._progress.update(active[1], total=total, completed=done)
