"""The share worker's side of the outage circuit breaker (``retryd.share.gate``): what it may
poll and start in each state, and what it feeds group mode's breaker. The decisions are the
breaker's own (``retryd.policy.circuit``); these tests pin how a share worker follows them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from retryd.policy.circuit import Breaker, BreakerPolicy, CircuitAction, CircuitSnapshot
from retryd.policy.classify import HandlerResult, Outcome
from retryd.policy.headers import DEAD_EXHAUSTED, DEAD_NON_RETRYABLE
from retryd.runtime.circuit_control import CommandReader, write_command
from retryd.share.gate import LockedBreaker, ShareGate, not_called, record_key
from retryd.worker.events import NullSink

POLICY = BreakerPolicy(
    window_calls=10,
    min_failures=3,
    min_keys=3,
    probe_initial_s=5.0,
    probe_jitter=0.0,
)
FAIL = HandlerResult(Outcome.RETRY, "ServiceDown", "503")
OK = HandlerResult.success()
T0 = 1_000_000


@dataclass
class Msg:
    k: bytes | None
    off: int

    def key(self) -> bytes | None:
        return self.k

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self.off


@dataclass(eq=False)
class Rec:
    msg: Msg


class Snapshots(NullSink):
    def __init__(self) -> None:
        self.seen: list[CircuitSnapshot] = []

    def circuit(self, snapshot: CircuitSnapshot) -> None:
        self.seen.append(snapshot)


def rec(i: int, key: bytes | None = None) -> Rec:
    return Rec(Msg(key if key is not None else f"k{i}".encode(), i))


def gate(policy: BreakerPolicy = POLICY, *, owner: bool = True, sink: NullSink | None = None):
    return ShareGate(
        Breaker(policy, T0, draw=lambda: 0.5),
        sink or NullSink(),
        None,
        owner=owner,
        keepalive_s=150.0,
    )


def trip(g: ShareGate, now: int = T0) -> Rec:
    """Failures from three keys: the window trips on the third, which runs again in place."""
    assert not g.failed(rec(1), FAIL, None, now, "orders[0]@1")
    assert not g.failed(rec(2), FAIL, None, now, "orders[0]@2")
    third = rec(3)
    assert g.failed(third, FAIL, None, now, "orders[0]@3")  # the confirming call, in place
    return third


def test_closed_polls_and_starts_everything() -> None:
    g = gate()
    assert g.may_poll(T0) and g.may_start(rec(1)) and g.may_start(rec(2))
    g.answered(rec(1), T0)
    assert g.closed


def test_a_trip_confirms_with_the_failed_record_in_place_and_starts_nothing_else() -> None:
    g = gate()
    third = trip(g)
    assert g.state.value == "half_open" and g.probe is third
    assert not g.may_poll(T0)  # our probe runs: acquire nothing more
    assert not g.may_start(rec(4))


def test_a_failed_confirmation_opens_then_probes_one_record_and_an_answer_closes() -> None:
    g = gate()
    third = trip(g)
    assert not g.failed(third, FAIL, None, T0 + 10, "orders[0]@3")  # routed to its tier
    assert g.state.value == "open"
    assert not g.may_poll(T0 + 10) and not g.may_start(rec(4))
    g.tick(T0 + 4_000)
    assert g.state.value == "open"  # the probe interval (5 s) is not over
    g.tick(T0 + 5_100)
    assert g.state.value == "half_open"
    assert g.may_poll(T0 + 5_100)  # a probe needs a record
    probe, other = rec(5), rec(6)
    assert g.may_start(probe) and not g.may_start(other)
    assert not g.may_poll(T0 + 5_100)
    g.answered(probe, T0 + 5_200)
    assert g.closed and g.may_start(other) and g.may_poll(T0 + 5_200)


def test_a_failed_probe_opens_again_for_longer() -> None:
    g = gate()
    third = trip(g)
    g.failed(third, FAIL, None, T0, "x")
    g.tick(T0 + 5_100)
    probe = rec(7)
    assert g.may_start(probe)
    assert not g.failed(probe, FAIL, None, T0 + 5_200, "orders[0]@7")
    b = g.breaker
    assert g.state.value == "open" and b.interval_s == 10.0
    assert b.next_probe_ms == T0 + 5_200 + 10_000
    assert b.snapshot().probes == 2  # the confirmation and this probe


def test_while_open_late_answers_change_nothing_and_non_retryable_answers_close_half_open() -> None:
    g = gate()
    third = trip(g)
    g.failed(third, FAIL, None, T0, "x")
    g.answered(rec(8), T0 + 1)  # a call started before it opened
    assert g.state.value == "open"
    g.tick(T0 + 5_100)
    probe = rec(9)
    assert g.may_start(probe)
    g.answered(probe, T0 + 5_200)  # e.g. a 404: the service is there
    assert g.closed


def test_failures_a_rule_dead_letters_do_not_count_and_one_key_never_opens() -> None:
    g = gate()
    for i in range(10):
        assert not g.failed(rec(i), FAIL, DEAD_NON_RETRYABLE, T0, "x")
    assert g.closed
    for i in range(10):
        assert not g.failed(rec(i, b"poison"), FAIL, None, T0, "x")
    assert g.closed
    # the last retry's failure (exhausted) counts like any retryable failure
    g2 = gate()
    g2.failed(rec(1), FAIL, DEAD_EXHAUSTED, T0, "x")
    g2.failed(rec(2), FAIL, DEAD_EXHAUSTED, T0, "x")
    assert g2.failed(rec(3), FAIL, DEAD_EXHAUSTED, T0, "x")


def test_a_confirming_record_that_cannot_run_again_leaves_the_probe_to_the_next() -> None:
    g = gate()
    third = trip(g)
    g.cannot_rerun(third)
    nxt = rec(4)
    assert g.may_start(nxt) and g.probe is nxt


def test_a_long_open_circuit_probes_early_to_keep_the_membership() -> None:
    g = ShareGate(
        Breaker(
            BreakerPolicy(min_failures=3, min_keys=3, probe_initial_s=600, probe_max_s=600), T0
        ),
        NullSink(),
        None,
        owner=True,
        keepalive_s=0.0,  # the last poll is always "too long ago"
    )
    third = trip(g, now=T0)
    g.failed(third, FAIL, None, T0, "x")
    assert g.state.value == "open"
    g.tick(T0 + 1_000)  # 10 minutes before its probe would be due
    assert g.state.value == "half_open" and g.may_poll(T0 + 1_000)


def test_the_owner_publishes_the_circuit_and_applies_orders(tmp_path: Path) -> None:
    sink = Snapshots()
    g = ShareGate(
        Breaker(POLICY, T0),
        sink,
        CommandReader(tmp_path, "orders"),
        owner=True,
        keepalive_s=150.0,
        orders_s=0.0,  # read at every tick
    )
    g.tick(T0)
    assert [s.state.value for s in sink.seen] == ["closed"]
    write_command(tmp_path, "orders", CircuitAction.OPEN, "ops")
    g.tick(T0 + 1)
    assert g.state.value == "open" and sink.seen[-1].reason == "opened by ops"
    assert not g.may_poll(T0 + 1)


def test_a_part_that_does_not_own_the_circuit_neither_publishes_nor_takes_orders(
    tmp_path: Path,
) -> None:
    sink = Snapshots()
    g = ShareGate(
        Breaker(POLICY, T0),
        sink,
        CommandReader(tmp_path, "orders"),
        owner=False,
        keepalive_s=150.0,
    )
    write_command(tmp_path, "orders", CircuitAction.OPEN, "ops")
    g.tick(T0)
    assert g.closed and sink.seen == []


def test_one_breaker_two_readers_one_decision() -> None:
    """Role all: the tiers worker's retry evidence (tier records succeeding) spares the share
    worker's trip, as in group mode."""
    shared = LockedBreaker(POLICY, T0)
    g = ShareGate(shared, NullSink(), None, owner=False, keepalive_s=150.0)
    shared.retried(T0, 5, 0)  # the tiers worker: retries succeed
    for i in range(5):
        assert not g.failed(rec(i), FAIL, None, T0 + 1, "x")
    assert g.closed and shared.spared > 0


