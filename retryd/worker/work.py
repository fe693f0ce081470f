"""The engine's bookkeeping of one consumed record (``Work``), apart from the handler's view.

The handler receives ``Work.msg``, a ``Message`` reading lazily from the client's record; the
engine's own state (stage, ordering key, chain link, attempt, result) lives here, where
business code cannot see or change it. Both objects are built with ``__new__`` and direct slot
writes: a keyword-heavy constructor would cost more than the rest of the per-record work.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from retryd.handlers.base import Message
from retryd.policy.classify import HandlerResult
from retryd.worker.lifecycle import QUEUED, Stage

if TYPE_CHECKING:
    from retryd.policy.headers import Envelope
    from retryd.policy.routing import Route
    from retryd.worker.partition import PartitionState


class Work:
    __slots__ = (
        "attempt",
        "chain",
        "clean",
        "due",
        "hold",
        "lock",
        "msg",
        "next",
        "offset",
        "part",
        "raw",
        "result",
        "route",
        "seconds",
        "since",
        "size",
        "stage",
        "steps",
    )

    msg: Message  # what the handler sees
    raw: Any  # the client's record
    part: PartitionState  # the assignment it was consumed under
    offset: int
    stage: Stage  # owned by ``Lifecycle`` (and the poll thread for intake/settling)
    attempt: int  # handler calls claimed so far; a stale call's result is ignored
    lock: Hashable | None  # ordering key: records with the same lock never overlap
    next: Work | None  # the record of the same lock queued behind this one
    due: int  # tier records: effective due time (epoch ms); 0 on main topics
    size: int  # value bytes (buffer accounting)
    result: HandlerResult | None
    route: Route | None  # exactly-once: the copy planned, sent once every lower offset settled
    seconds: float  # handler call duration
    # key_order = strict (set on the records of strict partitions only, by the intake):
    chain: bytes | None  # the key's chain id (None: the record keeps no order through retries)
    steps: list[Any] | None  # writes still to make before the record settles (in order)
    hold: bool  # a success settles through the poll thread (its chain entry is removed first)
    clean: bool  # decided to run with no chain entry: a success hands that verdict on
    since: int | None  # a parked copy: when it was first parked (its retryd_parked header)

    # A ``Run`` (``retryd.worker.runs``) stands for several records; a Work for one. Class
    # attributes, so a Work's construction writes neither.
    many = False
    extra = 0  # records beyond the first (``PartitionState.pending`` counts entries)

    @property
    def topic(self) -> str:
        return self.msg.topic

    @property
    def partition(self) -> int:
        return self.msg.partition

    @property
    def env(self) -> Envelope | None:
        env: Envelope | None = self.msg._env
        return env

    @property
    def where(self) -> str:
        """``topic[partition]@offset``, for log lines."""
        return self.msg.where

    def __repr__(self) -> str:
        return f"Work({self.where}, {self.stage.value}, attempt={self.attempt})"


class Run(Work):
    """Consecutive records of one main-topic partition consumed together, taken through the
    life cycle as one entry (``retryd.worker.runs``): ``offset`` is the *last* record's
    offset, so every bound that compares offsets (stores, revokes) holds for the whole run;
    ``done`` records of ``raws`` have succeeded."""

    __slots__ = ("by_key", "done", "extra", "raws")

    many = True
    by_key: bool  # ordering = key: its records, as single records, take key lanes
    raws: list[Any]
    done: int  # the record running (or to run next); every one before it succeeded
    extra: int


def new_work(raw: Any, topic: str, partition: int, offset: int, part: PartitionState) -> Work:
    """A Work (and its Message) over the client's record."""
    m = Message.__new__(Message)
    m._raw = raw
    m._env = None
    m._hdrs = None
    m.topic = topic
    m.partition = partition
    m.offset = offset
    w = Work.__new__(Work)
    w.msg = m
    w.raw = raw
    w.offset = offset
    w.part = part
    w.due = 0
    w.stage = QUEUED
    w.attempt = 0
    w.next = None
    w.result = None
    w.route = None
    return w


def work_of_message(message: Message, part: PartitionState) -> Work:
    """A Work carrying an already built ``Message`` (replays, tests)."""
    w = Work.__new__(Work)
    w.msg = message
    w.raw = message._raw
    w.offset = message.offset
    w.part = part
    w.due = 0
    w.stage = QUEUED
    w.attempt = 0
    w.next = None
    w.result = None
    w.route = None
    w.size = 0
    w.lock = None
    return w
