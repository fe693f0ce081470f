"""The explorer's browser-facing defences (pure logic): response headers, the same-origin check
of state-changing requests, and where a sign-in may send the browser next.

Every ``/ui`` answer carries a Content-Security-Policy that allows only the sidecar's own
script and stylesheet (no inline script or style, no framing, no foreign connections), and is
never cached. A POST is accepted only with the session's CSRF token (``sessions.csrf_ok``) and,
when the browser says where the request comes from (``Origin``, ``Sec-Fetch-Site``), only from
the sidecar's own origin: SameSite=Strict cookies already keep most cross-site requests
session-less, these checks cover the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
COOKIE = "retryd_session"
COOKIE_PATH = "/ui"
UI_PREFIX = "/ui"
MAX_NEXT_CHARS = 2048


def is_ui(path: str) -> bool:
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


def same_origin(headers: Mapping[str, str], scheme: str) -> bool:
    """False when the browser says the request comes from another site.

    ``Sec-Fetch-Site`` decides when present (same-origin or none pass). Otherwise an ``Origin``
    must be this sidecar's ``scheme://Host``; ``Origin: null`` is what browsers send for every
    form POST of a page with ``Referrer-Policy: no-referrer`` (ours), so it tells nothing and
    passes, as do clients that send neither header (curl, test clients): the CSRF token and
    the SameSite=Strict cookie are still required of all of them."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site.lower() in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is None or origin == "null":
        return True
    host = headers.get("host")
    if not host:
        return False
    parts = urlsplit(origin)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return False
    return parts.scheme.lower() == scheme.lower() and parts.netloc.lower() == host.lower()


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
