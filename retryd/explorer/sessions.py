"""Explorer sessions: what an API token is exchanged for at sign-in (pure logic, injected clock).

A session remembers who signed in (the token's id and scope, never the token), its CSRF token
and two times: it ends ``idle_s`` after its last request, and ``max_s`` after sign-in whatever
happens. The session id in the cookie is a 256-bit random secret; the store keeps only its
SHA-256 digest, so a memory dump or a log of the store's keys gives nobody a usable cookie.

The store is bounded twice, so that holding a valid token never lets anyone sign the holders
of other tokens out: each token keeps at most ``max_per_token`` sessions (signing in once more
replaces that token's own least recently used session), and all tokens together at most
``max_sessions``. When every slot is taken by live sessions of other tokens a sign-in is
refused (``SessionsFull``) rather than ending somebody else's session; expired sessions are
always dropped first. ``per_token_share`` gives each token an equal share of ``max_sessions``,
so with the configured tokens the store cannot fill up unless there are more tokens than
``max_sessions``.

Failed sign-ins are counted per client address and in all (``LoginThrottle``). The throttle
only ever answers failures: a valid token is checked first and signs in however many failures
came before it, from its address or any other, so a flood of wrong tokens cannot lock anybody
out. What the throttle bounds is the cost of failures (log lines, the 429 tells clients to back
off); guessing is hopeless anyway because every token has at least 32 bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import math
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
    EXPIRED = "expired"  # idle or absolute expiry passed, or replaced by a newer sign-in


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


class SessionsFull(Exception):
    """Every session slot is taken by a live session of another token: the sign-in is refused
    (other people's sessions are never ended to make room). ``retry_after_s``: when the first
    of them expires at the latest."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("every explorer session is in use")
        self.retry_after_s = retry_after_s


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", errors="replace")).digest()


def per_token_share(max_sessions: int, tokens: int) -> int:
    """Each token's equal share of the store (at least one session), so the tokens' sessions
    together fit in ``max_sessions`` and no token can take another's slots."""
    return max(1, max_sessions // max(1, tokens))


class SessionStore:
    """In-memory sessions of one sidecar process (a restart signs everybody out)."""

    def __init__(
        self,
        *,
        idle_s: float,
        max_s: float,
        max_sessions: int,
        max_per_token: int | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.idle_s = idle_s
        self.max_s = max_s
        self.max_sessions = max_sessions
        self.max_per_token = min(max_per_token or max_sessions, max_sessions)
        self.clock = clock
        # Digest -> session, least recently used first.
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()
        # Token id -> digests of its sessions, least recently used first (at most one entry
        # per configured token: only valid tokens get sessions).
        self._by_token: dict[str, OrderedDict[bytes, None]] = {}
        # Digests of sessions that ended lately, so the sign-in page can say so (bounded).
        self._expired: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def count(self, token_id: str) -> int:
        return len(self._by_token.get(token_id, ()))

    def create(self, token_id: str, scope: str) -> tuple[str, Session]:
        """A new session: ``(cookie value, session)``. Replaces the token's own least recently
        used session when the token has its share, or when the store is full and the token
        has any; raises ``SessionsFull`` when the store is full of other tokens' sessions."""
        now = self.clock()
        self._sweep(now)
        own = self._by_token.get(token_id)
        while own and len(own) >= self.max_per_token:
            self._expire(next(iter(own)))
        if len(self._sessions) >= self.max_sessions:
            self._sweep_all(now)  # an expired session anywhere frees a slot first
        if len(self._sessions) >= self.max_sessions:
            if not own:
                raise SessionsFull(self._first_expiry(now))
            self._expire(next(iter(own)))
        session_id = secrets.token_urlsafe(32)
        session = Session(token_id, scope, secrets.token_urlsafe(32), now, now)
        key = _digest(session_id)
        self._sessions[key] = session
        self._by_token.setdefault(token_id, OrderedDict())[key] = None
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
        self._by_token[session.token_id].move_to_end(key)
        return session, Lookup.OK

    def end(self, session_id: str | None) -> None:
        if session_id and len(session_id) <= 256:
            self._remove(_digest(session_id))

    def _is_expired(self, session: Session, now: float) -> bool:
        return now - session.last_seen >= self.idle_s or now - session.created >= self.max_s

    def _remove(self, key: bytes) -> None:
        session = self._sessions.pop(key, None)
        if session is None:
            return
        own = self._by_token.get(session.token_id)
        if own is not None:
            own.pop(key, None)
            if not own:
                del self._by_token[session.token_id]

    def _expire(self, key: bytes) -> None:
        """End a session so that its cookie still tells the sign-in page it ended."""
        self._remove(key)
        self._expired[key] = None
        while len(self._expired) > self.max_sessions:
            self._expired.popitem(last=False)

    def _sweep(self, now: float) -> None:
        """Drop expired sessions from the least recently used end (those idle longest)."""
        for key, session in list(self._sessions.items()):
            if not self._is_expired(session, now):
                break  # the rest were used more recently still
            self._expire(key)

    def _sweep_all(self, now: float) -> None:
        """Every expired session, also those ended by ``max_s`` while in use (only when the
        store is full: one pass over at most ``max_sessions``)."""
        for key, session in list(self._sessions.items()):
            if self._is_expired(session, now):
                self._expire(key)

    def _first_expiry(self, now: float) -> float:
        ends = (
            min(s.last_seen + self.idle_s, s.created + self.max_s) for s in self._sessions.values()
        )
        return max(0.0, min(ends, default=now) - now)


def csrf_ok(session: Session, given: str | None) -> bool:
    """Constant-time comparison of a request's CSRF token with the session's."""
    if not given or len(given) > 256:
        return False
    return hmac.compare_digest(session.csrf.encode(), given.encode("utf-8", errors="replace"))


@dataclass(frozen=True)
class Failure:
    """What one failed sign-in gets. ``wait_s``: 0 when it is within the limits (answer 401),
    else how long the client should wait (answer 429 with Retry-After); ``limit``: which limit
    it passed (``peer``, ``all`` or ``""``); ``audit``: whether it gets an audit line (every
    failure within the limits, and the first one past a limit in a window, so a flood writes
    a bounded number of lines)."""

    wait_s: float
    limit: str
    audit: bool

    @property
    def retry_after(self) -> str:
        return str(max(1, math.ceil(self.wait_s)))


@dataclass
class _Peer:
    times: deque[float]
    noted: bool = False


class LoginThrottle:
    """Failed sign-ins: at most ``attempts`` per ``window_s`` per client address, and
    ``global_attempts`` from all addresses together (many addresses do not multiply the rate
    without bound); failures past a limit are answered 429 (``Failure``). It is asked only
    after the token was found invalid: valid tokens never meet it.

    Memory is bounded: each address keeps at most ``attempts`` times (failures past the limit
    are not recorded, so a flood does not keep growing a window), all together at most
    ``global_attempts``, and the table keeps at most ``max_clients`` addresses."""

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
        self._clients: OrderedDict[str, _Peer] = OrderedDict()
        self._all: deque[float] = deque()
        self._all_noted = False

    def _trim(self, times: deque[float], now: float) -> None:
        while times and now - times[0] >= self.window_s:
            times.popleft()

    def _wait(self, times: deque[float], now: float) -> float:
        return self.window_s - (now - times[0])

    def failed(self, client: str) -> Failure:
        """Count a failed sign-in of ``client`` (when within the limits) and say how to
        answer it."""
        now = self.clock()
        self._trim(self._all, now)
        peer = self._clients.pop(client, None)
        if peer is not None:
            self._trim(peer.times, now)
        peer_full = peer is not None and len(peer.times) >= self.attempts
        all_full = len(self._all) >= self.global_attempts
        if not peer_full and not all_full:
            peer = peer or _Peer(deque())
            peer.times.append(now)
            peer.noted = False
            self._all.append(now)
            self._all_noted = False
            self._keep(client, peer)
            return Failure(0.0, "", True)
        wait = 0.0
        if peer is not None:
            if peer_full:
                wait = self._wait(peer.times, now)
            self._keep(client, peer)
        if all_full:
            wait = max(wait, self._wait(self._all, now))
        if peer_full:
            assert peer is not None
            audit, peer.noted = not peer.noted, True
            return Failure(wait, "peer", audit)
        audit, self._all_noted = not self._all_noted, True
        return Failure(wait, "all", audit)

    def _keep(self, client: str, peer: _Peer) -> None:
        if peer.times:
            self._clients[client] = peer  # most recently failed last
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
