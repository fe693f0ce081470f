"""Signing in to the explorer in a real browser: a wrong token, a read-only token, an expired
session, the session cookie's flags, CSRF (of the sign-in too), signing out."""

from __future__ import annotations

from typing import Any

from tests.browser.conftest import (
    READ_TOKEN,
    REPLAY_TOKEN,
    SESSION_MAX_S,
    Explorer,
    Tab,
    sign_in,
)
from tests.support import wait_for

COOKIE = "retryd_session"
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


def session_cookies(page: Any) -> list[dict[str, Any]]:
    return [c for c in page.context.cookies() if c["name"] == COOKIE]


def post_form(page: Any, action: str, fields: dict[str, str]) -> Any:
    """Submit a form the page never offered, as a user with the browser's devtools could: the
    browser sends the session cookie and its own Origin. Returns the navigation's response."""
    with page.expect_navigation() as nav:
        page.evaluate(
            """([action, fields]) => {
                const form = document.createElement('form');
                form.method = 'post';
                form.action = action;
                for (const [name, value] of Object.entries(fields)) {
                    const input = document.createElement('input');
                    input.type = 'hidden';
                    input.name = name;
                    input.value = value;
                    form.appendChild(input);
                }
                document.body.appendChild(form);
                form.submit();
            }""",
            [action, fields],
        )
    return nav.value


def csrf_of(page: Any) -> str:
    """The session's CSRF token, as every form of the page carries it (the sign-out form too)."""
    value: str = page.get_attribute("form#logout input[name=csrf]", "value")
    assert value, "the sign-out form carries no csrf field"
    return value


def test_wrong_token_is_refused_without_a_cookie(explorer: Explorer, tab: Tab) -> None:
    page = tab.page
    page.goto(explorer.url + "/dead-letters")
    assert "/ui/login" in page.url and "next=" in page.url, page.url
    wrong = "not-the-token-" + "x" * 32
    page.fill("input#token", wrong)
    with page.expect_navigation() as nav:
        page.click("button#sign-in")
    assert nav.value.status == 401
    assert page.inner_text("#login-error").strip() == "Sign-in failed: the token is not valid."
    assert session_cookies(page) == []
    assert wrong not in page.content()
    # Still signed out: every page sends the browser back to the sign-in form.
    page.goto(explorer.url + "/")
    assert "/ui/login" in page.url
    assert page.is_visible("form#login")


def test_session_cookie_flags_headers_and_sign_out(explorer: Explorer, tab: Tab) -> None:
    page = tab.page
    sign_in(page, explorer.url, REPLAY_TOKEN, next_path="/ui/dead-letters")
    assert page.url.startswith(explorer.url + "/dead-letters"), page.url
    (cookie,) = session_cookies(page)
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/ui"
    assert cookie["secure"] is False  # plain HTTP here; Secure when the sidecar serves TLS
    assert COOKIE not in page.evaluate("document.cookie")  # HttpOnly: no script reads it
    assert REPLAY_TOKEN not in page.content()

    response = page.goto(explorer.url + "/")
    assert response.status == 200
    assert page.is_visible("section#overview")
    headers = response.headers
    for name, expected in SECURITY_HEADERS.items():
        assert expected in headers.get(name, ""), (name, headers.get(name))

    # A form POST without the session's CSRF token is refused.
    response = post_form(page, explorer.url + "/replay/dry-run", {"csrf": "forged"})
    assert response.status == 403, response.status

    page.goto(explorer.url + "/")
    with page.expect_navigation():
        page.click("form#logout button")
    assert "/ui/login" in page.url
    page.goto(explorer.url + "/dead-letters")
    assert "/ui/login" in page.url and page.is_visible("form#login")
    # Signing out ended the session on the server: the old cookie, put back, opens nothing.
    page.context.add_cookies([cookie])
    page.goto(explorer.url + "/dead-letters")
    assert "/ui/login" in page.url and page.is_visible("form#login")


