"""The contiguous low watermark: an offset is committable only when all lower ones are done."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retryd.worker.offsets import OffsetTracker
from retryd.worker.schedule import PauseSchedule


def test_out_of_order_finish_advances_only_over_the_contiguous_prefix() -> None:
    t = OffsetTracker()
    for o in (10, 11, 12, 13):
        t.begin(o)
    t.finish(12)
    assert t.committable is None
    t.finish(10)
    assert t.committable == 11
    t.finish(11)
    assert t.committable == 13
    assert t.pending == 1
    t.finish(13)
    assert t.committable == 14 and t.pending == 0


def test_take_store_reports_each_advance_once() -> None:
    t = OffsetTracker()
    t.begin(0)
    assert t.take_store() is None
    t.finish(0)
    assert t.take_store() == 1
    assert t.take_store() is None


def test_gaps_in_offsets_are_fine_and_misuse_is_refused() -> None:
    t = OffsetTracker()
    t.begin(5)
    t.begin(9)  # compacted / transactional gap
    t.finish(9)
    t.finish(5)
    assert t.committable == 10
    with pytest.raises(ValueError):
        t.begin(7)
    with pytest.raises(ValueError):
        t.finish(3)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.randoms())
def test_watermark_never_passes_an_unfinished_offset(gaps: list[int], rnd) -> None:  # type: ignore[no-untyped-def]
    t = OffsetTracker()
    offsets, o = [], 0
    for g in gaps:
        o += g + 1
        offsets.append(o)
        t.begin(o)
    order = offsets[:]
    rnd.shuffle(order)
    done: set[int] = set()
    for o in order:
        t.finish(o)
        done.add(o)
        if t.committable is not None:
            assert all(x in done for x in offsets if x < t.committable)
            below = [x for x in offsets if x >= t.committable]
            assert not below or below[0] not in done or t.committable == below[0]
    assert t.committable == offsets[-1] + 1 and t.pending == 0


def test_pause_schedule_orders_by_due_time_and_drops_revoked() -> None:
    s = PauseSchedule()
    s.add(("t", 0), 5, 2000)
    s.add(("t", 1), 7, 1000)
    s.add(("u", 0), 1, 3000)
    assert s.next_due_ms() == 1000
    s.drop(("t", 1))
    assert s.next_due_ms() == 2000
    assert [w.tp for w in s.pop_due(2500)] == [("t", 0)]
    assert s.topics() == {"u": 1}
    assert s.pop_due(2999) == []
    s.add(("u", 0), 1, 2500)  # re-paused earlier: the newest wait wins
    assert [w.due_ms for w in s.pop_due(2600)] == [2500]
    assert len(s) == 0 and s.next_due_ms() is None
