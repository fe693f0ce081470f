"""Explorer sessions and the sign-in throttle (pure logic, injected clock)."""

from __future__ import annotations

from retryd.explorer.sessions import LoginThrottle, Lookup, SessionStore, csrf_ok


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


def test_the_store_is_bounded_and_evicts_the_least_recently_used() -> None:
    clock = Clock()
    sessions = store(clock, max_sessions=3)
    cookies = [sessions.create(f"t{i}", "read")[0] for i in range(3)]
    clock.now += 1
    assert sessions.get(cookies[0])[1] is Lookup.OK  # now the most recently used
    extra = [sessions.create(f"x{i}", "read")[0] for i in range(1000)]
    assert len(sessions) == 3
    assert sessions.get(cookies[0])[1] is Lookup.MISSING
    assert sessions.get(extra[-1])[1] is Lookup.OK


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
        assert throttle.allowed("10.0.0.1")
        throttle.failed("10.0.0.1")
    assert not throttle.allowed("10.0.0.1")
    assert throttle.allowed("10.0.0.2")
    throttle.failed("10.0.0.2")
    throttle.failed("10.0.0.3")
    assert not throttle.allowed("10.0.0.4")  # five failures from anywhere within the window
    clock.now += 60
    assert throttle.allowed("10.0.0.1") and throttle.allowed("10.0.0.4")


def test_the_throttle_table_is_bounded() -> None:
    clock = Clock()
    throttle = LoginThrottle(global_attempts=10**9, max_clients=100, clock=clock)
    for i in range(10_000):
        throttle.failed(f"10.{i}")
    assert len(throttle._clients) == 100
