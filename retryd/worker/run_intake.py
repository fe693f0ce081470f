"""The intake's side of runs (``retryd.worker.runs``): it *offers* a batch's consecutive
records of a partition as a run when the scheduler says it would take one
(``Scheduler.offers_run``), and the scheduler decides at submit, with every record of the
partition in view (``retryd.worker.run_policy``: the intake cannot see the single records of
the same batch it has not submitted yet). Also the runs that wait for the poll thread: stopped
as calls turned slow, to go on as single records."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from retryd.config import Ordering
from retryd.worker.lifecycle import QUEUED
from retryd.worker.runs import new_run, resume_singles

if TYPE_CHECKING:
    from retryd.worker.lifecycle import Lifecycle
    from retryd.worker.partition import PartitionState
    from retryd.worker.scheduler import Scheduler
    from retryd.worker.work import Work


class RunIntake:
    def __init__(self, ordering: Ordering, scheduler: Scheduler, lifecycle: Lifecycle) -> None:
        self.ordering = ordering
        self.by_key = ordering is Ordering.KEY
        self.scheduler = scheduler
        self.lifecycle = lifecycle

    def offer(self, st: PartitionState) -> bool:
        """Offer this batch's records of ``st`` as a run? (Calls are fast: the caller asked.)"""
        return self.scheduler.offers_run(st, self.by_key)

    def make(self, st: PartitionState, raws: list[Any], size: int, new: list[Work]) -> None:
        """A run of ``raws`` (consecutive records of ``st``), queued on ``new`` in consumption
        order; its lane is its partition's unless ``ordering = none``."""
        ordering = self.ordering
        lock = None if ordering is Ordering.NONE else st
        new.append(new_run(raws, size, st, lock, self.by_key))

    @property
    def waiting(self) -> bool:
        """Runs wait for the poll thread: stopped as calls turned slow."""
        return self.scheduler.has_slowed

    def release(self) -> None:
        """Runs stopped as calls turned slow go on as single records."""
        scheduler = self.scheduler
        for run in scheduler.take_slowed():
            if run.stage is QUEUED:
                resume_singles(run, scheduler, self.lifecycle)  # type: ignore[arg-type]
