"""The engine's side of the outage circuit breaker (the policy is ``retryd.policy.circuit``).

``Circuit`` feeds the breaker what calls did and applies what it decides:

- **who may start**: the scheduler's gate is shut while the circuit is not closed (records
  stay ready, in order) and lets exactly the probe through when it is half-open;
- **what is fetched**: every main-topic partition is paused while it is open (the loop keeps
  polling, so the group membership is kept); tier partitions keep fetching, bounded by their
  buffers, so that records their tiers retry are there to be probed when they come due;
- **where a failed record goes**: while the circuit is not closed, a retryable failure is
  *held* (``Lifecycle.hold``: FAILED → QUEUED) instead of being routed. The record stays
  unsettled in its partition, so its offset is not committed, and it keeps its key's lane in
  the scheduler (``Scheduler.keep``): the records of its key behind it wait until it ran again
  (after the circuit closed, held records go back to the front of the line, in offset order).
  A failure whose call ended while the circuit was still closed already let its key move on:
  it is routed, never run again behind a later record of its key. A crash or a revoke
  meanwhile hands a held record to the next owner, and nothing is lost.

**The probe is owned here**, from choice to verdict:

- *chosen* among records that already failed, of a key whose probe has not failed yet in this
  outage: a tier record due here (a real retry), else the oldest held record; when every such
  key failed a probe, a record that never ran is taken from the ready queue instead, then the
  key with the fewest failed probes. So a few poison keys cannot keep the circuit open after
  the service recovered, and a handler that fails every first attempt is probed with a retry;
- *offered* to the scheduler's shut gate as the one record that may start;
- *judged*: an answer closes the circuit, a retryable failure opens it again, and no verdict
  by its deadline (``probe_timeout_s``: the longest call plus the async cancel grace) counts
  as a failure. A probe cut off with an abandoned event loop is offered again.

The settler asks ``hold`` for every failed call before routing it; the poll thread calls
``tick`` once per iteration and ``apply_orders`` once per heartbeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterable

from retryd.policy.circuit import Breaker, CircuitAction, CircuitSnapshot, CircuitState
from retryd.policy.classify import Outcome
from retryd.policy.headers import DEAD_EXHAUSTED
from retryd.runtime.circuit_control import CommandReader
from retryd.worker.book import PartitionBook
from retryd.worker.events import Sink
from retryd.worker.lifecycle import DISCARDED, QUEUED, RUNNING, Lifecycle
from retryd.worker.partition import PAUSE_CIRCUIT, PartitionState
from retryd.worker.runs import probe_of
from retryd.worker.scheduler import Scheduler
from retryd.worker.work import Work

log = logging.getLogger(__name__)

_RETRY = Outcome.RETRY
_SUCCESS = Outcome.SUCCESS
_DROP = Outcome.DROP
CLOSED = CircuitState.CLOSED
OPEN = CircuitState.OPEN
HALF_OPEN = CircuitState.HALF_OPEN
PROBE_KEYS_MAX = 10_000  # keys whose probe failed, remembered per outage


def failure_key(w: Work) -> Hashable:
    """What tells keys apart in the breaker's window: the record's key, or (no key) the
    record's own position, so keyless records count as distinct keys."""
    key = w.msg.key
    return key if key is not None else (w.msg.topic, w.msg.partition, w.offset)


def _position(w: Work) -> tuple[str, int, int]:
    return (w.msg.topic, w.msg.partition, w.offset)


