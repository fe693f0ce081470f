"""Explicit per-record outcomes a batch handler may return (``retryd.Retry``, ``retryd.Dead``).

A per-record handler says "failed" by raising; a batch handler answers for many records at
once, so it cannot raise for one of them. It returns one outcome per record instead: ``None``
(or ``True``) for a success, an exception instance (classified as if it had been raised), or
one of these two when the reason is known without an exception at hand.
"""

from __future__ import annotations


class _Verdict:
    """A reason string; it becomes the failure's error class (what error routes and the
    ``retryd_error_class`` header see)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str = "") -> None:
        self.reason = str(reason)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash((type(self), self.reason))


class Retry(_Verdict):
    """This record failed and may succeed later: it goes to its next retry tier."""


class Dead(_Verdict):
    """This record can never succeed: it is dead-lettered at once (``non_retryable``)."""


__all__ = ["Dead", "Retry"]