def test_keys_and_the_uncalled_result() -> None:
    assert record_key(Msg(b"a", 3)) == b"a"
    assert record_key(Msg(None, 3)) == ("orders", 0, 3)
    result = not_called("the circuit was open")
    assert result.outcome is Outcome.RETRY and result.error_class == "circuit_open"


class ClosedMeanwhile(Breaker):
    """A breaker whose probe time the other poll thread (role all's tiers worker) clears
    between two reads of it from outside the breaker: the first such read sees the probe
    time, every later one None. Inside the breaker's own decisions (under ``LockedBreaker``'s
    lock) its fields hold still."""

    reads = 0
    inside = False

    @property  # type: ignore[override]
    def next_probe_ms(self) -> int | None:
        if self.inside:
            return self._probe
        self.reads += 1
        return self._probe if self.reads == 1 else None

    @next_probe_ms.setter
    def next_probe_ms(self, value: int | None) -> None:
        self._probe = value
        self.reads = 0

    def probe_due(self, now_ms: int) -> bool:
        self.inside = True
        try:
            return super().probe_due(now_ms)
        finally:
            self.inside = False

    def force(self, action: CircuitAction, now_ms: int, by: str) -> None:
        self.inside = True
        try:
            super().force(action, now_ms, by)
        finally:
            self.inside = False


def test_the_probe_time_is_read_once_while_the_other_thread_may_clear_it() -> None:
    b = ClosedMeanwhile(POLICY, T0, draw=lambda: 0.5)
    b.force(CircuitAction.OPEN, T0, "ops")
    g = ShareGate(b, NullSink(), None, owner=True, keepalive_s=150.0)
    assert g.idle_s(T0) == 1.0  # probe in 5 s: look again within the orders' interval
    b.next_probe_ms = T0 + 5_000
    g.keepalive_s = 0.0  # the membership needs a poll now: the probe comes early
    g.tick(T0 + 10)
    assert g.state.value == "half_open"
