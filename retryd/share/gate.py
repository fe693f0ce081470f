"""The outage circuit breaker in share mode: the share worker's side of group mode's breaker.

The decision is group mode's, made by the same ``retryd.policy.circuit.Breaker`` with the same
settings (``circuit_*``): the window of first calls' retryable failures from distinct keys,
the confirmation, the probes and their growing interval, the poison suspects, the operators'
orders. What differs is how a share group lets a worker *stop*: holding a record costs a
delivery (a RELEASE, or a lock that expires, counts toward ``share.delivery.count.limit``), so
a share worker does not hold failed records in place as a consumer group's worker does. Instead:

- **open: nothing is acquired.** The worker does not ``poll`` (a share consumer acquires
  records only when polled, and keeps its membership through its own heartbeat thread), so no
  record is locked to it and none uses a delivery. librdkafka still enforces
  ``max.poll.interval.ms`` on a share consumer (the member leaves the group past it), so a
  circuit open that long without a probe takes one early (``keepalive_s``, half of it);
- **calls in flight when it opens finish the normal way**: a retryable failure goes to its
  tier (delayed, not lost; the tier brings it back when the service may be back);
- **records of the batch in hand not started yet** stay in hand (still acquired, costing
  nothing yet): they run once the circuit closes, or one of them is the next probe. One whose
  lock can no longer hold a call goes to its first tier *without a call* (error class
  ``circuit_open``): no delivery used, delayed like a failure, and the tiers (held by the
  circuit like any tier record) bring it back. Only when its route would dead-letter it (no
  tier) is it RELEASEd instead (one delivery; an uncalled record is never dead-lettered). A
  probe that needs a record polls a whole batch (``max.poll.records``: the client cannot ask
  for one), so each failed probe may send up to a batch on to the tiers this way;
- **half-open: one probe**: the failed record that tripped the window runs again in place as
  the confirming call (still acquired, while its lock holds a call), else the next record in
  hand or the next one polled (so too when the probe is acknowledged without an answer). An
  answer closes the circuit, a retryable failure re-opens it.

**One breaker per process.** With role ``all`` the process's tiers worker (a consumer group,
``retryd.worker``) drives the same breaker (``LockedBreaker``: the two poll threads take
turns): an outage seen on the main topics also stops tier calls, a tier record that succeeds
is the retry evidence that keeps a fail-once workload's trips from opening it, and the tiers
worker (which writes the process's heartbeat) applies the orders file and publishes
``retryd_circuit_*``. Each part may run a probe when the circuit is half-open, so such a
process lets at most two calls through per probe. With role ``main`` the share worker does
all of it itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable
from typing import Any

from retryd.policy.circuit import (
    Breaker,
    BreakerPolicy,
    CircuitAction,
    CircuitSnapshot,
    CircuitState,
)
from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.headers import DEAD_EXHAUSTED
from retryd.runtime.circuit_control import CommandReader
from retryd.worker.events import Sink

log = logging.getLogger(__name__)

CLOSED = CircuitState.CLOSED
OPEN = CircuitState.OPEN
HALF_OPEN = CircuitState.HALF_OPEN
ORDERS_S = 1.0  # the orders file is read at most this often (a heartbeat's interval)
CIRCUIT_OPEN = "circuit_open"  # error class of a record sent on to its tier without a call


class LockedBreaker(Breaker):
    """The process's breaker when two poll threads drive it (role ``all``: the share worker
    and the tiers worker). Each decision is the policy's own; the lock makes each one whole."""

    def __init__(self, policy: BreakerPolicy, now_ms: int) -> None:
        super().__init__(policy, now_ms)
        self._lock = threading.RLock()

    def observe(self, now_ms: int, answered: int, failures: list[tuple[Hashable, str]]) -> None:
        with self._lock:
            super().observe(now_ms, answered, failures)

    def retried(self, now_ms: int, ok: int, failed: int) -> None:
        with self._lock:
            super().retried(now_ms, ok, failed)

    def retries_succeed(self, now_ms: int) -> bool:
        with self._lock:
            return super().retries_succeed(now_ms)

    def suspect(self, keys: Any, now_ms: int) -> None:
        with self._lock:
            super().suspect(keys, now_ms)

    def probe_due(self, now_ms: int) -> bool:
        with self._lock:
            return super().probe_due(now_ms)

    def probe_answered(self, now_ms: int) -> None:
        with self._lock:
            super().probe_answered(now_ms)

    def probe_failed(self, now_ms: int, error: str, *, why: str = "the probe failed") -> None:
        with self._lock:
            super().probe_failed(now_ms, error, why=why)

    def count_held(self, n: int = 1) -> None:
        with self._lock:
            super().count_held(n)

    def close(self, now_ms: int, why: str) -> None:
        with self._lock:
            super().close(now_ms, why)

    def force(self, action: Any, now_ms: int, by: str) -> None:
        with self._lock:
            super().force(action, now_ms, by)

    def snapshot(self) -> CircuitSnapshot:
        with self._lock:
            return super().snapshot()


