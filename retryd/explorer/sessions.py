"""Explorer sessions: what an API token is exchanged for at sign-in (pure logic, injected clock).

A session remembers who signed in (the token's id and scope, never the token), its CSRF token
and two times: it ends ``idle_s`` after its last request, and ``max_s`` after sign-in whatever
happens. The store is bounded: past ``max_sessions`` the session used least recently goes, so
a flood of sign-ins costs memory once, not without bound. The session id in the cookie is a
256-bit random secret; the store keeps only its SHA-256 digest, so a memory dump or a log of
the store's keys gives nobody a usable cookie.

Failed sign-ins are counted per client address (``LoginThrottle``): a token cannot be guessed
faster than a few attempts a minute from one address, and the table of addresses is bounded.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

Clock = Callable[[], float]


class Lookup(Enum):
    """Why a cookie did not give a session (or that it did)."""

    OK = "ok"
    MISSING = "missing"  # no cookie, or one this process never issued
    EXPIRED = "expired"  # idle or absolute expiry passed


@dataclass
class Session:
    token_id: str
    scope: str
    csrf: str = field(repr=False)
    created: float
    last_seen: float

    def allows(self, needed: str) -> bool:
        """The same rule as ``ApiToken.allows``: every scope reads; others only their own."""
        return needed == "read" or needed == self.scope


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", errors="replace")).digest()


class SessionStore:
    """In-memory sessions of one sidecar process (a restart signs everybody out)."""

    def __init__(
        self, *, idle_s: float, max_s: float, max_sessions: int, clock: Clock = time.monotonic
    ) -> None:
        self.idle_s = idle_s
        self.max_s = max_s
        self.max_sessions = max_sessions
        self.clock = clock
        # Digest -> session, least recently used first.
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()
        # Digests of sessions that expired lately, so the sign-in page can say so (bounded).
        self._expired: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, token_id: str, scope: str) -> tuple[str, Session]:
        """A new session: ``(cookie value, session)``. Evicts the least recently used one
        when the store is full."""
        now = self.clock()
        self._sweep(now)
        while len(self._sessions) >= self.max_sessions:
            self._sessions.popitem(last=False)
        session_id = secrets.token_urlsafe(32)
        session = Session(token_id, scope, secrets.token_urlsafe(32), now, now)
        self._sessions[_digest(session_id)] = session
        return session_id, session

    def get(self, session_id: str | None) -> tuple[Session | None, Lookup]:
        """The live session of a cookie, its idle clock restarted; or why there is none."""
        if not session_id or len(session_id) > 256:
            return None, Lookup.MISSING
        key = _digest(session_id)
        now = self.clock()
        session = self._sessions.get(key)
        if session is None:
            return None, Lookup.EXPIRED if key in self._expired else Lookup.MISSING
        if self._is_expired(session, now):
            self._expire(key)
            return None, Lookup.EXPIRED
        session.last_seen = now
        self._sessions.move_to_end(key)
        return session, Lookup.OK

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(_digest(session_id), None)

    def _is_expired(self, session: Session, now: float) -> bool:
        return now - session.last_seen >= self.idle_s or now - session.created >= self.max_s

    def _expire(self, key: bytes) -> None:
        self._sessions.pop(key, None)
        self._expired[key] = None
        while len(self._expired) > self.max_sessions:
            self._expired.popitem(last=False)

    def _sweep(self, now: float) -> None:
        """Drop expired sessions from the least recently used end (those idle longest)."""
        for key, session in list(self._sessions.items()):
            if not self._is_expired(session, now):
                break  # the rest were used more recently still
            self._expire(key)


def csrf_ok(session: Session, given: str | None) -> bool:
    """Constant-time comparison of a request's CSRF token with the session's."""
    if not given or len(given) > 256:
        return False
    return hmac.compare_digest(session.csrf.encode(), given.encode("utf-8", errors="replace"))


class LoginThrottle:
    """At most ``attempts`` failed sign-ins per ``window_s`` per client address, and
    ``global_attempts`` from all addresses together (so many addresses do not multiply the
    guessing rate without bound); the table of addresses keeps at most ``max_clients``."""

    def __init__(
        self,
        *,
        attempts: int = 10,
        global_attempts: int = 100,
        window_s: float = 60.0,
        max_clients: int = 10_000,
        clock: Clock = time.monotonic,
    ) -> None:
        self.attempts = attempts
        self.global_attempts = global_attempts
        self.window_s = window_s
        self.max_clients = max_clients
        self.clock = clock
        self._clients: OrderedDict[str, deque[float]] = OrderedDict()
        self._all: deque[float] = deque()

    def _trim(self, times: deque[float], now: float) -> None:
        while times and now - times[0] >= self.window_s:
            times.popleft()

    def allowed(self, client: str) -> bool:
        """May this address try to sign in now?"""
        now = self.clock()
        self._trim(self._all, now)
        if len(self._all) >= self.global_attempts:
            return False
        times = self._clients.get(client)
        if times is None:
            return True
        self._trim(times, now)
        return len(times) < self.attempts

    def failed(self, client: str) -> None:
        now = self.clock()
        self._all.append(now)
        self._trim(self._all, now)
        times = self._clients.pop(client, None) or deque()
        times.append(now)
        self._trim(times, now)
        self._clients[client] = times
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
