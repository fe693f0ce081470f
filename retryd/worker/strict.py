"""``key_order = strict`` in the engine; the policy and its reasons are in
``retryd.policy.key_order``. Everything here runs on the poll thread.

The parts:

- **The view.** A second consumer, in no group, is assigned every partition of the key-state
  topic from its beginning and keeps ``ChainView`` current (``poll_view``, every iteration).
- **Gates (main partitions).** With ``ordering=key`` the scheduler lets a key's next record
  start when the previous *call* ends, before a failed one is routed and its chain entry
  written. Under strict order the records of a key on a main partition pass a gate instead:
  one at a time, the next one decided only once the previous one is *settled* (its success,
  or its chain entry and routed copy acknowledged) and the view has read the state partition
  up to this worker's own last write there. A record held at the gate is ``WAITING`` (a
  revoke neither runs nor waits for it; its next owner redoes it).
- **Catch-up.** After an assignment of a main partition nothing of it is decided before the
  view has read every state partition up to the high watermarks read at assignment time: the
  previous owner's entries are all seen.
- **Steps.** A strict record settles through a short list of writes made in order, each
  acknowledged (acks=all) before the next is sent (``Settler``): a failure on a main topic
  adds the entry, then routes the copy; a park adds the entry (kind ``parked``), then routes
  the copy; a dead letter routes the copy, then removes the entry (a crash between the two
  redoes the record, never loses it); a success of a record whose entry exists removes it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from retryd.config import Settings
from retryd.policy import key_order as ko
from retryd.policy.headers import (
    DEAD_REASON,
    ERROR_CLASS,
    ERROR_MESSAGE,
    FIRST_FAILURE_TIMESTAMP,
    GROUP,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP,
    ORIGINAL_TOPIC,
    RETRY_NUMBER,
    RETRY_TIMESTAMP,
    ROUTE,
    header_value,
    truncate_utf8,
    user_headers,
)
from retryd.policy.key_order import ChainView, Verdict
from retryd.policy.routing import Route
from retryd.policy.sequence import RetryPlan
from retryd.worker.lifecycle import ACKED, DISCARDED, SKIPPED, SUCCEEDED
from retryd.worker.partition import PartitionState
from retryd.worker.reading import readable_headers
from retryd.worker.work import Work

log = logging.getLogger(__name__)

VIEW_BATCH = 1000
VIEW_MAX_BATCHES = 20  # per iteration: the view never starves the loop
WATERMARK_TIMEOUT_S = 10.0

GateKey = tuple[PartitionState, bytes]


class Step(NamedTuple):
    """One write of a strict record: its routed copy (``copy``: the record's own key and
    value, partitioned like its source), or a key-state record."""

    route: Route
    key: bytes | None
    value: bytes | None
    partition: int
    copy: bool


class StrictOrder:
    def __init__(
        self, settings: Settings, plan: RetryPlan, reader: Any, state_partitions: int
    ) -> None:
        self.group = settings.group_id
        self.topics = settings.strict_topics
        self.state_topic = settings.key_state_topic
        self.partitions = state_partitions
        cap = settings.key_order_max_blocked_s
        self.cap_ms: int | None = int(cap * 1000) if cap > 0 else None
        self.on_dead_letter = settings.key_order_on_dead_letter
        self.view = ChainView(settings.key_order_max_entries)
        self.reader = reader
        first = plan.next_destination(0)
        self.park_topic = first.topic if not first.is_dead else plan.failed_topic
        self.park_delay_ms = first.delay_ms or 0
        self.failed_topic = plan.failed_topic
        self.gates: dict[GateKey, deque[Work]] = {}
        self.outstanding: dict[GateKey, Work] = {}  # each gate's record being handled
        self.open: set[GateKey] = set()  # gates whose next record may be decided
        self.targets: dict[PartitionState, dict[int, int]] = {}  # catch-up after assignment
        self.written: dict[int, int] = {}  # state partition -> one past our last write
        self.counts: dict[str, int] = {"parked": 0, "released": 0, "duplicate": 0, "dead": 0}
        self._state_route = Route(self.state_topic, [], 0, 0, None, None)
        self._group_header = (GROUP, self.group.encode())
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
                view.apply(raw.key(), raw.value())
                positions[raw.partition()] = raw.offset() + 1
                applied += 1
        return applied

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
        if not mains:
            return
        ends: dict[int, int] = {}
        for p in range(self.partitions):
            try:
                _low, high = self.reader.get_watermark_offsets(
                    TopicPartition(self.state_topic, p), timeout=WATERMARK_TIMEOUT_S, cached=False
                )
            except KafkaException as exc:  # decided later, after the next assignment's read
                log.warning("key-state topic %s[%d]: no watermark (%s)", self.state_topic, p, exc)
                high = 2**62
            ends[p] = high
        for st in mains:
            self.targets[st] = ends

    def forget(self, st: PartitionState) -> None:
        self.targets.pop(st, None)
        for gk in [gk for gk in self.gates if gk[0] is st]:
            del self.gates[gk]
            self.outstanding.pop(gk, None)
            self.open.discard(gk)

    def chain_of(self, topic: str, key: bytes) -> bytes:
        return ko.chain_id(self.group, topic, key)

    def partition_of(self, chain: bytes) -> int:
        return ko.state_partition(chain, self.partitions)

    # ------------------------------------------------------------------ main-partition gates
    def admit(self, w: Work, st: PartitionState, key: bytes) -> None:
        """A main-topic record of a strict key: it waits at its key's gate."""
        gk = (st, key)
        gate = self.gates.get(gk)
        if gate is None:
            gate = self.gates[gk] = deque()
            self.open.add(gk)
        gate.append(w)
        w.chain = self.chain_of(st.topic, key)

    def ready(self, st: PartitionState, chain: bytes) -> bool:
        """May a record of ``chain`` on ``st`` be decided now (the view has caught up)?"""
        if self.view.full:
            return False
        p = self.partition_of(chain)
        position = self.view.positions.get(p, 0)
        target = self.targets.get(st)
        if target is not None:
            if position < target.get(p, 0):
                return False
            if self.view.caught_up(target):
                del self.targets[st]
        return position >= self.written.get(p, 0)

    def heads(self) -> list[tuple[GateKey, Work]]:
        """Gates whose previous record settled: their next record, to be decided. A gate
        whose record was discarded (its assignment released) is dropped."""
        out = []
        for gk, w in list(self.outstanding.items()):
            stage = w.stage
            if stage is SUCCEEDED or stage is ACKED or stage is SKIPPED:
                del self.outstanding[gk]
                self.open.add(gk)
            elif stage is DISCARDED:
                self.forget(gk[0])
        for gk in list(self.open):
            gate = self.gates.get(gk)
            if not gate:
                self.open.discard(gk)
                self.gates.pop(gk, None)
                continue
            out.append((gk, gate[0]))
        return out

    def taken(self, gk: GateKey, w: Work) -> None:
        """``w`` (its gate's head) was decided: it is the gate's record until it settles."""
        gate = self.gates[gk]
        gate.popleft()
        self.open.discard(gk)
        self.outstanding[gk] = w

    def decide_main(self, w: Work, now_ms: int) -> Verdict:
        chain = w.chain
        assert chain is not None
        entries = self.view.get(chain)
        verdict = ko.decide(entries, w.offset, now_ms, is_copy=False, max_blocked_ms=self.cap_ms)
        # a record consumed again whose entry exists (a crash before its input was
        # committed), or one behind dead markers only: its success removes them
        w.hold = bool(entries) and (
            w.offset in entries  # type: ignore[operator]
            or any(e.kind == ko.KIND_DEAD for e in entries.values())  # type: ignore[union-attr]
        )
        return verdict

    # ------------------------------------------------------------------ tier copies
    def decide_copy(self, w: Work, key: bytes | None, now_ms: int) -> Verdict | None:
        """The verdict for a due tier copy; None when it keeps no order (not a strict
        topic's, or no key)."""
        env = w.env
        if env is None or key is None or env.original_topic not in self.topics:
            w.chain = None
            return None
        chain = w.chain = self.chain_of(env.original_topic, key)
        w.hold = True
        headers, _ = readable_headers(w.msg)
        try:
            since = ko.parked_since(header_value(headers, ko.PARKED))
        except Exception:
            since = None
        return ko.decide(
            self.view.get(chain),
            env.original_offset,
            now_ms,
            is_copy=True,
            removed=self.view.removed(chain, env.original_offset),
            parked_since_ms=since,
            max_blocked_ms=self.cap_ms,
        )

    # ------------------------------------------------------------------ routes and steps
    def park_route(self, w: Work, now_ms: int, dead_reason: str | None = None) -> Route:
        """The copy of a record parked (again) behind its key's chain, or dead-lettered behind
        a dead-lettered head: retry number unchanged, ``retryd_parked`` = first park time."""
        source, _ = readable_headers(w.msg)
        env = w.env
        if env is None:  # a main-topic record: its own origin
            msg = w.msg
            raw = w.raw
            timestamp = raw.timestamp()[1] if raw is not None else msg.timestamp
            origin = (msg.topic, msg.partition, w.offset, timestamp if timestamp > 0 else 0)
            number, first_failure, route_name = 0, None, None
            error_class: str | None = None
            error_message: str | None = None
            since = now_ms
        else:
            origin = (
                env.original_topic,
                env.original_partition,
                env.original_offset,
                env.original_timestamp,
            )
            number = env.retry_number
            first_failure = env.first_failure_timestamp
            error_class, error_message = env.error_class, env.error_message
            route_name = env.route
            try:
                since = ko.parked_since(header_value(source, ko.PARKED)) or now_ms
            except Exception:
                since = now_ms
        headers = user_headers(source) if source else []
        append = headers.append
        append((RETRY_NUMBER, b"%d" % number))
        if dead_reason is None:
            topic, due = self.park_topic, now_ms + self.park_delay_ms
            append((RETRY_TIMESTAMP, b"%d" % due))
        else:
            topic, due = self.failed_topic, None
        append((ORIGINAL_TOPIC, origin[0].encode("utf-8", errors="replace")))
        append((ORIGINAL_PARTITION, b"%d" % origin[1]))
        append((ORIGINAL_OFFSET, b"%d" % origin[2]))
        append((ORIGINAL_TIMESTAMP, b"%d" % origin[3]))
        if first_failure is not None or dead_reason is not None:
            append((FIRST_FAILURE_TIMESTAMP, b"%d" % (first_failure or now_ms)))
        if error_class is not None:
            append((ERROR_CLASS, truncate_utf8(error_class, 256)))
        if error_message is not None:
            append((ERROR_MESSAGE, truncate_utf8(error_message)))
        if dead_reason is not None:
            append((DEAD_REASON, dead_reason.encode("ascii")))
        append(self._group_header)
        if route_name:
            append((ROUTE, route_name.encode("ascii", errors="replace")))
        if dead_reason is None:
            append((ko.PARKED, b"%d" % since))
        return Route(topic, headers, now_ms, number, due, dead_reason)

    def _write(self, chain: bytes, offset: int, value: bytes | None) -> Step:
        return Step(
            self._state_route,
            ko.entry_key(chain, offset),
            value,
            self.partition_of(chain),
            False,
        )

    def origin_offset(self, w: Work) -> int:
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
            return [self._write(chain, offset, ko.encode_entry(now_ms, kind)), copy]
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
        value = ko.encode_entry(int(time.time() * 1000), kind) if kind is not None else None
        return [self._write(chain, offset, value), *(self._write(chain, m, None) for m in markers)]

    def acked(self, route: Route, partition: int, offset: int) -> None:
        if route.topic == self.state_topic and offset + 1 > self.written.get(partition, 0):
            self.written[partition] = offset + 1

    # ------------------------------------------------------------------ observability
    @property
    def busy(self) -> bool:
        """Gates to decide: the poll thread should come back soon."""
        return bool(self.open) or bool(self.outstanding)

    def gauges(self, now_ms: int) -> tuple[int, int, float]:
        return self.view.stats(now_ms)

    def close(self) -> None:
        try:
            self.reader.close()
        except Exception as exc:  # closing is best effort
            log.debug("key-state reader close: %s", exc)
