"""One consumed record on its way through the worker.

``Work`` *is* the handler's ``Message`` view (a subclass with engine-only slots), so the hot
path builds one object per record, not a view plus a bookkeeping record.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from retryd.handlers.base import Message
from retryd.policy.classify import HandlerResult

if TYPE_CHECKING:
    from retryd.worker.partition import PartitionState


class Work(Message):
    __slots__ = ("due", "lock", "next", "part", "result", "seconds", "size", "started", "state")

    # state values: what happened to this record so far
    QUEUED = 0  # waiting for its turn (ordering) or a free handler slot
    RUNNING = 1
    FINISHED = 2  # result set, not yet settled by the loop
    ROUTING = 3  # routed copy sent, waiting for the broker's acknowledgement
    DONE = 4  # settled: its offset may be stored once every lower one is done

    part: PartitionState
    lock: Hashable | None  # ordering key: records with the same lock never overlap
    next: Work | None  # the record of the same lock queued behind this one
    due: int  # tier records: effective due time (epoch ms); 0 on main topics
    size: int  # value bytes (buffer accounting)
    result: HandlerResult | None
    started: float  # perf_counter() when the handler call started
    seconds: float  # handler call duration
    state: int


def new_work(raw: Any, topic: str, partition: int, offset: int, part: PartitionState) -> Work:
    """A Work over the client's message, built without a keyword-heavy constructor call."""
    w = Work.__new__(Work)
    w._raw = raw
    w._env = None
    w.topic = topic
    w.partition = partition
    w.offset = offset
    w.part = part
    w.due = 0
    w.state = 0
    w.next = None
    return w
