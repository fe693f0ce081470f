"""Per-partition low watermark of finished offsets.

An input offset may be stored only when it and every lower offset of its partition are finished
(handled, or the routed copy acknowledged). Delivery reports of different target topics arrive out
of order, so finished offsets are tracked and the contiguous prefix advances the watermark.
"""

from __future__ import annotations

from collections import deque


class OffsetTracker:
    """Offsets of one partition, begun in increasing order and finished in any order."""

    __slots__ = ("_finished", "_inflight", "_next_commit", "_stored")

    def __init__(self) -> None:
        self._inflight: deque[int] = deque()
        self._finished: set[int] = set()
        self._next_commit: int | None = None  # offset to store: everything below is finished
        self._stored: int | None = None

    def begin(self, offset: int) -> None:
        if self._inflight and offset <= self._inflight[-1]:
            raise ValueError(f"offset {offset} begun out of order after {self._inflight[-1]}")
        if self._next_commit is not None and offset < self._next_commit:
            raise ValueError(f"offset {offset} is below the finished watermark {self._next_commit}")
        self._inflight.append(offset)

    def finish(self, offset: int) -> None:
        if not self._inflight or offset < self._inflight[0]:
            raise ValueError(f"offset {offset} was not begun")
        if offset == self._inflight[0]:
            self._inflight.popleft()
            self._next_commit = offset + 1
            while self._inflight and self._inflight[0] in self._finished:
                done = self._inflight.popleft()
                self._finished.discard(done)
                self._next_commit = done + 1
        else:
            self._finished.add(offset)

    @property
    def pending(self) -> int:
        """Begun but not finished."""
        return len(self._inflight) - len(self._finished)

    @property
    def committable(self) -> int | None:
        return self._next_commit

    def take_store(self) -> int | None:
        """The offset to store now, if it advanced since the last call."""
        if self._next_commit is not None and self._next_commit != self._stored:
            self._stored = self._next_commit
            return self._next_commit
        return None
