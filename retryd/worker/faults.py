"""The first fault that must stop a run, recorded by whichever collaborator meets it.

Collaborators are handed this holder when they are built, instead of a callback wired back
through the engine; the poll loop checks it every iteration and stops.
"""

from __future__ import annotations


class Faults:
    __slots__ = ("first",)

    def __init__(self) -> None:
        self.first: BaseException | None = None

    def set(self, exc: BaseException) -> None:
        """Record ``exc`` unless an earlier fault is already recorded (the first one wins)."""
        if self.first is None:
            self.first = exc

    def __bool__(self) -> bool:
        return self.first is not None