class Circuit:
    def __init__(
        self,
        breaker: Breaker,
        scheduler: Scheduler,
        book: PartitionBook,
        lifecycle: Lifecycle,
        events: Sink,
        orders: CommandReader | None,
        *,
        count_tiers: bool = False,
        probe_timeout_s: float = 60.0,
    ) -> None:
        self.breaker = breaker
        # Which failures count in the window: a main-topic record's (its first attempt). A
        # tier record failed before, so its failing again says little about the service (a
        # handler failing the first n attempts of some records fails most tier calls while
        # healthy); a worker consuming only tiers (role tiers) has nothing else to count.
        self.count_tiers = count_tiers
        self.scheduler = scheduler
        self.book = book
        self.lifecycle = lifecycle
        self.events = events
        self.orders = orders
        self.probe_timeout_s = probe_timeout_s
        self._held: list[Work] = []  # failed records kept in place (heads of their lanes)
        self._probe: Work | None = None  # offered to the gate, or running
        self._probe_deadline = 0.0  # monotonic
        self._failed_probe_keys: dict[Hashable, int] = {}
        self._gate: CircuitState = CLOSED  # the state the gate and the pauses were set for
        self._published = -1

    @property
    def closed(self) -> bool:
        return self.breaker.state is CLOSED

    @property
    def held(self) -> int:
        return len(self._held)

    # ------------------------------------------------------------------ evidence
    def answered(self, n: int, now_ms: int, retried_ok: int = 0) -> None:
        """``n`` calls got an answer (settled on their slot) since the last look, of which
        ``retried_ok`` were calls of records that failed before (retry evidence)."""
        b = self.breaker
        if retried_ok > 0:
            b.retried(now_ms, retried_ok, 0)
        if n <= 0:
            return
        if b.state is CLOSED:
            b.observe(now_ms, n, [])
        elif b.state is HALF_OPEN:  # (while open, late answers of earlier calls change nothing)
            self._answered_while_probing(now_ms)
            self._sync()

    def hold(self, w: Work, now_ms: int, dead_reason: str | None) -> bool:
        """``w``'s call failed (``w`` is FAILED) and its route was planned (``dead_reason``:
        None for a tier): count it, and True when it is held in place instead of routed (the
        circuit is, or just became, not closed). A failure that a rule sends to a dead-letter
        topic (an error route's ``dlt:``/``dead``, malformed headers) is neither."""
        result = w.result
        assert result is not None
        b = self.breaker
        if result.outcome is not _RETRY:  # the service answered: not an outage
            self.answered(1, now_ms)
            return False
        if dead_reason is not None and dead_reason != DEAD_EXHAUSTED:
            return False  # dead-lettered by a rule, not moved on by the outage
        if not b.policy.enabled:
            return False
        if w.env is not None:  # a retry failed (a held record run again in place is no
            b.retried(now_ms, 0, 1)  # retry: a handler may fail every first attempt)
        error = f"{result.error_class} at {w.where}"
        probe = w is self._probe
        if probe:
            self._probe = None
        if b.state is CLOSED:
            # the window counts first calls of main-topic records (a held record run again
            # failing says nothing new), or tier records on a worker that has only those
            if (w.env is None and w.attempt <= 1) or (w.env is not None and self.count_tiers):
                b.observe(now_ms, 0, [(failure_key(w), error)])
        elif probe and b.state is HALF_OPEN:
            self._probe_failed(w)
            b.probe_failed(now_ms, error)
            log.warning(
                "circuit stays open: the probe %s failed (%s); next probe in %.1fs",
                w.where,
                result.error_class,
                b.interval_s,
            )
        else:
            b.last_error = error
        self._sync()  # shut the gate at once: no more calls start into the outage
        if b.state is CLOSED or not self.scheduler.keep(w, self.lifecycle.hold):
            return False  # closed, discarded, or its key already moved on: routed
        self._held.append(w)
        b.count_held()
        return True

    def _probe_failed(self, w: Work) -> None:
        keys = self._failed_probe_keys
        key = failure_key(w)
        if key in keys or len(keys) < PROBE_KEYS_MAX:
            keys[key] = keys.get(key, 0) + 1

    # ------------------------------------------------------------------ every iteration
    def tick(self, now_ms: int) -> None:
        """Once per poll iteration, after settling: probes, the gate and the pauses for the
        current state, and the snapshot to the sinks."""
        b = self.breaker
        if b.state is OPEN and b.probe_due(now_ms):
            log.info("circuit half-open: letting one call through")
        if b.state is HALF_OPEN:
            self._tend_probe(now_ms)
        self._sync()
        if b.state is OPEN:
            self._pause(True)  # partitions assigned since it opened
        if b.changes != self._published:
            self._published = b.changes
            self.events.circuit(b.snapshot())

    def _tend_probe(self, now_ms: int) -> None:
        """Half-open: judge the probe in flight, or offer one."""
        b = self.breaker
        p = self._probe
        if p is not None:
            stage = p.stage
            result = p.result
            if stage is DISCARDED:
                self._probe = None  # its assignment was given up: probe with another record
            elif (
                stage is not QUEUED
                and stage is not RUNNING
                and result is not None
                and (result.outcome is _SUCCESS or result.outcome is _DROP)
            ):
                # answered (settled on its slot, or through strict order's writes)
                self._probe = None
                self._answered_while_probing(now_ms)
                return
            elif (
                stage is QUEUED
                and self.scheduler.probe is not p
                and self.scheduler.steal(lambda w: w is p) is not None
            ):
                self._offer(p)  # cut off with an abandoned loop and back in line: again
                return
            if p is self._probe and time.monotonic() > self._probe_deadline:
                self._probe = None
                if self.scheduler.withdraw_probe() is p:
                    self._held.append(p)  # never taken: it stays in place with the others
                self._probe_failed(p)
                b.probe_lost(now_ms, p.where, self.probe_timeout_s)
                log.warning(
                    "circuit stays open: the probe %s got no answer within %gs; next probe "
                    "in %.1fs",
                    p.where,
                    self.probe_timeout_s,
                    b.interval_s,
                )
                return
            if self._probe is not None:
                return  # running, or failed and about to be judged by ``hold``
        w = self._choose_probe()
        if w is not None:
            self._offer(w)

    def _offer(self, w: Work) -> None:
        self._probe = w
        self._probe_deadline = time.monotonic() + self.probe_timeout_s
        self.scheduler.offer_probe(w)

    def _choose_probe(self) -> Work | None:
        """The next probe, all of keys not yet probed in this outage where there are: a tier
        record due here (a retry of a record that failed before: the evidence whether retries
        succeed, which running a failed record again in place may not give, e.g. for a handler
        that fails every first attempt), else the oldest held record, else a record that never
        ran; else the held record whose key failed the fewest probes."""
        held = [w for w in self._held if w.stage is QUEUED]
        failed = self._failed_probe_keys
        retry = self.scheduler.steal(
            lambda w: (
                w.stage is QUEUED
                and not w.many  # a probe is one call (a run is many: retryd.worker.runs)
                and w.attempt == 0
                and w.env is not None
                and failure_key(w) not in failed
            )
        )
        if retry is not None:
            self._held = held
            return retry
        if not self.breaker.confirming and self._tier_due_soon():
            self._held = held
            return None  # a real retry comes due in a moment: wait for it
        fresh = [w for w in held if failure_key(w) not in failed]
        pick: Work | None = min(fresh, key=_position) if fresh else None
        if pick is None:
            stolen = self.scheduler.steal(
                lambda w: (
                    w.stage is QUEUED
                    and not w.many
                    and w.attempt == 0
                    and failure_key(w) not in failed
                )
            )
            if stolen is not None:
                self._held = held
                return stolen
            if held:
                pick = min(held, key=lambda w: (failed.get(failure_key(w), 0), _position(w)))
        if pick is not None:
            held.remove(pick)
        self._held = held
        if pick is None:  # only runs wait (retryd.worker.runs): the next record of one
            run = self.scheduler.steal(lambda w: w.many and w.stage is QUEUED)
            if run is not None:
                pick = probe_of(run, self.scheduler, self.lifecycle)  # type: ignore[arg-type]
        return pick

    def _tier_due_soon(self) -> bool:
        """A tier record waiting here comes due within the first tier delay, or came due a
        moment ago and is about to be released: better evidence than a held record."""
        horizon_s = self.breaker.policy.confirm_probe_s
        if not horizon_s:
            return False
        now_ms = int(time.time() * 1000)
        soon = min(
            (st.tail_due for st in self.book.parts.values() if st.is_tier and st.tail),
            default=None,
        )
        return soon is not None and now_ms - 1000 < soon <= now_ms + horizon_s * 1000

    def _sync(self) -> None:
        """Make the gate and the pauses follow the breaker's state."""
        state = self.breaker.state
        if state is not self._gate:
            self._apply(state)

    def _apply(self, state: CircuitState) -> None:
        before, self._gate = self._gate, state
        b = self.breaker
        if state is CLOSED:
            self._reopen_lanes()
            log.warning("circuit closed (%s): calls resume", b.reason)
        else:
            self.scheduler.set_gate(False)
            if state is OPEN and before is CLOSED:  # (back from a failed probe: logged there)
                log.warning(
                    "circuit open (%s; last error: %s): no calls start, partitions paused, "
                    "failed records held in place; first probe in %.1fs",
                    b.reason,
                    b.last_error,
                    b.interval_s,
                )
            elif state is HALF_OPEN and before is CLOSED:
                log.warning("circuit half-open (%s; last error: %s)", b.reason, b.last_error)
            if before is CLOSED:
                self._failed_probe_keys.clear()
        # fetch no main-topic record while open; half-open fetches again so a probe has a
        # record to run. Tiers keep fetching (their records wait behind the shut gate): a
        # probe then finds a due tier record, a real retry, rather than a held record that
        # runs again in place (which a handler failing every first attempt always fails)
        self._pause(state is OPEN)

    def _pause(self, on: bool) -> None:
        book = self.book
        for st in list(book.parts.values()):
            book.set_pause(st, PAUSE_CIRCUIT, on and not st.is_tier)

    def _answered_while_probing(self, now_ms: int) -> None:
        """A call was answered while half-open: the service is back, so the circuit closes,
        and the keys whose probes failed meanwhile are poison suspects, not an outage."""
        if self._failed_probe_keys:
            self.breaker.suspect(self._failed_probe_keys, now_ms)
            self._failed_probe_keys.clear()
        self.breaker.probe_answered(now_ms)

    def _reopen_lanes(self) -> None:
        """The circuit closed: the probe (if not taken) and the held records go back to the
        front of the line, in offset order, and every ready record may start again."""
        probe = self.scheduler.withdraw_probe()
        self._probe = None
        held = self._held
        self._held = []
        if probe is not None:
            held.append(probe)
        held.sort(key=_position)
        self.scheduler.requeue(held)
        self.scheduler.set_gate(True)

    def forget(self, states: Iterable[PartitionState]) -> None:
        """Assignments released: their held records were discarded; their lanes go (the
        records chained behind them drain like every discarded record)."""
        gone = set(states)
        keep = []
        for w in self._held:
            if w.part in gone:
                self.scheduler.release(w)
            else:
                keep.append(w)
        self._held = keep
        p = self._probe
        if p is not None and p.part in gone:
            if self.scheduler.withdraw_probe() is p:
                self.scheduler.release(p)
            self._probe = None

    # ------------------------------------------------------------------ operators
    def apply_orders(self, now_ms: int) -> None:
        """An operator's order from the sidecar, if a new one was written."""
        if self.orders is None:
            return
        cmd = self.orders.poll()
        if cmd is None:
            return
        log.warning("circuit order #%d from %s: %s", cmd.seq, cmd.by, cmd.action.value)
        b = self.breaker
        if cmd.action is CircuitAction.PROBE and b.state is HALF_OPEN:
            # probe now: a probe not running yet (or none) is chosen again and offered now
            p = self._probe
            if p is None or p.stage is not RUNNING:
                if p is not None and self.scheduler.withdraw_probe() is p:
                    self._held.append(p)
                self._probe = None
        else:
            b.force(cmd.action, now_ms, cmd.by)
        self.tick(now_ms)

    def snapshot(self) -> CircuitSnapshot:
        return self.breaker.snapshot()


__all__ = ["Circuit", "failure_key"]
