"""The explorer's browser-facing defences (pure logic): response headers, the same-origin check
of state-changing requests, the sign-in form's CSRF token, and where a sign-in may send the
browser next.

Every ``/ui`` answer carries a Content-Security-Policy that allows only the sidecar's own
script and stylesheet (no inline script or style, no framing, no foreign connections), and is
never cached. Every POST, the sign-in included, needs a CSRF token (the session's,
``sessions.csrf_ok``; before a session exists the sign-in form's, ``LoginForms``) and is
refused when the browser says it comes from anywhere but the sidecar's own origin
(``same_origin``). SameSite=Strict cookies already keep most cross-site requests cookie-less;
these checks cover the rest.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# ``same-origin``, not ``no-referrer``: with ``no-referrer`` browsers send ``Origin: null`` on
# our own form POSTs, and ``null`` is also what a sandboxed frame or a ``data:`` page of an
# attacker sends, so it could not be refused. Other sites still get no Referer at all.
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
COOKIE = "retryd_session"
COOKIE_PATH = "/ui"
LOGIN_COOKIE = "retryd_login"
LOGIN_COOKIE_PATH = "/ui/login"
UI_PREFIX = "/ui"
MAX_NEXT_CHARS = 2048
LOGIN_FORM_MAX_S = 3600.0  # a sign-in form left open longer is refused (and replaced)
_LOGIN_CONTEXT = b"retryd-explorer-login-form\x00"


def is_ui(path: str) -> bool:
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


def same_origin(headers: Mapping[str, str], scheme: str) -> bool:
    """False when the browser says the request comes from anywhere but this sidecar.

    Both signals are checked when present: ``Sec-Fetch-Site`` must be ``same-origin`` (or
    ``none``: the user's own navigation), and ``Origin`` must be this sidecar's
    ``scheme://Host``. ``Origin: null`` (a sandboxed frame, a ``data:`` or ``file:`` page, a
    redirect across sites) is refused: our pages' referrer policy makes browsers send the real
    origin. A client that sends neither header (curl, test clients) passes here; it still
    needs the CSRF token, which only a page of this sidecar gives it."""
    site = headers.get("sec-fetch-site")
    if site is not None and site.lower() not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin is None:
        return True
    host = headers.get("host")
    if origin == "null" or not host:
        return False
    parts = urlsplit(origin)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return False
    return parts.scheme.lower() == scheme.lower() and parts.netloc.lower() == host.lower()


class LoginForms:
    """The sign-in form's CSRF token: a signed double-submit token bound to the browser.

    The threat is login CSRF: another site makes the victim's browser sign in with the
    attacker's token, so what the victim then does is done (and seen) in the attacker's
    session. ``GET /ui/login`` gives the browser a random pre-session cookie
    (``LOGIN_COOKIE``: HttpOnly, SameSite=Strict, only for ``/ui/login``) and the form a
    hidden field holding the HMAC of that cookie under a key that never leaves the process.
    A sign-in needs both, matching: another site can neither read nor send the victim's
    cookie, and a pair it fetched for itself does not match the victim's cookie. Nothing is
    kept per visitor (the sign-in page is public, so it must not grow server state), and the
    cookie carries its issue time: a pair is good for ``max_age_s``, and until the process
    restarts (the key is new each start)."""

    def __init__(
        self,
        key: bytes | None = None,
        *,
        max_age_s: float = LOGIN_FORM_MAX_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._key = key or secrets.token_bytes(32)
        self.max_age_s = max_age_s
        self.clock = clock

    def _mac(self, cookie: str) -> str:
        mac = hmac.new(
            self._key, _LOGIN_CONTEXT + cookie.encode("utf-8", "replace"), hashlib.sha256
        ).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def _age(self, cookie: str | None) -> float | None:
        """Seconds since ``cookie`` was issued, or None when it is not one of ours."""
        if not cookie or len(cookie) > 128:
            return None
        issued, dot, nonce = cookie.partition(".")
        if not dot or not (issued.isascii() and issued.isdigit()) or len(nonce) < 32:
            return None
        return self.clock() - int(issued) / 1000

    def issue(self, cookie: str | None) -> tuple[str, str]:
        """``(cookie, form token)`` for a sign-in form: the browser's cookie when it is still
        good for at least half its life (several tabs share one), else a new one."""
        age = self._age(cookie)
        if cookie is None or age is None or not 0 <= age < self.max_age_s / 2:
            cookie = f"{int(self.clock() * 1000)}.{secrets.token_urlsafe(32)}"
        return cookie, self._mac(cookie)

    def check(self, cookie: str | None, given: str | None) -> bool:
        """Whether a sign-in carries a fresh cookie of ours and the form token made for it
        (compared in constant time)."""
        age = self._age(cookie)
        if cookie is None or age is None or not 0 <= age < self.max_age_s:
            return False
        if not given or len(given) > 128:
            return False
        return hmac.compare_digest(self._mac(cookie).encode(), given.encode("utf-8", "replace"))


def safe_next(target: str | None) -> str:
    """Where to go after sign-in: ``target`` when it is a plain path under /ui on this site
    (no scheme, no host, no ``//``, no backslash, no control character), else ``/ui/``."""
    default = UI_PREFIX + "/"
    if not target or len(target) > MAX_NEXT_CHARS:
        return default
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in target) or "\\" in target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or target.startswith("//"):
        return default
    path = parts.path
    if not is_ui(path) or "/../" in path + "/" or "/./" in path + "/":
        return default
    return target


def client_address(scope_client: tuple[str, int] | None) -> str:
    """The peer address the login throttle counts (the proxy's, behind one)."""
    return scope_client[0] if scope_client else "unknown"
