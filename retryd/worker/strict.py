"""``key_order = strict`` in the engine; the policy and its reasons are in
``retryd.policy.key_order``, the view in ``retryd.policy.chain_view``. Everything here runs on
the poll thread. The engine sees a small interface: ``assigned``/``forget`` (assignments),
``mark`` (a record of a strict key comes in), ``heads`` (lane heads decided now),
``steps_for``/``success_steps``/``acked`` (the writes that settle a strict record), ``tick``
(the view, late watermarks, orphans), ``gauges``, ``busy`` and ``close``.

How a strict record moves:

- **Lanes decide order, the chain decides whether to run.** Records of a strict key share a
  key lane in the scheduler, like ``ordering=key``. A record that becomes the head of its lane
  is *undecided* (``DECIDING``): the scheduler hands it here (``Scheduler.decisions``) instead
  of making it ready, and ``heads`` gives its verdict (run, park, duplicate, dead) from the
  view. One exception keeps the success path at slot speed: a record whose predecessor in the
  lane *succeeded* after being decided to run with no chain entry for its key inherits that
  verdict on the slot (``Work.clean``), since only this worker adds entries for the keys of its
  main partitions, and only through a failure or a park, which the slot never settles.
- **Catch-up.** After an assignment of a main partition nothing of it is decided before the
  view has read every state partition up to the high watermarks read at assignment time: the
  previous owner's entries are all seen. A watermark that cannot be read is read again (at most
  once a second) until it is; until then that partition's keys wait.
- **Steps.** A strict record settles through a short list of writes made in order, each
  acknowledged (acks=all) before the next is sent (``Settler``), all within the record's
  ``ROUTING`` stage, which a revoke waits for: a failure on a main topic adds the entry (and
  removes stale dead markers below it), then routes the copy; a park adds the entry (kind
  ``parked``), then routes the copy; a dead letter routes the copy, then removes the entry (a
  crash between the two redoes the record, never loses it); a success of a record whose entry
  exists removes it. The record keeps its key's lane until the last write is acknowledged.
- **Blocked records wait here first.** A record blocked by a lower entry (its key's head is
  still in the chain) is set aside in memory rather than parked: a main-topic record about as
  long as its head's first retry takes (then it is parked: an entry and a copy, and it leaves
  its partition), a tier copy until its chain changes (instead of being parked again and again).
  It goes back into its key's lane as soon as the view shows its chain moved, so when a head
  succeeds on its retry the records behind it run at once, in order, at handler speed.
- **Write-through.** An acknowledged state write is applied to the view at once, with its
  offset as version (``ChainView``), so the next record of the key is decided without waiting
  to read it back: parked copies of a key that come due together run one after the other at
  handler speed instead of being parked again.
- **Orphans.** Every ``SWEEP_S`` an entry older than ``key_order_max_blocked_s`` whose origin
  partition this worker owns, below that partition's stored offset, is removed (a tombstone,
  counted as ``orphan_removed``). A copy whose entry was removed that way runs when it comes
  back (its entry is older than the cap) instead of being dropped as a duplicate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from retryd.config import Settings
from retryd.policy import key_order as ko
from retryd.policy.chain_view import ChainView
from retryd.policy.headers import header_value
from retryd.policy.key_order import Verdict
from retryd.policy.routing import Route
from retryd.policy.sequence import RetryPlan
from retryd.worker.lifecycle import DECIDING, WAITING
from retryd.worker.partition import PartitionState
from retryd.worker.reading import readable_headers
from retryd.worker.scheduler import Scheduler
from retryd.worker.strict_routes import park_route
from retryd.worker.work import Work

log = logging.getLogger(__name__)

VIEW_BATCH = 1000
VIEW_MAX_BATCHES = 20  # per iteration: the view never starves the loop
WATERMARK_TIMEOUT_S = 10.0
WATERMARK_RETRY_S = 1.0
SWEEP_S = 60.0
SWEEP_MAX = 1000  # orphan tombstones per sweep
ASIDE_MAIN_MAX_MS = 60_000  # a main-topic record waits here at most this long, then parks
PARTITION_CACHE = 100_000  # chains whose state partition is remembered
DECIDE_MAX = 20_000  # lane heads decided per poll iteration at most
RECHECK_S = 1.0  # records set aside are decided again at least this often (the cap, a missed
# change)


class Step(NamedTuple):
    """One write of a strict record: its routed copy (``copy``: the record's own key and
    value, partitioned like its source), or a key-state record."""

    route: Route
    key: bytes | None
    value: bytes | None
    partition: int
    copy: bool


class SideWrite(NamedTuple):
    """A state write that settles no record (an orphan's tombstone): the router's context."""

    key: bytes


class StrictOrder:
    def __init__(
        self,
        settings: Settings,
        plan: RetryPlan,
        reader: Any,
        state_partitions: int,
        scheduler: Scheduler,
    ) -> None:
        self.group = settings.group_id
        self.topics = settings.strict_topics
        self.state_topic = settings.key_state_topic
        self.partitions = state_partitions
        cap = settings.key_order_max_blocked_s
        self.cap_ms: int | None = int(cap * 1000) if cap > 0 else None
        self.on_dead_letter = settings.key_order_on_dead_letter
        self.view = ChainView(settings.key_order_max_entries, group=self.group)
        self.reader = reader
        self.scheduler = scheduler
        first = plan.next_destination(0)
        self.park_topic = first.topic if not first.is_dead else plan.failed_topic
        self.park_delay_ms = first.delay_ms or 0
        self.failed_topic = plan.failed_topic
        # catch-up after assignment: main partition -> state partition ends (None: unknown)
        self.targets: dict[PartitionState, dict[int, int] | None] = {}
        self.mains: dict[tuple[str, int], PartitionState] = {}  # strict main partitions owned
        self.waiting: list[Work] = []  # lane heads that cannot be decided yet
        self.side_inflight = 0  # orphan tombstones not acknowledged yet
        self._state_route = Route(self.state_topic, [], 0, 0, None, None)
        self._watermarks_at = 0.0
        self._partitions: dict[bytes, int] = {}  # chain -> state partition (murmur2 once)
        self._swept_at = time.monotonic()
        self.pending_side: list[Step] = []  # orphan tombstones the last sweep decided
        # records blocked by their chain, set aside until it changes (chain -> records)
        self.aside: dict[bytes, list[Work]] = {}
        self.aside_count: dict[PartitionState, int] = {}
        self.aside_bytes = 0
        self.waited = 0  # records set aside (the ``waited`` event), since the last look
        self.aside_max = max(1, settings.partition_buffer // 4)
        self.aside_max_main = max(1, settings.partition_buffer * 3 // 4)
        self.aside_max_bytes = max(1, settings.buffer_bytes // 4)
        self._rechecked_at = time.monotonic()
        # main-topic records set aside: when each was first (id -> epoch ms); they are parked
        # once blocked longer than the first tier's delay, checked at least that often
        # id -> (chain, when its current block began or -1 once its chain moved, first aside)
        self.aside_since: dict[int, tuple[bytes, int, int]] = {}
        self._swept_aside_at = time.monotonic()
        # every record set aside is decided again this often (a copy past the cap runs)
        self.full_recheck_s = max(RECHECK_S, min(60.0, (self.cap_ms or 600_000) / 1000 / 10))
        # long enough for a head to succeed on its first retry, short enough that a long
        # block does not hold a main partition's committed offset back for long (a crash
        # redoes every success above a waiting record): one retry per block, two in all
        self.aside_main_ms = min(self.park_delay_ms + 500, ASIDE_MAIN_MAX_MS)
        self.aside_main_total_ms = min(2 * self.park_delay_ms + 1000, ASIDE_MAIN_MAX_MS)
        self.recheck_s = min(RECHECK_S, max(self.park_delay_ms / 1000, 0.05))
        reader.assign(
            [TopicPartition(self.state_topic, p, -2) for p in range(state_partitions)]
        )  # -2: OFFSET_BEGINNING

    # ------------------------------------------------------------------ the view
    def poll_view(self) -> int:
        """Apply what the state topic holds beyond the view; returns records applied."""
        reader, view = self.reader, self.view
        positions = view.positions
        applied = 0
        for _ in range(VIEW_MAX_BATCHES):
            batch = reader.consume(VIEW_BATCH, 0)
            if not batch:
                break
            for raw in batch:
                err = raw.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        p, end = raw.partition(), raw.offset()
                        if end > positions.get(p, 0):
                            positions[p] = end
                    else:
                        log.warning("key-state reader: %s", err)
                    continue
                offset = raw.offset()
                view.apply(raw.key(), raw.value(), offset)
                positions[raw.partition()] = offset + 1
                applied += 1
        return applied

    def tick(self, now_ms: int) -> None:
        """Once per iteration: read the view; now and then, remove orphaned entries."""
        self.poll_view()
        if self.cap_ms is not None and time.monotonic() - self._swept_at >= SWEEP_S:
            self._swept_at = time.monotonic()
            self._sweep(now_ms)

    # ------------------------------------------------------------------ assignments
    def assigned(self, states: Iterable[PartitionState]) -> None:
        """Mark new assignments; a strict main partition waits for the view to read every
        state partition to its current end."""
        mains = []
        for st in states:
            if st.is_tier:
                st.strict = True
            elif st.topic in self.topics:
                st.strict = True
                mains.append(st)
                self.mains[(st.topic, st.partition)] = st
        if mains:
            ends = self._ends()
            for st in mains:
                self.targets[st] = ends

    def _ends(self) -> dict[int, int] | None:
        """Every state partition's high watermark; None when one cannot be read now."""
        self._watermarks_at = time.monotonic()
        ends: dict[int, int] = {}
        for p in range(self.partitions):
            try:
                _low, high = self.reader.get_watermark_offsets(
                    TopicPartition(self.state_topic, p), timeout=WATERMARK_TIMEOUT_S, cached=False
                )
            except KafkaException as exc:
                log.warning(
                    "key-state topic %s[%d]: no watermark (%s); its keys wait, asked again in %gs",
                    self.state_topic,
                    p,
                    exc,
                    WATERMARK_RETRY_S,
                )
                return None
            ends[p] = high
        return ends

    def _caught_up(self, st: PartitionState, chain: bytes) -> bool:
        if st not in self.targets:
            return True
        target = self.targets[st]
        if target is None:
            if time.monotonic() - self._watermarks_at < WATERMARK_RETRY_S:
                return False
            target = self._ends()
            if target is None:
                return False
            for other, known in self.targets.items():
                if known is None:
                    self.targets[other] = target
        view = self.view
        if view.positions.get(self.partition_of(chain), 0) < target.get(
            self.partition_of(chain), 0
        ):
            return False
        if view.caught_up(target):
            del self.targets[st]
        return True

    def forget(self, st: PartitionState) -> None:
        self.targets.pop(st, None)
        if self.mains.get((st.topic, st.partition)) is st:
            del self.mains[(st.topic, st.partition)]
        self.aside_count.pop(st, None)
        for chain in [c for c, ws in self.aside.items() if any(w.part is st for w in ws)]:
            for w in self.aside[chain]:
                if w.part is st:
                    self.aside_since.pop(id(w), None)
            kept = [w for w in self.aside[chain] if w.part is not st]
            self.aside_bytes -= sum(w.size for w in self.aside[chain] if w.part is st)
            if kept:
                self.aside[chain] = kept
            else:
                del self.aside[chain]
        if self.waiting:
            gone = [w for w in self.waiting if w.part is st]
            if gone:
                self.waiting = [w for w in self.waiting if w.part is not st]
                for w in gone:  # their key's lane may go on with records of other partitions
                    self.scheduler.release(w)

    def chain_of(self, topic: str, key: bytes) -> bytes:
        return ko.chain_id(self.group, topic, key)

    def partition_of(self, chain: bytes) -> int:
        cache = self._partitions
        p = cache.get(chain)
        if p is None:
            if len(cache) >= PARTITION_CACHE:
                cache.clear()
            p = cache[chain] = ko.state_partition(chain, self.partitions)
        return p

    # ------------------------------------------------------------------ records in
    def mark(self, w: Work, key: bytes) -> bool:
        """A record of a strict partition becomes runnable: True (and ``DECIDING``: to be
        decided when it heads its lane) when it keeps its key's order, False for a tier copy
        that keeps none (not a strict topic's)."""
        env = w.env
        topic = w.msg.topic if env is None else env.original_topic
        if env is not None and topic not in self.topics:
            return False
        w.chain = self.chain_of(topic, key)
        w.hold = False
        w.clean = False
        w.stage = DECIDING
        if env is not None:  # read once: a copy may be decided many times
            headers, _ = readable_headers(w.msg)
            try:
                w.since = ko.parked_since(header_value(headers, ko.PARKED))
            except Exception:
                w.since = None
        else:
            w.since = None
        return True

    def heads(self, now_ms: int) -> list[tuple[Work, Verdict]]:
        """The lane heads decidable now, with their verdicts (the others wait). A record
        blocked by a lower entry that is not going to be written here (a tier copy behind
        its key's head, a record that cannot be parked while the view is full) is set aside
        instead of parked again: it leaves its key's lane (``WAITING``), and goes back into it
        when its chain changes in the view, or at the latest after ``RECHECK_S``."""
        self._resubmit(now_ms)
        decisions = self.scheduler.decisions
        pending = self.waiting
        self.waiting = []
        out: list[tuple[Work, Verdict]] = []
        # Records set aside release their lanes at once, so the heads behind them are decided
        # in this same call (a key's burst of blocked records must not cost a poll each
        # before the retry that unblocks them gets its turn); bounded per call.
        budget = DECIDE_MAX
        while True:
            while decisions and len(pending) < budget:
                pending.append(decisions.popleft())
            if not pending:
                break
            budget -= len(pending)
            self._decide_all(pending, now_ms, out)
            pending = []
            if budget <= 0 or not decisions:
                break
        return out

    def _decide_all(
        self, pending: list[Work], now_ms: int, out: list[tuple[Work, Verdict]]
    ) -> None:
        release = self.scheduler.release
        for w in pending:
            if w.stage is not DECIDING:
                release(w)  # discarded with its assignment: the key's next record goes on
                if self.aside:
                    self._leave_aside(w)
                continue
            st = w.part
            if not st.may_start(w.offset):
                if st.released:
                    release(w)
                else:
                    self.waiting.append(w)  # closing: it runs if the revoke is called off
                continue
            verdict = self._decide(w, now_ms)
            if verdict is None:
                self.waiting.append(w)
            elif verdict is Verdict.PARK and self._set_aside(w, now_ms):
                continue
            else:
                if self.aside:
                    self._leave_aside(w)
                if self.aside_since:
                    self.aside_since.pop(id(w), None)
                out.append((w, verdict))

    def _set_aside(self, w: Work, now_ms: int) -> bool:
        """Keep blocked ``w`` here instead of parking it (again): True when it may wait.

        - a tier copy waits until its chain moves: no copy produced again, no tier delay lost;
        - a main-topic record waits about as long as one retry of what blocks it takes (the
          first tier's delay and half a second per block, twice that in all): the commonest
          block is a head that succeeds on its retry, and then the records behind it run at
          once, without an entry and a copy each. Past that it is parked, so a long block
          never holds its partition's committed offset back for longer (while it waits, a
          crash redoes the records after it; parked, they are in the chain);
        - while the view is full nothing can be parked: it waits.

        Bounded per partition and in bytes well under the buffers that pause a partition, so
        records set aside never keep out the retry they wait for."""
        if w.env is None and not self.view.full:
            if self.on_dead_letter is ko.OnDeadLetter.DEAD_LETTER:
                # its head's dead letter must find it in the chain (to dead-letter it too)
                return False
            chain = w.chain
            assert chain is not None
            since = self.aside_since.get(id(w))
            if since is None:
                since = self.aside_since[id(w)] = (chain, now_ms, now_ms)
            elif since[1] < 0:  # its chain moved since: a new block starts now
                since = self.aside_since[id(w)] = (chain, now_ms, since[2])
            if (
                now_ms - since[1] > self.aside_main_ms
                or now_ms - since[2] > self.aside_main_total_ms
            ):
                self.aside_since.pop(id(w), None)
                return False  # blocked for longer than a retry takes: parked
        chain = w.chain
        assert chain is not None
        index = self.aside.get(chain)
        if index is None or not any(a is w for a in index):
            st = w.part
            count = self.aside_count.get(st, 0)
            # a tier partition keeps room for the retry its records wait for (it arrives in
            # the same partition); a main partition's retries are elsewhere: most of its buffer
            limit = self.aside_max if st.is_tier else self.aside_max_main
            if count >= limit or self.aside_bytes + w.size > self.aside_max_bytes:
                return False
            self.aside_count[st] = count + 1
            self.aside_bytes += w.size
            self.aside.setdefault(chain, []).append(w)
            self.waited += 1
        w.stage = WAITING
        self.scheduler.release(w)  # its key's lane goes on without it meanwhile
        return True

    def _leave_aside(self, w: Work) -> None:
        """``w`` was decided (or discarded): it no longer holds back its key's records here;
        the others set aside of its chain are decided again."""
        chain = w.chain
        if chain is None:
            return
        index = self.aside.get(chain)
        if not index:
            return
        for i, a in enumerate(index):
            if a is w:
                del index[i]
                st = w.part
                self.aside_count[st] = self.aside_count.get(st, 1) - 1
                self.aside_bytes -= w.size
                self.aside_since.pop(id(w), None)
                if index:
                    self.view.dirty.add(chain)
                else:
                    del self.aside[chain]
                return

    def _resubmit(self, now_ms: int) -> None:
        """Records set aside go back into their key's lane, in offset order, to be decided
        again: every record of a chain that changed in the view (a removal lets a blocked one
        run, an add one whose own entry the view had not read yet), main-topic records blocked
        past their wait (to be parked), and now and then every record (the cap may have
        released one)."""
        aside = self.aside
        dirty = self.view.dirty
        if not aside:
            dirty.clear()
            return
        now = time.monotonic()
        chains = {c for c in dirty if c in aside}
        dirty.clear()
        since = self.aside_since
        if chains and since:
            for w in (w for c in chains for w in aside[c] if w.env is None):
                block = since.get(id(w))
                if block is not None:
                    since[id(w)] = (block[0], -1, block[2])
        if now - self._rechecked_at >= self.recheck_s:
            self._rechecked_at = now
            if now - self._swept_aside_at >= self.full_recheck_s:
                self._swept_aside_at = now
                chains.update(aside)
            else:
                horizon = now_ms - self.aside_main_ms
                chains.update(c for c, block, _ in since.values() if 0 <= block < horizon)
        back: list[Work] = []
        for chain in chains:
            index = aside.get(chain)
            if not index:
                continue
            # they stay in the index until decided, so that a later record of their key
            # decided first (it may head the lane) still waits behind them
            for w in list(index):
                if w.stage is WAITING:
                    w.stage = DECIDING
                    w.next = None
                    back.append(w)
                elif w.stage is not DECIDING:
                    self._leave_aside(w)  # discarded with its assignment
        if back:
            back.sort(key=self.origin_offset)
            self.scheduler.submit(back)

    def _decide(self, w: Work, now_ms: int) -> Verdict | None:
        chain = w.chain
        assert chain is not None
        view = self.view
        entries = view.get(chain)
        env = w.env
        origin = w.offset if env is None else env.original_offset
        aside = self.aside.get(chain)
        if aside and any(a is not w and self.origin_offset(a) < origin for a in aside):
            return Verdict.PARK  # behind a record of its key waiting here (it has no entry)
        if env is None:  # a main-topic record
            if not self._caught_up(w.part, chain):
                return None
            if not (entries and w.offset in entries) and view.removed(chain, w.offset):
                # consumed again (its input was not committed) after its chain ended here or
                # elsewhere: it was handled or dead-lettered already; running it again would
                # put it in a second place, or a success after later records' successes
                return Verdict.DUPLICATE
            verdict = ko.decide(
                entries,
                w.offset,
                now_ms,
                is_copy=False,
                max_blocked_ms=self.cap_ms,
                has_dead=view.has_dead(chain),
            )
            if verdict is Verdict.PARK and view.full:
                return None  # parking adds an entry: wait until the view has room
            # its success removes its own entry (a record consumed again after a crash) or the
            # dead markers it runs behind
            w.hold = bool(entries) and (
                w.offset in entries  # type: ignore[operator]
                or any(e.kind == ko.KIND_DEAD for e in entries.values())  # type: ignore[union-attr]
            )
            w.clean = verdict is Verdict.RUN and not entries
            return verdict
        w.hold = True
        since = w.since
        return ko.decide(
            entries,
            env.original_offset,
            now_ms,
            is_copy=True,
            removed=view.removed(chain, env.original_offset),
            parked_since_ms=since,
            max_blocked_ms=self.cap_ms,
            entered_ms=since or env.first_failure_timestamp,
            has_dead=view.has_dead(chain),
        )

    # ------------------------------------------------------------------ routes and steps
    def park_route(self, w: Work, now_ms: int, dead_reason: str | None = None) -> Route:
        return park_route(
            w,
            now_ms,
            self.park_topic,
            self.park_delay_ms,
            self.failed_topic,
            self.group,
            dead_reason,
        )

    def _write(self, chain: bytes, offset: int, value: bytes | None) -> Step:
        return Step(
            self._state_route,
            ko.entry_key(chain, offset),
            value,
            self.partition_of(chain),
            False,
        )

    @staticmethod
    def origin_offset(w: Work) -> int:
        env = w.env
        return w.offset if env is None else env.original_offset

    def steps_for(self, w: Work, route: Route, now_ms: int) -> list[Step]:
        """The writes that settle ``w``, routed by ``route`` (its copy)."""
        chain = w.chain
        assert chain is not None
        copy = Step(route, None, None, -1, True)
        offset = self.origin_offset(w)
        if route.is_dead:
            return [copy, *self._release(chain, offset, dead=True)]
        if w.env is None:  # a main-topic record enters the chain: its entry first
            kind = ko.KIND_FAILED if w.result is not None else ko.KIND_PARKED
            add = self._write(chain, offset, ko.encode_entry(now_ms, kind, w.msg.partition))
            stale = ko.after_failure(self.view.get(chain), offset)
            return [add, *(self._write(chain, m, None) for m in stale), copy]
        return [copy]  # a tier copy moves on: its entry stays

    def success_steps(self, w: Work) -> list[Step]:
        chain = w.chain
        assert chain is not None
        return self._release(chain, self.origin_offset(w), dead=False)

    def _release(self, chain: bytes, offset: int, *, dead: bool) -> list[Step]:
        entries = self.view.get(chain)
        if dead:
            kind, markers = ko.after_dead_letter(entries, offset, self.on_dead_letter)
        else:
            kind, markers = None, ko.after_success(entries, offset)
        value = None
        if kind is not None:
            own = entries.get(offset) if entries else None
            value = ko.encode_entry(
                int(time.time() * 1000), kind, own.partition if own is not None else None
            )
        return [self._write(chain, offset, value), *(self._write(chain, m, None) for m in markers)]

    def acked(self, route: Route, key: bytes | None, value: bytes | None, offset: int) -> None:
        """A write was acknowledged at ``offset``: a state write goes into the view now."""
        if route.topic == self.state_topic:
            self.view.apply(key, value, offset)

    # ------------------------------------------------------------------ orphans
    def _sweep(self, now_ms: int) -> None:
        """Remove entries past the cap whose record this worker's partitions have settled."""
        assert self.cap_ms is not None
        if self.side_inflight:
            return  # the last sweep's tombstones are not all acknowledged yet
        writes = []
        for chain, entry in self.view.older_than(now_ms - self.cap_ms):
            if entry.partition is None:
                continue  # written before entries named their partition: not known here
            try:
                topic = ko.decode_entry_key(ko.entry_key(chain, 0)).topic
            except ValueError:
                continue
            st = self.mains.get((topic, entry.partition))
            if st is None or st.stored is None or entry.offset >= st.stored:
                continue  # not ours, or its record may still be in flight here
            writes.append(self._write(chain, entry.offset, None))
            if len(writes) >= SWEEP_MAX:
                break
        self.pending_side = writes

    def take_side_writes(self) -> list[Step]:
        """The orphan tombstones the last sweep decided (sent by the settler)."""
        writes = self.pending_side
        self.pending_side = []
        self.side_inflight += len(writes)
        return writes

    def side_acked(self, key: bytes, offset: int | None) -> bool:
        """An orphan tombstone was acknowledged (``offset``; True) or refused (None: the next
        sweep tries again)."""
        self.side_inflight = max(0, self.side_inflight - 1)
        if offset is None:
            return False
        self.view.apply(key, None, offset)
        return True

    # ------------------------------------------------------------------ observability
    @property
    def busy(self) -> bool:
        """Heads to decide: the poll thread should come back soon."""
        return bool(self.waiting) or bool(self.scheduler.decisions)

    def gauges(self, now_ms: int) -> tuple[int, int, float]:
        return self.view.stats(now_ms)

    def close(self) -> None:
        try:
            self.reader.close()
        except Exception as exc:  # closing is best effort
            log.debug("key-state reader close: %s", exc)


__all__ = ["SideWrite", "Step", "StrictOrder"]
