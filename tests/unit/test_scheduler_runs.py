"""The scheduler decides runs (``retryd.worker.run_policy``, issue 31 fault 8): a run of a
partition goes as one only with no single record of that partition queued, running or held
beside it; single records wait behind a run that holds their partition. Driven directly, one
submit at a time: no threads, no clock."""

from __future__ import annotations

from typing import Any

from retryd.worker.lifecycle import SUCCEEDED
from retryd.worker.partition import PartitionState
from retryd.worker.run_policy import offered
from retryd.worker.runs import new_run
from retryd.worker.scheduler import Scheduler
from retryd.worker.work import Run, Work, new_work
from tests.stub_kafka import StubMessage, StubRecord

KEYS = [b"a", b"b"]  # offset n has key KEYS[n % 2]


def _raw(offset: int) -> Any:
    return StubMessage(StubRecord("orders", 0, offset, KEYS[offset % 2], b"v", [], 1))


def _singles(part: PartitionState, offsets: range) -> list[Work]:
    """Single records as the intake makes them (``ordering = key``)."""
    out = []
    for o in offsets:
        raw = _raw(o)
        w = new_work(raw, "orders", 0, o, part)
        w.size = len(raw)
        w.lock = (part, raw.key())
        part.pending.append(w)
        out.append(w)
    return out


def _run(part: PartitionState, offsets: range, by_key: bool = True) -> Run:
    raws = [_raw(o) for o in offsets]
    return new_run(raws, sum(map(len, raws)), part, part, by_key)


def _chain(w: Work) -> list[int]:
    out = [w.offset]
    while w.next is not None:
        w = w.next
        out.append(w.offset)
    return out


def test_a_run_behind_singles_of_its_partition_in_one_submit_goes_as_singles() -> None:
    """P0-low as singles, then P0-high offered as a run, submitted together: the run is
    unfolded into its records, which queue in their keys' lanes behind P0-low's."""
    part = PartitionState("orders", 0, None)
    s = Scheduler()
    low = _singles(part, range(4))
    high = _run(part, range(4, 8))
    s.submit([*low, high])
    assert list(s.ready) == low[:2]  # the head of each key: nothing of the run is ready
    assert _chain(low[0]) == [0, 2, 4, 6] and _chain(low[1]) == [1, 3, 5, 7]
    assert [w.offset for w in part.pending] == list(range(8))
    assert not any(w.many for w in part.pending) and part.pending_extra == 0
    assert part.lanes == 2


def test_a_run_goes_as_one_when_its_partition_has_no_single() -> None:
    part = PartitionState("orders", 0, None)
    s = Scheduler()
    first, second = _run(part, range(4)), _run(part, range(4, 8))
    s.submit([first, second])
    assert list(s.ready) == [first] and first.next is second  # its partition's lane
    assert part.lanes == 0


def test_singles_wait_behind_the_run_holding_their_partition_then_queue_in_order() -> None:
    """A single record submitted while a run holds the partition waits (held), and so does a
    later run (unfolded, behind it); the run's lane released, they queue in offset order."""
    part = PartitionState("orders", 0, None)
    s = Scheduler()
    run = _run(part, range(4))
    s.submit([run])
    single = _singles(part, range(4, 5))
    later = _run(part, range(5, 7))
    s.submit([*single, later])
    assert list(s.ready) == [run] and run.next is None  # nothing chained: all held
    assert not s.offers_run(part, by_key=True)  # the intake is told not to offer runs
    assert s.take() == [run]
    run.stage = SUCCEEDED
    s.release_settled([run])
    ready = list(s.ready)
    assert [w.offset for w in ready] == [4, 5] and not any(w.many for w in ready)
    assert _chain(ready[0]) == [4, 6]
    assert part.lanes == 2 and s.offers_run(part, by_key=True) is False


def test_a_failed_run_hands_over_its_chain_then_what_was_held() -> None:
    part = PartitionState("orders", 0, None)
    s = Scheduler()
    run, chained = _run(part, range(4)), _run(part, range(4, 6))
    s.submit([run, chained])
    held = _singles(part, range(6, 8))
    s.submit(held)
    assert s.detach(run) == [chained, *held]
    assert part not in s._tails and not s._held


def test_partition_order_shares_one_lane_and_never_unfolds() -> None:
    part = PartitionState("orders", 0, None)
    s = Scheduler()
    singles = _singles(part, range(2))
    for w in singles:
        w.lock = part
    run = _run(part, range(2, 4), by_key=False)
    s.submit([*singles, run])
    assert list(s.ready) == singles[:1] and _chain(singles[0]) == [0, 1, 3]  # the run: 3


def test_a_released_assignment_drops_what_was_held() -> None:
    part = PartitionState("orders", 0, None)
    s = Scheduler()
    s.submit([_run(part, range(2))])
    s.submit(_singles(part, range(2, 4)))
    s.forget([part])
    assert not s._held and not s._tails and not s.ready


def test_runs_are_offered_past_the_backoff_point_with_no_key_lane() -> None:
    part = PartitionState("orders", 0, None)
    part.position, part.runs_from = 100, 150
    assert not offered(part, True, {})  # a run failed a moment ago
    part.position = 150
    assert offered(part, True, {})
    part.lanes = 1
    assert not offered(part, True, {}) and offered(part, False, {})
    assert not offered(PartitionState("retry_1s", 0, 1000), False, {})  # a tier partition