def record_key(msg: Any) -> Hashable:
    """What tells keys apart in the window (as group mode's ``failure_key``): the key, or the
    record's own position for a record without one."""
    key = msg.key()
    return key if key is not None else (msg.topic(), msg.partition(), msg.offset())


class ShareGate:
    """Feeds the breaker what the share worker's calls did and says what the worker may do.

    ``owner``: this side applies the orders file and publishes the circuit (role ``main``);
    with role ``all`` the tiers worker does (module docstring)."""

    def __init__(
        self,
        breaker: Breaker,
        events: Sink,
        orders: CommandReader | None,
        *,
        owner: bool,
        keepalive_s: float,
        orders_s: float = ORDERS_S,
    ) -> None:
        self.breaker = breaker
        self.events = events
        self.orders = orders if owner else None
        self.owner = owner
        self.keepalive_s = keepalive_s
        self.orders_s = orders_s
        self.probe: Any = None  # the record running as this side's probe
        self.polled_at = time.monotonic()
        self._orders_at = 0.0
        self._published = -1
        self._seen: CircuitState = breaker.state

    @property
    def state(self) -> CircuitState:
        return self.breaker.state

    @property
    def closed(self) -> bool:
        return self.breaker.state is CLOSED

    # ------------------------------------------------------------------ what may happen
    def may_poll(self, now_ms: int) -> bool:
        """Poll for records: closed; or half-open with no probe of ours running (a probe needs
        a record). Open: only once its probe is due (or the poll interval needs one)."""
        state = self.breaker.state
        return state is CLOSED or (state is HALF_OPEN and self.probe is None)

    def polled(self) -> None:
        self.polled_at = time.monotonic()

    def may_start(self, rec: Any) -> bool:
        """May ``rec`` (a record never called) start now? Closed: yes. Half-open: as the
        probe, if none of ours runs. Open: no (it waits in hand)."""
        state = self.breaker.state
        if state is CLOSED:
            return True
        if state is HALF_OPEN and self.probe is None:
            self.probe = rec
            return True
        return False

    def idle_s(self, now_ms: int) -> float:
        """How long the worker may wait with nothing in hand before looking again. (The
        breaker's fields are read once each: with role all the tiers worker may change them
        meanwhile, and a wait a little off is harmless where a torn read is not.)"""
        b = self.breaker
        state, due = b.state, b.next_probe_ms
        if state is OPEN and due is not None:
            return min(ORDERS_S, max(0.01, (due - now_ms) / 1000))
        return ORDERS_S if state is OPEN else 0.05

    # ------------------------------------------------------------------ evidence
    def answered(self, rec: Any, now_ms: int) -> None:
        """``rec``'s call got an answer (success, drop, non-retryable failure): the service
        is there. Closed: counted; half-open: the circuit closes (any answer, as in group
        mode); open: a late answer of an earlier call changes nothing."""
        b = self.breaker
        if rec is self.probe:
            self.probe = None
        if b.state is CLOSED:
            b.observe(now_ms, 1, [])
        elif b.state is HALF_OPEN:
            b.probe_answered(now_ms)
        self._follow()

    def failed(
        self, rec: Any, result: HandlerResult, dead_reason: str | None, now_ms: int, where: str
    ) -> bool:
        """``rec``'s call failed retryably (its route planned: ``dead_reason``). True when it
        should run again in place as the confirming probe (the window just tripped), instead
        of being routed."""
        b = self.breaker
        if not b.policy.enabled or result.outcome is not Outcome.RETRY:
            return False
        if dead_reason is not None and dead_reason != DEAD_EXHAUSTED:
            return False  # dead-lettered by a rule (an error route), not by an outage
        error = f"{result.error_class} at {where}"
        probe = rec is self.probe
        if probe:
            self.probe = None
        rerun = False
        if b.state is CLOSED:
            b.observe(now_ms, 0, [(record_key(rec.msg), error)])
            if b.state is HALF_OPEN and self.probe is None:
                self.probe = rec  # confirm with the record that tripped it, in place
                rerun = True
        elif probe and b.state is HALF_OPEN:
            b.probe_failed(now_ms, error)
            log.warning(
                "circuit stays open: the share worker's probe %s failed (%s); next probe in %.1fs",
                where,
                result.error_class,
                b.interval_s,
            )
        else:
            b.last_error = error
        self._follow()
        return rerun

    def cannot_rerun(self, rec: Any) -> None:
        """The confirming record's lock cannot hold another call: the next record is the
        probe."""
        if rec is self.probe:
            self.probe = None

    def unanswered(self, rec: Any) -> None:
        """``rec`` is acknowledged without an answer of its own (its call cut off with an
        abandoned event loop, then sent on uncalled once its lock could no longer hold a call;
        released at a stop): if it was the probe, the next record is. Kept, it would hold the
        circuit half-open with no probe to run, and the worker would never poll again."""
        if rec is self.probe:
            self.probe = None

    # ------------------------------------------------------------------ every iteration
    def tick(self, now_ms: int) -> None:
        """Orders (at most every ``ORDERS_S``, when this side owns them), the probe when it is
        due, the circuit's snapshot to the sinks (owner), a log line when the state changed."""
        if self.orders is not None:
            now = time.monotonic()
            if now - self._orders_at >= self.orders_s:
                self._orders_at = now
                cmd = self.orders.poll()
                if cmd is not None:
                    log.warning("circuit order #%d from %s: %s", cmd.seq, cmd.by, cmd.action.value)
                    self.breaker.force(cmd.action, now_ms, cmd.by)
        b = self.breaker
        if b.state is OPEN:
            if time.monotonic() - self.polled_at >= self.keepalive_s:
                # early, to keep the membership: the operators' "probe now", which decides
                # under the breaker's lock (never a write of its fields from here)
                b.force(CircuitAction.PROBE, now_ms, "the share worker's poll interval")
            if b.probe_due(now_ms):
                log.info("circuit half-open: the share worker lets one call through")
        self._follow()
        if self.owner and b.changes != self._published:
            self._published = b.changes
            self.events.circuit(b.snapshot())

    def _follow(self) -> None:
        b = self.breaker
        state = b.state
        if state is self._seen:
            return
        before, self._seen = self._seen, state
        if state is OPEN and before is CLOSED:
            log.warning(
                "circuit open (%s; last error: %s): the share worker acquires no record; "
                "calls in flight finish; first probe in %.1fs",
                b.reason,
                b.last_error,
                b.interval_s,
            )
        elif state is CLOSED:
            self.probe = None
            log.warning("circuit closed (%s): the share worker acquires records again", b.reason)
        elif state is HALF_OPEN and before is CLOSED:
            log.warning("circuit half-open (%s; last error: %s)", b.reason, b.last_error)

    def snapshot(self) -> dict[str, object]:
        return self.breaker.snapshot().as_dict()


def not_called(reason: str) -> HandlerResult:
    """The result a record sent on to its tier without a call carries."""
    return HandlerResult(Outcome.RETRY, CIRCUIT_OPEN, reason)


__all__ = ["CIRCUIT_OPEN", "LockedBreaker", "ShareGate", "not_called", "record_key"]
