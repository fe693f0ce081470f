"""When paused partitions become due.

Within one tier topic every message has the same delay, so due times grow along a partition:
if the head is not due, nothing behind it is, and pausing the whole partition is exact.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Wait:
    tp: TP
    offset: int  # position the partition was sought back to
    due_ms: int


class PauseSchedule:
    def __init__(self) -> None:
        self._waits: dict[TP, Wait] = {}
        self._heap: list[tuple[int, TP]] = []

    def __len__(self) -> int:
        return len(self._waits)

    def __contains__(self, tp: TP) -> bool:
        return tp in self._waits

    def add(self, tp: TP, offset: int, due_ms: int) -> None:
        self._waits[tp] = Wait(tp, offset, due_ms)
        heapq.heappush(self._heap, (due_ms, tp))

    def drop(self, tp: TP) -> None:
        self._waits.pop(tp, None)  # stale heap entries are skipped lazily

    def pop_due(self, now_ms: int) -> list[Wait]:
        out: list[Wait] = []
        while self._heap and self._heap[0][0] <= now_ms:
            due, tp = heapq.heappop(self._heap)
            wait = self._waits.get(tp)
            if wait is not None and wait.due_ms == due:
                del self._waits[tp]
                out.append(wait)
        return out

    def next_due_ms(self) -> int | None:
        while self._heap:
            due, tp = self._heap[0]
            wait = self._waits.get(tp)
            if wait is not None and wait.due_ms == due:
                return due
            heapq.heappop(self._heap)
        return None

    def topics(self) -> dict[str, int]:
        """Paused partition count per topic (for the gauge)."""
        counts: dict[str, int] = {}
        for topic, _ in self._waits:
            counts[topic] = counts.get(topic, 0) + 1
        return counts