def test_read_only_token_browses_but_cannot_act(explorer: Explorer, tab: Tab) -> None:
    page = tab.page
    # A ``next`` that leaves the explorer is not followed: the overview instead.
    sign_in(page, explorer.url, READ_TOKEN, next_path="//evil.example/ui/")
    assert page.url.rstrip("/") == explorer.url, page.url
    assert page.is_visible("section#overview")
    csrf = csrf_of(page)

    page.goto(explorer.url + "/dead-letters")
    assert page.locator("table#records tr.record").count() > 0
    for act in ("input.select-record", "form#replay-selected", "form#replay-filter"):
        assert page.locator(act).count() == 0, f"{act} shown to a read-only session"

    with page.expect_navigation():
        page.locator("a.record-link").first.click()
    assert page.is_visible("section#record")
    assert page.locator("form#replay-one").count() == 0

    # Acting anyway, with a valid CSRF token: forbidden by scope.
    partition, offset = explorer.record("ord-4400").coordinates
    for action in ("/replay/dry-run", "/replay"):
        response = post_form(
            page,
            explorer.url + action,
            {
                "csrf": csrf,
                "mode": "one",
                "record": f"{partition}:{offset}",
                "topic": explorer.env.failed,
            },
        )
        assert response.status == 403, (action, response.status)
        assert page.is_visible("#forbidden"), page.content()[:2000]


def test_expired_session_returns_to_sign_in_with_notice(
    sidecars: dict[str, Explorer], tab: Tab
) -> None:
    """A sidecar whose sessions end ``SESSION_MAX_S`` after sign-in, however busy they are."""
    expiring = sidecars["expiring"]
    page = tab.page
    sign_in(page, expiring.url, READ_TOKEN)
    assert page.is_visible("section#overview")

    def expired() -> bool:
        page.goto(expiring.url + "/dead-letters")
        return "/ui/login" in page.url

    wait_for(expired, SESSION_MAX_S + 15, 0.5, "the session to expire")
    assert page.inner_text("#login-notice").strip() == "Your session expired; sign in again."
    # Signing in again goes back where the user was.
    page.fill("input#token", READ_TOKEN)
    with page.expect_navigation():
        page.click("button#sign-in")
    assert page.url.startswith(expiring.url + "/dead-letters"), page.url


def test_cross_site_form_cannot_act(explorer: Explorer, open_tab: Any) -> None:
    """A page of another site (``localhost`` is another site than ``127.0.0.1``) that submits a
    replay form to the explorer, even one holding the victim's CSRF token: the browser sends no
    session cookie (SameSite=Strict), so nothing is replayed and the answer is the sign-in."""
    tab: Tab = open_tab(bypass_csp=True)  # the attacker's page sets no policy of its own
    page = tab.page
    sign_in(page, explorer.url, REPLAY_TOKEN)
    csrf = csrf_of(page)
    with explorer.sidecar.client() as api:
        jobs_before = len(api.get("/v1/replays").json()["jobs"])
        partition, offset = explorer.record("ord-4401").coordinates
        page.goto(f"http://localhost:{explorer.sidecar.port}/ui/login")
        post_form(
            page,
            explorer.url + "/replay",
            {"csrf": csrf, "mode": "one", "record": f"{partition}:{offset}"},
        )
        assert "/ui/login" in page.url, page.url
        assert len(api.get("/v1/replays").json()["jobs"]) == jobs_before
        assert api.get(f"/v1/failed/{partition}/{offset}").json()["replayed"] is None


def test_another_site_cannot_sign_the_browser_in(explorer: Explorer, open_tab: Any) -> None:
    """Login CSRF: a page of another site (``localhost``) posts a sign-in form with the
    attacker's token to the explorer, with a form token it fetched for itself, in a browser
    that has the explorer's sign-in page open. Refused (403), and no session cookie is set."""
    tab: Tab = open_tab(bypass_csp=True)  # the attacker's page sets no policy of its own
    page = tab.page
    page.goto(explorer.url + "/login")
    (form_cookie,) = [c for c in page.context.cookies() if c["name"] == "retryd_login"]
    assert form_cookie["httpOnly"] is True and form_cookie["sameSite"] == "Strict"
    assert form_cookie["path"] == "/ui/login"
    page.goto(f"http://localhost:{explorer.sidecar.port}/ui/login")
    attackers_csrf = page.get_attribute("form#login input[name=csrf]", "value")
    assert attackers_csrf
    response = post_form(
        page, explorer.url + "/login", {"token": READ_TOKEN, "csrf": attackers_csrf}
    )
    assert response.status == 403, response.status
    assert "another site" in page.inner_text("#login-error")
    assert session_cookies(page) == []
    # The browser's own sign-in still works.
    sign_in(page, explorer.url, READ_TOKEN)
    assert page.is_visible("section#overview") and len(session_cookies(page)) == 1
