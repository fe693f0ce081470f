"""The outage circuit breaker: pure policy, no I/O, no threads (the poll thread drives it).

A downstream outage makes *every* record fail; a poison record makes *one key* fail. Moving
records on to the next tier during an outage only floods the tiers and ``failed_topic`` with
records that were never wrong, so the breaker tells the two apart by counting retryable
failures over a sliding window of recent calls **and the distinct keys they came from**:

- **closed** (normal): calls run; a retryable failure is routed as usual. The circuit opens
  when, over the last ``window_calls`` calls of the last ``window_s`` seconds, retryable
  failures are at least ``failure_ratio`` of the calls, at least ``min_failures`` in number
  and come from at least ``min_keys`` distinct keys. One key failing forever never opens it.
- **open**: no call starts (the engine pauses the main topics and keeps polling); calls in
  flight finish, and a retryable failure is *held*: the record stays unsettled where it was
  and runs again once the circuit closes, instead of moving on because of the outage.
- **half-open**: after a probe interval (exponential with jitter, capped) exactly one call
  runs; an answer (success, drop, or a non-retryable failure: the service is there) closes
  the circuit, a retryable failure re-opens it with the next, longer interval. A probe that
  gets no answer by its deadline (``probe_lost``: a hung call, a lost loop) counts as failed,
  so the circuit never stays half-open.

**An outage is when retries fail too.** First attempts failing together is also what a
workload looks like whose records fail once and succeed when retried (read-after-write lag, a
dependency catching up: the commonest reason to use retry topics). So the window alone never
opens the circuit. When it trips, the breaker looks at *retry evidence*: the outcomes of calls
of records that failed before (tier records, held records run again) over the last
``evidence_s``:

- retries succeed (a recent success, and fewer failures than ``failure_ratio``): not an
  outage; the circuit stays closed and failures are routed as usual;
- otherwise it *confirms*: it goes half-open at once and runs one record that already failed
  again. If that fails too, the circuit opens; if it succeeds, it closes, and that success is
  the retry evidence that keeps the next trip from opening it.

So a fail-once workload costs one extra call per ``evidence_s`` at most, and a real outage
opens the circuit one call after the window tripped.

**Poison keys found by probes.** Probes rotate keys (the engine picks them). When the probes
of some keys failed and then another key's call was answered, those keys are *suspects*: their
failures stay out of the window for ``window_s`` (renewed while they keep failing), so a few
poison keys that opened the circuit once cannot open it again and again.

An operator can force any state (``force``). Counting keys: a record's key (hashed), or, for a
record without a key, its own position (each keyless record counts as a distinct key).
"""

from __future__ import annotations

import enum
import random
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

ERROR_MAX = 200  # characters of the last error kept (class and record position, no payload)
SUSPECTS_MAX = 10_000  # poison suspects remembered (keys whose probes failed, then others passed)


class CircuitState(enum.StrEnum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


# retryd_circuit_state's value: 0 closed, 1 half-open, 2 open (alerts compare with >= 2)
STATE_VALUE = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}


class CircuitAction(enum.StrEnum):
    """What an operator may ask for (``POST /v1/circuit``)."""

    OPEN = "open"  # stop calling now (a planned downstream maintenance)
    CLOSE = "close"  # resume now, window cleared
    PROBE = "probe"  # let one call through now


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    enabled: bool = True
    window_calls: int = 100
    window_s: float = 60.0
    failure_ratio: float = 0.5
    min_failures: int = 20
    min_keys: int = 5
    probe_initial_s: float = 5.0
    probe_max_s: float = 60.0
    probe_factor: float = 2.0
    probe_jitter: float = 0.2
    evidence_s: float = 10.0  # how recent a retried call's outcome must be to count
    # the first probe after a failed confirmation: no later than the first retry would run
    # (a record retried by its tier is the evidence a rerun in place may not give)
    confirm_probe_s: float | None = None

    def __post_init__(self) -> None:
        if self.window_calls < 1 or self.window_s <= 0:
            raise ValueError("the circuit breaker's window must hold at least one call")
        if not 0 < self.failure_ratio <= 1:
            raise ValueError("circuit_failure_ratio must be in (0, 1]")
        if self.min_failures < 1 or self.min_keys < 1:
            raise ValueError("circuit_min_failures and circuit_min_keys must be at least 1")
        if self.min_failures > self.window_calls:
            raise ValueError(
                f"circuit_min_failures ({self.min_failures}) exceeds circuit_window_calls "
                f"({self.window_calls}): the circuit could never open"
            )
        if self.probe_initial_s <= 0 or self.probe_max_s < self.probe_initial_s:
            raise ValueError(
                f"circuit_probe_s ({self.probe_initial_s:g}) must be above 0 and not exceed "
                f"circuit_probe_max_s ({self.probe_max_s:g})"
            )
        if self.probe_factor < 1 or not 0 <= self.probe_jitter < 1:
            raise ValueError("circuit probe growth must be >= 1 and its jitter in [0, 1)")
        if self.evidence_s <= 0:
            raise ValueError("the circuit breaker's retry evidence must span some time")


