"""The engine's side of the outage circuit breaker (the policy is ``retryd.policy.circuit``).

``Circuit`` feeds the breaker what calls did and applies what it decides:

- **who may start**: the scheduler's gate is shut while the circuit is open (records stay
  ready, in order) and lets exactly one record through when it goes half-open (the probe);
- **what is fetched**: every partition (main topics and tiers) is paused while it is open;
  the loop keeps polling, so the group membership is kept;
- **where a failed record goes**: while the circuit is not closed, a retryable failure is
  *held* (``Lifecycle.hold``: FAILED → QUEUED, back at the front of the scheduler) instead of
  being routed. The record stays unsettled in its partition, so its offset is not committed:
  a crash or a revoke meanwhile hands it to the next owner, and nothing is lost.

The settler asks ``hold`` for every failed call before routing it; the poll thread calls
``tick`` once per iteration and ``apply_orders`` once per heartbeat.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

from retryd.policy.circuit import Breaker, CircuitSnapshot, CircuitState
from retryd.policy.classify import Outcome
from retryd.policy.headers import DEAD_EXHAUSTED
from retryd.runtime.circuit_control import CommandReader
from retryd.worker.book import PartitionBook
from retryd.worker.events import Sink
from retryd.worker.lifecycle import DISCARDED, SUCCEEDED, Lifecycle
from retryd.worker.partition import PAUSE_CIRCUIT
from retryd.worker.scheduler import Scheduler
from retryd.worker.work import Work

log = logging.getLogger(__name__)

_RETRY = Outcome.RETRY
CLOSED = CircuitState.CLOSED
OPEN = CircuitState.OPEN
HALF_OPEN = CircuitState.HALF_OPEN


def failure_key(w: Work) -> Hashable:
    """What tells keys apart in the breaker's window: the record's key, or (no key) the
    record's own position, so keyless records count as distinct keys."""
    key = w.msg.key
    return key if key is not None else (w.msg.topic, w.msg.partition, w.offset)


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
        self._held: list[Work] = []
        self._gate: CircuitState = CLOSED  # the state the gate and the pauses were set for
        self._published = -1

    @property
    def closed(self) -> bool:
        return self.breaker.state is CLOSED

    def answered(self, n: int, now_ms: int) -> None:
        """``n`` calls got an answer (settled on their slot) since the last look."""
        if n <= 0:
            return
        b = self.breaker
        if b.state is CLOSED:
            b.observe(now_ms, n, [])
        elif b.state is HALF_OPEN:  # (while open, late answers of earlier calls change nothing)
            b.probe_answered(now_ms)
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
        error = f"{result.error_class} at {w.where}"
        probe = False
        if b.state is CLOSED:
            if w.env is None or self.count_tiers:
                b.observe(now_ms, 0, [(failure_key(w), error)])
        elif w is self.scheduler.probe and b.state is HALF_OPEN:
            probe = True
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
        if b.state is CLOSED or not self.lifecycle.hold(w):
            return False
        if probe:  # the next probe is another record: this one may be a poison record
            self.scheduler.requeue_last(w)
        else:
            self._held.append(w)
        b.count_held()
        return True

    def tick(self, now_ms: int) -> None:
        """Once per poll iteration, after settling: held records back in line, probes, the
        gate and the pauses for the current state, and the snapshot to the sinks."""
        b = self.breaker
        if self._held:
            held = sorted(self._held, key=lambda w: (w.msg.topic, w.msg.partition, w.offset))
            self._held.clear()
            self.scheduler.requeue(held)
        if b.state is OPEN and b.probe_due(now_ms):
            log.info("circuit half-open: letting one call through")
        elif b.state is HALF_OPEN:
            probe = self.scheduler.probe
            if probe is not None and probe.stage is SUCCEEDED:
                b.probe_answered(now_ms)
            elif probe is not None and probe.stage is DISCARDED:
                self.scheduler.set_gate(1)  # its assignment was given up: probe with another
        self._sync()
        if b.state is OPEN:
            self.book.pause_all(PAUSE_CIRCUIT, True)  # partitions assigned since it opened
        if b.changes != self._published:
            self._published = b.changes
            self.events.circuit(b.snapshot())

    def _sync(self) -> None:
        """Make the gate and the pauses follow the breaker's state."""
        state = self.breaker.state
        if state is not self._gate:
            self._apply(state)

    def _apply(self, state: CircuitState) -> None:
        before, self._gate = self._gate, state
        b = self.breaker
        if state is CLOSED:
            self.scheduler.set_gate(None)
            log.warning("circuit closed (%s): calls resume", b.reason)
        elif state is OPEN:
            self.scheduler.set_gate(0)
            if before is CLOSED:  # (back from a failed probe: logged there)
                log.warning(
                    "circuit open (%s; last error: %s): no calls start, partitions paused, "
                    "failed records held in place; first probe in %.1fs",
                    b.reason,
                    b.last_error,
                    b.interval_s,
                )
        else:
            self.scheduler.set_gate(1)
        # fetch nothing while open; half-open fetches again so a probe has a record to run
        self.book.pause_all(PAUSE_CIRCUIT, state is OPEN)
        if before is CLOSED and state is HALF_OPEN:  # an order skipped the open state
            log.warning("circuit half-open (%s)", b.reason)

    def apply_orders(self, now_ms: int) -> None:
        """An operator's order from the sidecar, if a new one was written."""
        if self.orders is None:
            return
        cmd = self.orders.poll()
        if cmd is None:
            return
        log.warning("circuit order #%d from %s: %s", cmd.seq, cmd.by, cmd.action.value)
        self.breaker.force(cmd.action, now_ms, cmd.by)
        self.tick(now_ms)

    def snapshot(self) -> CircuitSnapshot:
        return self.breaker.snapshot()


__all__ = ["Circuit", "failure_key"]
