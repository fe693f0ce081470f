"""Group-wide "drained" for several worker processes on one host.

One process cannot tell alone: a sibling may still route copies into its partitions, and during a
rebalance some partitions belong to nobody. The supervisor declares the group drained when every
partition of the subscribed topics is owned by a live child and every child reports itself idle,
continuously for a grace period.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from retryd.runtime.heartbeat import Heartbeat, read_heartbeats


class DrainWatch:
    def __init__(self, state_dir: Path, total_partitions: int, grace_s: float = 2.5) -> None:
        self.state_dir = state_dir
        self.total_partitions = total_partitions
        self.grace_s = grace_s
        self._since: float | None = None

    def check(self, pids: Iterable[int], now: float | None = None) -> bool:
        now = time.time() if now is None else now
        wanted = set(pids)
        beats = {hb.pid: hb for hb in read_heartbeats(self.state_dir) if hb.pid in wanted}
        idle = (
            len(beats) == len(wanted)
            and all(hb.drained for hb in beats.values())
            and sum(hb.assigned_partitions for hb in beats.values()) == self.total_partitions
            and _caught_up(beats.values())
        )
        if not idle:
            self._since = None
            return False
        if self._since is None:
            self._since = now
            return False
        # every child must have re-confirmed after the idle period started
        fresh = all(hb.ts > self._since for hb in beats.values())
        return fresh and now - self._since >= self.grace_s


def _caught_up(beats: Iterable[Heartbeat]) -> bool:
    """Every copy any child routed has been consumed by the partition's owner: a sibling's copy
    may not have been fetched yet by a child that otherwise looks idle."""
    beats = list(beats)
    positions: dict[str, int] = {}
    for hb in beats:
        positions.update(hb.positions)
    for hb in beats:
        for tp, end in hb.produced.items():
            if tp in positions and positions[tp] < end:
                return False
    return True