@dataclass(frozen=True, slots=True)
class CircuitSnapshot:
    """What operators see (heartbeat, ``/readyz`` details, the API, metrics)."""

    state: CircuitState
    since_ms: int  # when the current state began (epoch ms)
    reason: str  # why it is in this state
    last_error: str | None  # the last retryable failure counted: error class and record
    next_probe_ms: int | None  # open: when the next probe may run
    transitions: dict[str, int]  # state entered -> times, since start
    held: int  # failed records kept in place instead of moved on, since start
    probes: int  # probe calls let through, since start

    def as_dict(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "since_ms": self.since_ms,
            "reason": self.reason,
            "last_error": self.last_error,
            "next_probe_ms": self.next_probe_ms,
            "transitions": dict(self.transitions),
            "held": self.held,
            "probes": self.probes,
        }


class Window:
    """Retryable failures (with their keys) and answered calls over the last ``calls`` calls
    of the last ``span_ms``.

    Calls arrive per observation (one poll iteration: a count of answers, then the failures
    one by one, all at one time) and the order of answers and failures inside one is unknown.
    So the window keeps observations, never cuts the current one (it may briefly hold more
    calls), and cuts an older one in proportion: a burst of failures settled after the answers
    around them must not look like "the newest calls all failed"."""

    def __init__(self, calls: int, span_ms: int) -> None:
        self.max_calls = calls
        self.span_ms = span_ms
        # [time ms, answered count, failing keys] per observation, oldest first
        self._entries: deque[tuple[int, list[int], deque[Hashable]]] = deque()
        self.calls = 0
        self.failures = 0
        self.keys: Counter[Hashable] = Counter()

    def add(self, now_ms: int, answered: int, failed_keys: Iterable[Hashable]) -> None:
        entries = self._entries
        if not entries or entries[-1][0] != now_ms:
            entries.append((now_ms, [0], deque()))
        _, ok, keys = entries[-1]
        ok[0] += answered
        self.calls += answered
        for key in failed_keys:
            keys.append(key)
            self.calls += 1
            self.failures += 1
            self.keys[key] += 1
        self._trim(now_ms)

    def _drop_keys(self, keys: deque[Hashable], n: int) -> None:
        for _ in range(n):
            key = keys.popleft()
            self.calls -= 1
            self.failures -= 1
            left = self.keys[key] - 1
            if left:
                self.keys[key] = left
            else:
                del self.keys[key]

    def _trim(self, now_ms: int) -> None:
        entries = self._entries
        horizon = now_ms - self.span_ms
        while entries:
            t, ok, keys = entries[0]
            if t >= now_ms:
                break  # the current observation stays whole
            size = ok[0] + len(keys)
            excess = self.calls - self.max_calls
            if t >= horizon and excess < size:
                if excess > 0:  # cut this observation in proportion
                    cut_failures = min(len(keys), round(excess * len(keys) / size))
                    self._drop_keys(keys, cut_failures)
                    cut_ok = min(ok[0], excess - cut_failures)
                    ok[0] -= cut_ok
                    self.calls -= cut_ok
                return
            self.calls -= ok[0]
            self._drop_keys(keys, len(keys))
            entries.popleft()

    def expire(self, now_ms: int) -> None:
        """Drop what fell out of the time span (as an ``add`` would)."""
        self._trim(now_ms)

    def clear(self) -> None:
        self._entries.clear()
        self.calls = self.failures = 0
        self.keys.clear()


