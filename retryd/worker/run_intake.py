"""Where the intake's records of a partition go as runs (``retryd.worker.runs``), and the runs
that wait for the poll thread: parked behind a busy run, or stopped as calls turned slow."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from retryd.config import Ordering
from retryd.worker.lifecycle import QUEUED
from retryd.worker.runs import new_run, resume_singles, unfold

if TYPE_CHECKING:
    from retryd.worker.lifecycle import Lifecycle
    from retryd.worker.partition import PartitionState
    from retryd.worker.scheduler import Scheduler
    from retryd.worker.work import Run, Work

SINGLE, RUN, PARKED = 0, 1, 2  # how a batch's records of a partition go (``RunIntake.mode``)


class RunIntake:
    def __init__(self, ordering: Ordering, scheduler: Scheduler, lifecycle: Lifecycle) -> None:
        self.ordering = ordering
        self.scheduler = scheduler
        self.lifecycle = lifecycle
        # ordering = key: runs consumed while the partition's runs are busy and calls are not
        # fast any more, in offset order
        self._parked: dict[PartitionState, list[Run]] = {}

    def mode(self, st: PartitionState, runs: bool) -> int:
        """How this batch's records of ``st`` go: as single records, as a run (``runs``: calls
        are fast), or as a run parked until the partition's runs are done."""
        if st.delay_ms is not None or st.strict or st.closing:
            return SINGLE
        if st in self._parked:
            return PARKED  # behind records already parked
        if runs and st.position is not None and st.position < st.runs_from:
            runs = False  # a run of it failed a moment ago
        if self.ordering is Ordering.KEY:
            if runs and not st.lanes:
                return RUN
            # a run of the partition still busy: key lanes may not start beside it
            return PARKED if self.scheduler.busy(st) else SINGLE
        return RUN if runs else SINGLE

    def make(
        self, st: PartitionState, raws: list[Any], size: int, mode: int, new: list[Work]
    ) -> None:
        """A run of ``raws``, queued on ``new`` (or parked)."""
        ordering = self.ordering
        r = new_run(
            raws, size, st, None if ordering is Ordering.NONE else st, ordering is Ordering.KEY
        )
        if mode == RUN:
            new.append(r)
        else:
            self._parked.setdefault(st, []).append(r)

    @property
    def waiting(self) -> bool:
        """Runs wait for the poll thread: parked, or stopped as calls turned slow."""
        return bool(self._parked) or self.scheduler.has_slowed

    def release(self, new: list[Work]) -> None:
        """Runs stopped as calls turned slow go on as single records; parked runs of
        partitions whose runs are done are queued on ``new`` as single records."""
        scheduler = self.scheduler
        if scheduler.has_slowed:
            for run in scheduler.take_slowed():
                if run.stage is QUEUED:
                    resume_singles(run, scheduler, self.lifecycle)  # type: ignore[arg-type]
        if self._parked:
            for st in [st for st in self._parked if not scheduler.busy(st)]:
                for r in self._parked.pop(st):
                    if r.stage is QUEUED:
                        new.extend(unfold(r))

    def forget(self, st: PartitionState) -> None:
        self._parked.pop(st, None)
