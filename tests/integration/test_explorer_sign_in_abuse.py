"""Abuse of the explorer's sign-in over real HTTP against a real `retryd sidecar` process:
floods of wrong tokens from many addresses and from one, one token signing in again and again,
a full session store, and sign-ins without the form's CSRF token, with ``Origin: null`` or
from another site. Every test runs its own sidecar (fresh topics, group and state dir), so the
throttle and the session store start empty.

Client addresses: Linux routes all of 127.0.0.0/8 to the loopback interface, so a client
bound to 127.0.0.<n> is a distinct peer to the sidecar listening on 127.0.0.1 (uvicorn trusts
X-Forwarded-For only from 127.0.0.1, so these addresses are what the throttle counts)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.sidecar_support import TOKEN, Env, SidecarProcess
from tests.support import wait_for

READ_TOKEN = "sign-in-abuse-read-token-0123456789abcdef"
REPLAY_TOKEN = "sign-in-abuse-replay-token-0123456789abcd"
WRONG = "not-a-configured-token-0123456789abcdefgh"
TOKENS = f"viewer:read:{READ_TOKEN},operator:replay:{REPLAY_TOKEN}"  # and TOKEN: 3 in all
SECRETS = (READ_TOKEN, REPLAY_TOKEN, TOKEN, WRONG)


def start(bootstrap: str, tmp_path: Path, **extra: str) -> SidecarProcess:
    env = Env(bootstrap, tmp_path / "state", extra={"RETRYD_API_TOKENS": TOKENS, **extra})
    env.create(failed_partitions=1, main_partitions=1)
    return SidecarProcess(env, tmp_path / "sidecar.log").start()


@pytest.fixture
def sidecar(bootstrap: str, tmp_path: Path) -> Iterator[SidecarProcess]:
    proc = start(bootstrap, tmp_path)
    try:
        yield proc
    finally:
        proc.stop()
    assert_no_secret_in(proc.log_path)


def assert_no_secret_in(log: Path) -> None:
    text = log.read_text()
    assert not [s for s in SECRETS if s in text], "a token reached the log"


def peer(sidecar: SidecarProcess, n: int) -> httpx.Client:
    """A browser at client address 127.0.0.<n>."""
    transport = httpx.HTTPTransport(local_address=f"127.0.0.{n}")
    return httpx.Client(
        base_url=sidecar.url, transport=transport, timeout=30, follow_redirects=False
    )


def login_csrf(client: httpx.Client) -> str:
    """Opens the sign-in page (its cookie stays in the client) and returns the form's token."""
    page = client.get("/ui/login")
    assert page.status_code == 200
    return csrf_of(page.text)