class Breaker:
    """One group's circuit in one process (every ``--processes`` child decides alone)."""

    def __init__(
        self, policy: BreakerPolicy, now_ms: int, draw: Callable[[], float] = random.random
    ) -> None:
        self.policy = policy
        self._draw = draw
        self.window = Window(policy.window_calls, int(policy.window_s * 1000))
        # outcomes of calls of records that failed before (tier records, held records run
        # again): whether retries succeed, which tells a fail-once workload from an outage
        self.retries = Window(policy.window_calls, int(policy.evidence_s * 1000))
        self.retry_ok_ms: int | None = None  # the last retried call that succeeded
        self.confirming = False  # half-open because the window tripped, not after an open
        self.spared = 0  # trips that retry evidence kept from opening the circuit
        # keys whose probes failed while another key's call was answered: poison, not an
        # outage; their failures stay out of the window (key -> until, epoch ms; bounded)
        self.suspects: dict[Hashable, int] = {}
        self.state = CircuitState.CLOSED
        self.since_ms = now_ms
        self.reason = "starting"
        self.last_error: str | None = None
        self.next_probe_ms: int | None = None
        self.interval_s = policy.probe_initial_s
        self.transitions: Counter[CircuitState] = Counter()
        self.held = 0
        self.probes = 0
        self.changes = 0  # bumped on every change operators can see (publish when it moves)

    # ------------------------------------------------------------ what the engine asks
    @property
    def closed(self) -> bool:
        return self.state is CircuitState.CLOSED

    @property
    def holding(self) -> bool:
        """Retryable failures are held in place, not routed (open or half-open)."""
        return self.state is not CircuitState.CLOSED

    def observe(self, now_ms: int, answered: int, failures: list[tuple[Hashable, str]]) -> None:
        """Calls that ended since the last look: ``answered`` got an answer from the handler
        (success, drop, non-retryable failure); ``failures`` are retryable failures as
        (key, error description). Opens the circuit when the window says "outage"."""
        if not self.policy.enabled or (not answered and not failures):
            return
        if failures:
            self.last_error = failures[-1][1][:ERROR_MAX]
            self.changes += 1
        if self.state is not CircuitState.CLOSED:
            return  # only the probe decides outside the closed state (probe_answered/failed)
        suspects = self.suspects
        if suspects and failures:
            failures = [f for f in failures if not self._suspect(f[0], now_ms)]
            if not failures and not answered:
                return
        w = self.window
        w.add(now_ms, answered, (key for key, _ in failures))
        p = self.policy
        if (
            w.failures >= p.min_failures
            and len(w.keys) >= p.min_keys
            and w.failures >= p.failure_ratio * w.calls
        ):
            why = f"{w.failures} of the last {w.calls} calls failed, from {len(w.keys)} keys"
            if self.retries_succeed(now_ms):
                self.spared += 1  # first attempts fail, retries succeed: not an outage
                return
            self._confirm(now_ms, why)

    def suspect(self, keys: Iterable[Hashable], now_ms: int) -> None:
        """These keys' probes failed, and then another key's call was answered: they are
        poison (their failures no longer count toward an outage for ``window_s``)."""
        until = now_ms + int(self.policy.window_s * 1000)
        suspects = self.suspects
        for key in keys:
            if key in suspects or len(suspects) < SUSPECTS_MAX:
                suspects[key] = until

    def _suspect(self, key: Hashable, now_ms: int) -> bool:
        """Is ``key`` a poison suspect? A failure keeps it one for another ``window_s``."""
        until = self.suspects.get(key)
        if until is None:
            return False
        if until < now_ms:
            del self.suspects[key]
            return False
        self.suspects[key] = now_ms + int(self.policy.window_s * 1000)
        return True

    def retried(self, now_ms: int, ok: int, failed: int) -> None:
        """Calls of records that failed before ended: ``ok`` got an answer, ``failed`` failed
        retryably again (the retry evidence)."""
        if not self.policy.enabled or (not ok and not failed):
            return
        self.retries.add(now_ms, ok, [None] * failed)
        if ok:
            self.retry_ok_ms = now_ms

    def retries_succeed(self, now_ms: int) -> bool:
        """Do records that failed before succeed when retried, recently and mostly?"""
        ok_at = self.retry_ok_ms
        if ok_at is None or now_ms - ok_at > self.policy.evidence_s * 1000:
            return False
        r = self.retries
        r.expire(now_ms)
        return r.calls > 0 and r.failures <= self.policy.failure_ratio * r.calls

    def probe_due(self, now_ms: int) -> bool:
        """Open and its probe interval is over: go half-open (the engine lets one call in)."""
        if self.state is not CircuitState.OPEN or self.next_probe_ms is None:
            return False
        if now_ms < self.next_probe_ms:
            return False
        self._set(CircuitState.HALF_OPEN, now_ms, "probing: one call let through")
        self.next_probe_ms = None
        self.confirming = False
        self.probes += 1
        return True

    def probe_answered(self, now_ms: int) -> None:
        """A call got an answer while not closed: the service is back."""
        if self.state is CircuitState.CLOSED:
            return
        self.close(now_ms, "a call was answered")

    def probe_failed(self, now_ms: int, error: str, *, why: str = "the probe failed") -> None:
        """The probe failed retryably: open, and wait longer before the next one (a confirming
        probe opens with the first interval)."""
        if self.state is not CircuitState.HALF_OPEN:
            return
        self.last_error = error[:ERROR_MAX]
        if self.confirming:
            self._open(now_ms, f"{self.reason}; {why}", fresh=True)
            first = self.policy.confirm_probe_s
            if first is not None and first < self.interval_s:
                self.interval_s = first
                self._schedule_probe(now_ms)
            return
        self.interval_s = min(self.interval_s * self.policy.probe_factor, self.policy.probe_max_s)
        self._open(now_ms, why, fresh=False)

    def probe_lost(self, now_ms: int, where: str, after_s: float) -> None:
        """The probe got no answer by its deadline (a hung call, a lost event loop): it counts
        as failed, so the circuit cannot stay half-open forever."""
        self.probe_failed(
            now_ms,
            f"no answer from the probe {where} within {after_s:g}s",
            why=f"the probe got no answer within {after_s:g}s",
        )

    def count_held(self, n: int = 1) -> None:
        self.held += n
        self.changes += 1

    def close(self, now_ms: int, why: str) -> None:
        self.window.clear()
        self.interval_s = self.policy.probe_initial_s
        self.next_probe_ms = None
        self.confirming = False
        self._set(CircuitState.CLOSED, now_ms, why)

    def force(self, action: CircuitAction, now_ms: int, by: str) -> None:
        """An operator's order. ``open`` stays open until probes or an operator close it."""
        if action is CircuitAction.CLOSE:
            self.close(now_ms, f"closed by {by}")
        elif action is CircuitAction.OPEN:
            self._open(now_ms, f"opened by {by}", fresh=self.state is CircuitState.CLOSED)
        elif self.state is CircuitState.OPEN:  # probe now
            self.next_probe_ms = now_ms
            self.changes += 1

    # ------------------------------------------------------------ what operators see
    def snapshot(self) -> CircuitSnapshot:
        return CircuitSnapshot(
            self.state,
            self.since_ms,
            self.reason,
            self.last_error,
            self.next_probe_ms,
            {state.value: n for state, n in self.transitions.items()},
            self.held,
            self.probes,
        )

    # ------------------------------------------------------------ internals
    def _confirm(self, now_ms: int, why: str) -> None:
        """The window tripped without recent retry evidence: half-open now, so one record
        that already failed runs again (the engine picks it) before anything is held for long."""
        self._set(CircuitState.HALF_OPEN, now_ms, f"confirming: {why}; a failed record runs again")
        self.next_probe_ms = None
        self.confirming = True
        self.probes += 1

    def _open(self, now_ms: int, why: str, *, fresh: bool) -> None:
        self.confirming = False
        if fresh:
            self.interval_s = self.policy.probe_initial_s
        self._schedule_probe(now_ms)
        self._set(CircuitState.OPEN, now_ms, why)

    def _schedule_probe(self, now_ms: int) -> None:
        jitter = self.policy.probe_jitter
        interval = self.interval_s * (1 + jitter * (2 * self._draw() - 1))
        self.next_probe_ms = now_ms + max(1, int(interval * 1000))

    def _set(self, state: CircuitState, now_ms: int, why: str) -> None:
        if state is not self.state:
            self.since_ms = now_ms
            self.transitions[state] += 1
        self.state = state
        self.reason = why
        self.changes += 1


__all__ = [
    "STATE_VALUE",
    "Breaker",
    "BreakerPolicy",
    "CircuitAction",
    "CircuitSnapshot",
    "CircuitState",
    "Window",
]
