"""When consecutive records of a partition may go through the engine as one run
(``retryd.worker.runs``): the scheduler's rule, since only the scheduler sees every record of
a partition that is queued, running or about to be submitted beside the run.

Issue 31 fault 8 was the rule living in the intake: it looked at the key lanes the scheduler
held *before* the records of the same batch were submitted. One batch carrying a partition as
P0-low, P1, P0-high (librdkafka's queue interleaves fetch responses so), with P0-low below
the post-failure backoff point (single records) and P0-high past it (a run), let the run take
its partition's lane beside P0-low's singles, which took key lanes a moment later: the run
started later offsets of keys whose earlier records had not run yet.

The rule now, with ``ordering=key`` (``may_go``, under the scheduler's lock, at submit):
a run of partition P starts behind an earlier run of P (its lane is P's), but never while P
has a single record queued or running (a key lane of P), or waiting behind P's runs
(``Scheduler._held``); such a run is *unfolded* into its single records, which queue in the
key lanes behind those. A single record of P submitted while a run of P holds the partition
waits behind it (held) and is queued the moment the run's lane is released. With
``ordering=partition`` runs and single records share the partition's lane, and with ``none``
nothing is ordered: the scheduler never needs to look.

Whether calls are fast enough for runs at all is measured by the thread pool
(``Scheduler.fast_calls``), or pinned (``RunPace``): by a test that must not depend on the
machine's speed, or by whoever builds a scheduler knowing better.

The means are here too (``unfold``, ``singles``): the scheduler unfolds the runs it refuses,
and ``retryd.worker.runs`` splits the ones that fail with them (this module imports nothing of
the engine but ``work``, so the scheduler may use it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from retryd.worker.work import new_work

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Container, Hashable

    from retryd.worker.partition import PartitionState
    from retryd.worker.work import Run, Work


class RunPace:
    """Are calls fast enough for runs? ``fast``: None to go by the thread pool's measurement,
    True or False to pin the answer. ``slow_call_s``: a call of a run slower than this counts
    towards stopping it (``runs.SLOW_STREAK`` in a row; None: ``slots.SLOW_CALL_S``); a pinned
    pace may make it infinite, so that a run never stops for the machine's sake.

    Pin ``fast=True`` only with the thread pool (a sync handler): it is the one pool that runs
    runs."""

    __slots__ = ("fast", "slow_call_s")

    def __init__(self, fast: bool | None = None, slow_call_s: float | None = None) -> None:
        self.fast = fast
        self.slow_call_s = slow_call_s

    def calls_fast(self, measured: bool) -> bool:
        return measured if self.fast is None else self.fast


def offered(st: PartitionState, by_key: bool, held: Container[Hashable]) -> bool:
    """Should the intake offer this batch's records of ``st`` as a run (calls being fast)?
    The intake's question, answered from what the scheduler holds now: a stale answer
    (slots release lanes meanwhile) is only conservative, and ``may_go`` decides at submit
    anyway. No for tier partitions, strict key order and closing assignments; no while the
    partition backs off after a failed run (``runs_from``: failures come in bunches, and a
    split costs more than a run saves); with ``by_key``, no while the partition has key
    lanes or records held behind its runs (the run would be unfolded at once)."""
    if st.delay_ms is not None or st.strict or st.closing:
        return False
    position = st.position
    if position is not None and position < st.runs_from:
        return False
    return not by_key or not (st.lanes or st in held)


def may_go(run: Run, held: Container[Hashable]) -> bool:
    """May ``run`` (``ordering=key``: its lane is its partition's) be queued as a run? Only
    when its partition has no key lane (a single record queued or running, including those
    submitted just before it) and nothing held behind its runs; behind an earlier run of its
    partition it may (it waits in that lane). Called under the scheduler's lock."""
    part = run.part
    return not part.lanes and part not in held


def singles(run: Run, start: int) -> list[Work]:
    """Single records (``Work``) for ``run.raws[start:]``, queued, with their ordering lock."""
    part = run.part
    topic, partition = part.topic, part.partition
    by_key = run.by_key
    lock = run.lock
    out = []
    for raw in run.raws[start:]:
        w = new_work(raw, topic, partition, raw.offset(), part)
        w.size = len(raw)
        w.lock = (part, raw.key()) if by_key else lock
        out.append(w)
    return out


def replace_in_pending(pending: deque[Work], old: Work, new: list[Work], keep: bool) -> None:
    """Put ``new`` in ``old``'s place in ``pending`` (after it, with ``keep``)."""
    at = pending.index(old) + (1 if keep else 0)
    pending.rotate(-at)
    if not keep:
        pending.popleft()
    pending.extendleft(reversed(new))
    pending.rotate(at)


def unfold(run: Run) -> list[Work]:
    """A run that never started becomes its single records, in its place in pending (the
    poll thread: it owns ``pending``)."""
    part = run.part
    works = singles(run, 0)
    replace_in_pending(part.pending, run, works, keep=False)
    part.pending_extra -= run.extra
    return works
