"""Group-wide drain: a sibling's routed copy that the owner has not consumed yet blocks it."""

from __future__ import annotations

from retryd.hosting.drain import _caught_up
from retryd.runtime.heartbeat import Heartbeat


def _hb(pid: int, positions: dict[str, int], produced: dict[str, int]) -> Heartbeat:
    return Heartbeat(pid, "all", "g", 0.0, len(positions), 0, "running", True, positions, produced)


def test_copy_routed_into_a_siblings_partition_must_be_consumed_first() -> None:
    a = _hb(1, {"orders/0": 10, "retry_1s/0": 4}, {"retry_1s/1": 7})
    b_behind = _hb(2, {"orders/1": 9, "retry_1s/1": 6}, {})
    b_done = _hb(2, {"orders/1": 9, "retry_1s/1": 7}, {})
    assert not _caught_up([a, b_behind])
    assert _caught_up([a, b_done])


def test_copies_to_unconsumed_topics_do_not_count() -> None:
    a = _hb(1, {"orders/0": 3}, {"failed/0": 12})
    assert _caught_up([a])
