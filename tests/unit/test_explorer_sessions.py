"""Explorer sessions (bounded per token and in all) and the sign-in throttle (pure logic,
injected clock)."""

from __future__ import annotations

import pytest

from retryd.explorer.sessions import (
    Failure,
    LoginThrottle,
    Lookup,
    SessionsFull,
    SessionStore,
    csrf_ok,
    per_token_share,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store(clock: Clock, max_sessions: int = 10) -> SessionStore:
    return SessionStore(idle_s=60, max_s=300, max_sessions=max_sessions, clock=clock)


def test_a_session_is_found_by_its_cookie_and_keeps_no_token() -> None:
    clock = Clock()
    sessions = store(clock)
    cookie, session = sessions.create("operator", "replay")
    assert len(cookie) >= 40  # 256 random bits, urlsafe
    found, why = sessions.get(cookie)
    assert found is session and why is Lookup.OK
    assert session.allows("read") and session.allows("replay") and not session.allows("circuit")
    assert cookie not in repr(session) and session.csrf not in repr(session)
    assert sessions.get("forged")[1] is Lookup.MISSING
    assert sessions.get(None)[1] is Lookup.MISSING
    assert sessions.get("x" * 10_000)[1] is Lookup.MISSING


def test_idle_expiry_is_restarted_by_use() -> None:
    clock = Clock()
    sessions = store(clock)
    cookie, _ = sessions.create("viewer", "read")
    for _ in range(3):
        clock.now += 59
        assert sessions.get(cookie)[1] is Lookup.OK
    clock.now += 60
    assert sessions.get(cookie) == (None, Lookup.EXPIRED)
    assert sessions.get(cookie)[1] is Lookup.EXPIRED  # still told apart from a forged cookie


def test_absolute_expiry_ends_a_session_in_use() -> None:
    clock = Clock()
    sessions = store(clock)
    cookie, _ = sessions.create("viewer", "read")
    for _ in range(5):
        clock.now += 59
        assert sessions.get(cookie)[1] is Lookup.OK
    clock.now += 6  # 301 s after sign-in
    assert sessions.get(cookie) == (None, Lookup.EXPIRED)


def test_one_token_replaces_only_its_own_least_recently_used_sessions() -> None:
    clock = Clock()
    sessions = SessionStore(idle_s=60, max_s=300, max_sessions=6, max_per_token=2, clock=clock)
    others = [sessions.create(name, "read")[0] for name in ("viewer", "auditor")]
    mine = [sessions.create("operator", "replay")[0] for _ in range(2)]
    clock.now += 1
    assert sessions.get(mine[0])[1] is Lookup.OK  # now the operator's most recently used
    sessions.create("operator", "replay")
    assert sessions.get(mine[1])[1] is Lookup.EXPIRED  # replaced: the page says it ended
    assert sessions.get(mine[0])[1] is Lookup.OK
    extra = [sessions.create("operator", "replay")[0] for _ in range(1000)]
    assert sessions.count("operator") == 2 and len(sessions) == 4
    assert sessions.get(extra[-1])[1] is Lookup.OK and sessions.get(extra[-2])[1] is Lookup.OK
    assert sessions.get(mine[0])[0] is None
    assert all(sessions.get(c)[1] is Lookup.OK for c in others)


def test_a_full_store_refuses_a_new_token_instead_of_ending_others_sessions() -> None:
    clock = Clock()
    sessions = SessionStore(idle_s=60, max_s=300, max_sessions=3, clock=clock)
    a = sessions.create("a", "read")[0]
    clock.now += 10
    b = [sessions.create("b", "read")[0] for _ in range(2)]
    clock.now += 5
    with pytest.raises(SessionsFull) as full:
        sessions.create("c", "read")
    assert full.value.retry_after_s == 45  # a goes idle 60 s after its sign-in
    assert all(sessions.get(c)[1] is Lookup.OK for c in [a, *b])
    # A token that has sessions replaces its own least recently used one instead.
    again = sessions.create("a", "read")[0]
    assert sessions.get(a)[1] is Lookup.EXPIRED and sessions.get(again)[1] is Lookup.OK
    assert all(sessions.get(c)[1] is Lookup.OK for c in b)


def test_a_full_store_first_drops_every_expired_session() -> None:
    """Also one ended by max_s while recently used (the cheap sweep stops at a live one)."""
    clock = Clock()
    sessions = SessionStore(idle_s=60, max_s=100, max_sessions=2, clock=clock)
    old = sessions.create("a", "read")[0]
    clock.now += 50
    young = sessions.create("b", "read")[0]
    clock.now += 50  # old: 100 s after sign-in, used just now; young: idle 50 s
    assert sessions.get(young)[1] is Lookup.OK  # young is now the most recently used
    clock.now += 1
    cookie, _ = sessions.create("c", "read")
    assert sessions.get(old)[1] is Lookup.EXPIRED
    assert sessions.get(young)[1] is Lookup.OK and sessions.get(cookie)[1] is Lookup.OK


def test_each_token_gets_an_equal_share() -> None:
    assert per_token_share(1000, 3) == 333
    assert per_token_share(1000, 0) == 1000
    assert per_token_share(2, 5) == 1  # more tokens than sessions: one each


def test_sign_out_ends_the_session() -> None:
    clock = Clock()
    sessions = store(clock)
    cookie, _ = sessions.create("viewer", "read")
    sessions.end(cookie)
    assert sessions.get(cookie)[1] is Lookup.MISSING
    sessions.end(None)
    sessions.end("unknown")


def test_csrf_tokens_are_compared_exactly() -> None:
    clock = Clock()
    sessions = store(clock)
    _, session = sessions.create("operator", "replay")
    _, other = sessions.create("operator", "replay")
    assert csrf_ok(session, session.csrf)
    assert session.csrf != other.csrf
    for bad in (None, "", other.csrf, session.csrf[:-1], session.csrf + "x", "\u202e" * 300):
        assert not csrf_ok(session, bad)


def test_failed_sign_ins_are_throttled_per_address_and_overall() -> None:
    clock = Clock()
    throttle = LoginThrottle(attempts=3, global_attempts=5, window_s=60, clock=clock)
    for _ in range(3):
        assert throttle.failed("10.0.0.1") == Failure(0.0, "", True)
        clock.now += 1
    first = throttle.failed("10.0.0.1")
    assert first == Failure(57.0, "peer", True)  # the oldest of the three leaves in 57 s
    assert first.retry_after == "57"
    assert throttle.failed("10.0.0.1") == Failure(57.0, "peer", False)  # audited once
    assert throttle.failed("10.0.0.2").wait_s == 0
    assert throttle.failed("10.0.0.3").wait_s == 0
    # five failures from anywhere within the window: a new address is refused too
    assert throttle.failed("10.0.0.4") == Failure(57.0, "all", True)
    assert throttle.failed("10.0.0.5") == Failure(57.0, "all", False)
    clock.now += 57
    assert throttle.failed("10.0.0.4") == Failure(0.0, "", True)
    clock.now += 3
    assert throttle.failed("10.0.0.1").wait_s == 0  # its failures left the window


def test_failures_past_the_limit_are_not_recorded() -> None:
    """A flood does not grow the windows, nor keep a peer refused beyond its window."""
    clock = Clock()
    throttle = LoginThrottle(attempts=2, global_attempts=10**6, window_s=60, clock=clock)
    throttle.failed("p")
    throttle.failed("p")
    for _ in range(10_000):
        assert throttle.failed("p").limit == "peer"
    assert len(throttle._clients["p"].times) == 2 and len(throttle._all) == 2
    clock.now += 60
    assert throttle.failed("p").wait_s == 0


def test_the_throttle_table_is_bounded() -> None:
    clock = Clock()
    throttle = LoginThrottle(global_attempts=10**9, max_clients=100, clock=clock)
    for i in range(10_000):
        throttle.failed(f"10.{i}")
    assert len(throttle._clients) == 100