def csrf_of(text: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', text)
    assert found is not None, "no csrf field"
    return found.group(1)


def login_error(text: str) -> str:
    found = re.search(r'id="login-error"[^>]*>([^<]*)<', text)
    assert found is not None, "no sign-in error shown"
    return found.group(1)


def post_login(client: httpx.Client, token: str, csrf: str, **headers: str) -> httpx.Response:
    return client.post("/ui/login", data={"token": token, "csrf": csrf}, headers=headers)


def signed_in(client: httpx.Client) -> bool:
    """Whether the client's session cookie still opens a page."""
    return client.get("/ui/jobs").status_code == 200


def session_cookie_set(r: httpx.Response) -> bool:
    return any(v.startswith("retryd_session=") for v in r.headers.get_list("set-cookie"))


def auth_failures(sidecar: SidecarProcess) -> dict[str, float]:
    text = httpx.get(sidecar.url + "/metrics", timeout=10).text
    return {
        s.labels["reason"]: s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "retryd_http_auth_failures"
        for s in fam.samples
        if s.name.endswith("_total")
    }


def audit_lines(sidecar: SidecarProcess, event: str) -> list[str]:
    return [line for line in sidecar.log_path.read_text().splitlines() if f" {event} " in line]


def test_a_flood_of_failures_from_many_peers_does_not_lock_out_a_valid_token(
    sidecar: SidecarProcess,
) -> None:
    """200 wrong tokens from 20 addresses: the first 100 get 401, the rest 429 (the limit of
    all addresses together); a valid token then signs in from a new address and from one of
    the flooding ones, while a wrong one is still refused with 429."""
    statuses: list[int] = []
    for n in range(10, 30):
        with peer(sidecar, n) as c:
            csrf = login_csrf(c)
            for _ in range(10):
                r = post_login(c, WRONG, csrf)
                statuses.append(r.status_code)
                assert not session_cookie_set(r)
                if r.status_code == 429:
                    assert 1 <= int(r.headers["retry-after"]) <= 60
                    assert "too many sign-ins have failed" in login_error(r.text)
    assert statuses == [401] * 100 + [429] * 100
    with peer(sidecar, 200) as fresh:
        r = post_login(fresh, REPLAY_TOKEN, login_csrf(fresh))
        assert r.status_code == 303 and session_cookie_set(r)
        assert signed_in(fresh)
    with peer(sidecar, 10) as flooder:  # 10 failures of its own, and the global limit
        csrf = login_csrf(flooder)
        assert post_login(flooder, READ_TOKEN, csrf).status_code == 303
        assert signed_in(flooder)
    with peer(sidecar, 201) as other:
        r = post_login(other, WRONG, login_csrf(other))
        assert r.status_code == 429 and "retry-after" in r.headers
    assert auth_failures(sidecar)["invalid_token"] == 201
    # Audited, in bounded lines: each failure within the limits, and the first one past them.
    assert len(wait_for(lambda: audit_lines(sidecar, "ui_sign_in_failed"), 10)) == 100
    (throttled,) = audit_lines(sidecar, "ui_sign_in_throttled")
    assert "peer=127.0.0.20 reason=invalid_token limit=all" in throttled
    assert len(audit_lines(sidecar, "ui_sign_in")) == 2


def test_a_throttled_peer_with_a_valid_token_signs_in(sidecar: SidecarProcess) -> None:
    with peer(sidecar, 7) as c, peer(sidecar, 8) as neighbour:
        csrf = login_csrf(c)
        assert [post_login(c, WRONG, csrf).status_code for _ in range(10)] == [401] * 10
        refused = post_login(c, WRONG, csrf)
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        # The same address, throttled: a valid token still signs in...
        ok = post_login(c, READ_TOKEN, csrf)
        assert ok.status_code == 303 and session_cookie_set(ok) and signed_in(c)
        # ...and that does not lift the throttle for the next wrong one.
        assert post_login(c, WRONG, login_csrf(c)).status_code == 429
        # Another address is not throttled by this one's failures.
        assert post_login(neighbour, WRONG, login_csrf(neighbour)).status_code == 401
    (throttled,) = audit_lines(sidecar, "ui_sign_in_throttled")
    assert "peer=127.0.0.7 reason=invalid_token limit=peer" in throttled


def test_one_token_signing_in_again_and_again_never_ends_another_tokens_session(
    bootstrap: str, tmp_path: Path
) -> None:
    """explorer_max_sessions=6 and 3 tokens: each token holds at most 2 sessions. 11 sign-ins
    with one token replace its own oldest sessions; the other token's session still works."""
    proc = start(bootstrap, tmp_path, RETRYD_EXPLORER_MAX_SESSIONS="6")
    clients: list[httpx.Client] = []
    try:
        viewer = peer(proc, 1)
        clients.append(viewer)
        assert post_login(viewer, READ_TOKEN, login_csrf(viewer)).status_code == 303
        operators = []
        for _ in range(6 + 5):
            c = peer(proc, 1)
            clients.append(c)
            assert post_login(c, REPLAY_TOKEN, login_csrf(c)).status_code == 303
            operators.append(c)
            assert signed_in(viewer)
        assert [signed_in(c) for c in operators] == [False] * 9 + [True] * 2
        # The latest replaced session is told apart from a forged cookie: "sign in again".
        gone = operators[8].get("/ui/jobs")
        assert gone.status_code == 303 and "expired=1" in gone.headers["location"]
    finally:
        for c in clients:
            c.close()
        proc.stop()
    assert_no_secret_in(proc.log_path)


def test_a_full_store_refuses_a_new_sign_in_instead_of_ending_others_sessions(
    bootstrap: str, tmp_path: Path
) -> None:
    """explorer_max_sessions=2 and 3 tokens: one session each, and the third token is
    refused (503, Retry-After, a sentence on the page) while the other two hold theirs."""
    proc = start(bootstrap, tmp_path, RETRYD_EXPLORER_MAX_SESSIONS="2")
    try:
        with peer(proc, 1) as viewer, peer(proc, 1) as operator, peer(proc, 1) as third:
            assert post_login(viewer, READ_TOKEN, login_csrf(viewer)).status_code == 303
            assert post_login(operator, REPLAY_TOKEN, login_csrf(operator)).status_code == 303
            refused = post_login(third, TOKEN, login_csrf(third))
            assert refused.status_code == 503 and not session_cookie_set(refused)
            assert "all 2 explorer sessions are in use" in login_error(refused.text)
            assert int(refused.headers["retry-after"]) >= 1
            assert signed_in(viewer) and signed_in(operator)
            # A token that holds a session replaces its own.
            with peer(proc, 1) as again:
                assert post_login(again, READ_TOKEN, login_csrf(again)).status_code == 303
                assert signed_in(again) and signed_in(operator) and not signed_in(viewer)
        log = proc.log_path.read_text()
        assert "3 API tokens but explorer_max_sessions is 2" in log
        assert "ui_sign_in_refused actor=sha256:" in log and "reason=sessions_full" in log
    finally:
        proc.stop()
    assert_no_secret_in(proc.log_path)


def test_sign_in_needs_the_forms_csrf_token_bound_to_this_browser(
    sidecar: SidecarProcess,
) -> None:
    """Login CSRF: another site cannot sign the victim's browser in to its own session."""
    with peer(sidecar, 1) as victim, peer(sidecar, 1) as attacker:
        page = victim.get("/ui/login")
        (cookie,) = page.headers.get_list("set-cookie")
        flags = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert cookie.startswith("retryd_login=")
        assert {"httponly", "samesite=strict", "path=/ui/login"} <= flags
        csrf = csrf_of(page.text)
        assert victim.get("/ui/login").headers.get("set-cookie") is None  # kept, not renewed
        attackers_csrf = login_csrf(attacker)  # a pair the attacker fetched for itself
        for form in (
            {"token": REPLAY_TOKEN},
            {"token": REPLAY_TOKEN, "csrf": ""},
            {"token": REPLAY_TOKEN, "csrf": csrf[:-2] + "xx"},
            {"token": REPLAY_TOKEN, "csrf": attackers_csrf},
        ):
            r = victim.post("/ui/login", data=form)
            assert r.status_code == 403 and not session_cookie_set(r), form
            assert "Sign-in refused" in login_error(r.text)
            csrf_of(r.text)  # the refusal offers a working form again
        with peer(sidecar, 1) as cookieless:  # the field without the cookie it was made for
            for form in ({"token": REPLAY_TOKEN}, {"token": REPLAY_TOKEN, "csrf": csrf}):
                r = cookieless.post("/ui/login", data=form)
                assert r.status_code == 403 and not session_cookie_set(r)
                cookieless.cookies.clear()  # the refusal gave it a form cookie of its own
        assert not signed_in(victim)
        ok = post_login(victim, REPLAY_TOKEN, csrf)
        assert ok.status_code == 303 and signed_in(victim)
        assert "retryd_login=" in ok.headers.get("set-cookie", "")  # dropped once signed in
    # No token was even checked: nothing counts as a failed sign-in.
    assert auth_failures(sidecar).get("invalid_token", 0) == 0


def test_origin_null_and_cross_site_posts_are_refused(sidecar: SidecarProcess) -> None:
    """For the sign-in and for every other POST alike; the sidecar's own origin passes."""
    own = {"Origin": sidecar.url, "Sec-Fetch-Site": "same-origin"}
    with peer(sidecar, 1) as c:
        csrf = login_csrf(c)
        for headers in (
            {"Origin": "null"},
            {"Origin": "null", "Sec-Fetch-Site": "same-origin"},
            {"Origin": "https://evil.example"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site", "Origin": sidecar.url},
        ):
            r = post_login(c, REPLAY_TOKEN, csrf, **headers)
            assert r.status_code == 403 and not session_cookie_set(r), headers
            assert login_error(r.text) == "Sign-in refused: the form was sent from another site."
        assert post_login(c, REPLAY_TOKEN, csrf, **own).status_code == 303
        session_csrf = csrf_of(c.get("/ui/jobs").text)
        for headers in ({"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"}):
            r = c.post("/ui/logout", data={"csrf": session_csrf}, headers=headers)
            assert r.status_code == 403 and 'id="forbidden"' in r.text, headers
            assert signed_in(c)
        r = c.post("/ui/logout", data={"csrf": session_csrf}, headers=own)
        assert r.status_code == 303 and not signed_in(c)
