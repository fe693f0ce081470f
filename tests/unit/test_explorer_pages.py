"""The explorer's pages on the real app (FastAPI's TestClient, no broker: only the pages that
do not read Kafka), with real credentials. The pages over real HTTP against a real sidecar
and broker: tests/integration/test_explorer_http.py; in a browser: tests/browser/."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from retryd.api.app import create_app
from retryd.config import Settings, load_settings
from retryd.explorer.security import SECURITY_HEADERS
from retryd.metrics.http import HTTP_REQUESTS

READ_TOKEN = "r" * 40
REPLAY_TOKEN = "p" * 40


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RETRYD_"):
            monkeypatch.delenv(name)


def settings_for(tmp_path: Path, **over: object) -> Settings:
    values: dict[str, object] = {
        "bootstrap_servers": "127.0.0.1:1",  # never contacted by these pages
        "main_topics": "orders",
        "group_id": "checkout",
        "state_dir": tmp_path / "state",
        "api_tokens": f"viewer:read:{READ_TOKEN},operator:replay:{REPLAY_TOKEN}",
    }
    values.update(over)
    return load_settings(**values)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    # Not entered as a context manager: the lifespan (lag monitor, Kafka) does not start.
    yield TestClient(create_app(settings_for(tmp_path)), follow_redirects=False)


def login_csrf(client: TestClient) -> str:
    """The sign-in form's CSRF token (its pre-session cookie stays in the client)."""
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/login").text)
    assert found is not None
    return found.group(1)


def post_login(client: TestClient, token: str, **extra: str) -> httpx.Response:
    return client.post("/ui/login", data={"token": token, "csrf": login_csrf(client), **extra})


def sign_in(client: TestClient, token: str) -> str:
    r = post_login(client, token, next="/ui/jobs")
    assert r.status_code == 303 and r.headers["location"] == "/ui/jobs"
    page = client.get("/ui/jobs")
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def assert_headers(r: object) -> None:
    headers = r.headers  # type: ignore[attr-defined]
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, name


def test_every_ui_answer_has_the_security_headers(client: TestClient) -> None:
    for path in ("/ui/login", "/ui/", "/ui/jobs", "/ui/nowhere", "/ui/static/explorer.css"):
        assert_headers(client.get(path))
    assert_headers(client.post("/ui/login", data={"token": "x"}))
    assert_headers(post_login(client, "x"))
    assert "content-security-policy" not in client.get("/healthz").headers


def test_pages_need_a_session_and_say_where_to_come_back(client: TestClient) -> None:
    r = client.get("/ui/dead-letters?dead_reason=exhausted&key=a%20b")
    assert r.status_code == 303
    assert r.headers["location"] == (
        "/ui/login?next=/ui/dead-letters%3Fdead_reason%3Dexhausted%26key%3Da%2520b"
    )
    login = client.get(r.headers["location"])
    assert 'value="/ui/dead-letters?dead_reason=exhausted&amp;key=a%20b"' in login.text
    assert 'id="login-notice"' not in login.text
    client.cookies.set("retryd_session", "forged")
    forged = client.get("/ui/jobs")
    assert forged.status_code == 303 and "expired" not in forged.headers["location"]
    # every page: the route never runs without a session (no broker is reached here)
    for path in ("/ui/", "/ui/dead-letters", "/ui/dead-letters/0/1", "/ui/jobs", "/ui/jobs/j-1"):
        r = client.get(path)
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login"), path
        assert_headers(r)
        assert client.head(path).status_code == 303, path
    assert client.head("/ui/login").status_code == 200


def test_sign_in_sets_a_strict_http_only_cookie_and_never_echoes_the_token(
    client: TestClient,
) -> None:
    r = post_login(client, REPLAY_TOKEN)
    assert r.status_code == 303 and r.headers["location"] == "/ui/"
    cookies = r.headers.get_list("set-cookie")
    (cookie,) = [c for c in cookies if c.startswith("retryd_session=")]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui;" in cookie
    assert "Secure" not in cookie
    # The sign-in form's cookie is dropped once signed in.
    (form_cookie,) = [c for c in cookies if c.startswith("retryd_login=")]
    assert "Max-Age=0" in form_cookie and "Path=/ui/login" in form_cookie
    page = client.get("/ui/jobs")
    assert page.status_code == 200 and 'id="nav"' in page.text
    assert "operator (replay)" in page.text and REPLAY_TOKEN not in page.text
    other = TestClient(client.app, follow_redirects=False)  # a browser without the session
    wrong = post_login(other, READ_TOKEN[:-1] + "x")
    assert wrong.status_code == 401 and READ_TOKEN[:-1] not in wrong.text
    assert "Sign-in failed: the token is not valid." in wrong.text
    assert "retryd_session" not in wrong.headers.get("set-cookie", "")


def test_secure_cookie_when_the_sidecar_serves_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    app = create_app(settings_for(tmp_path, sidecar_tls_cert_file=cert, sidecar_tls_key_file=key))
    c = TestClient(app, base_url="https://testserver", follow_redirects=False)
    form = c.get("/ui/login")
    assert "Secure" in form.headers["set-cookie"]  # the sign-in form's cookie too
    r = post_login(c, READ_TOKEN)
    assert all("Secure" in v for v in r.headers.get_list("set-cookie"))


def test_sign_out_needs_csrf_and_ends_the_session(client: TestClient) -> None:
    csrf = sign_in(client, READ_TOKEN)
    assert client.post("/ui/logout", data={}).status_code == 403
    assert client.get("/ui/jobs").status_code == 200
    r = client.post("/ui/logout", data={"csrf": csrf})
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert client.get("/ui/jobs").status_code == 303


def test_read_scope_cannot_act(client: TestClient) -> None:
    csrf = sign_in(client, READ_TOKEN)
    for path in ("/ui/replay/dry-run", "/ui/replay", "/ui/jobs/job-x/cancel"):
        r = client.post(path, data={"csrf": csrf, "mode": "filter"})
        assert r.status_code == 403 and 'id="forbidden"' in r.text, path
        assert "scope read" in r.text


def test_csrf_and_origin_are_checked_before_anything_else(client: TestClient) -> None:
    csrf = sign_in(client, REPLAY_TOKEN)
    form = {"mode": "one", "record": "0:0"}
    for data, headers in (
        (form, {}),
        ({**form, "csrf": csrf + "x"}, {}),
        ({**form, "csrf": csrf}, {"Origin": "http://evil.example"}),
        ({**form, "csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
    ):
        r = client.post("/ui/replay", data=data, headers=headers)
        assert r.status_code == 403 and 'id="forbidden"' in r.text
    bad = client.post("/ui/replay", data={"csrf": csrf, "mode": "one", "record": "x"})
    assert bad.status_code == 400 and "partition:offset" in bad.text
    two = client.post("/ui/replay", data={"csrf": csrf, "mode": "one", "record": ["0:1", "0:2"]})
    assert two.status_code == 400
    other = client.post("/ui/replay", data={"csrf": csrf, "mode": "filter", "topic": "secrets"})
    assert other.status_code == 400 and "not a dead-letter topic" in other.text


def test_failed_sign_ins_are_throttled_but_a_valid_token_still_signs_in(
    client: TestClient,
) -> None:
    for _ in range(10):
        assert post_login(client, "y" * 40).status_code == 401
    r = post_login(client, "y" * 40)
    assert r.status_code == 429 and "too many sign-ins have failed" in r.text
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert post_login(client, REPLAY_TOKEN).status_code == 303
    assert post_login(client, "y" * 40).status_code == 429


def test_sign_in_needs_the_forms_csrf_token_and_this_origin(client: TestClient) -> None:
    csrf = login_csrf(client)
    for data, headers in (
        ({"token": REPLAY_TOKEN}, {}),
        ({"token": REPLAY_TOKEN, "csrf": csrf + "x"}, {}),
        ({"token": REPLAY_TOKEN, "csrf": csrf}, {"Origin": "null"}),
        ({"token": REPLAY_TOKEN, "csrf": csrf}, {"Origin": "http://evil.example"}),
        ({"token": REPLAY_TOKEN, "csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
    ):
        r = client.post("/ui/login", data=data, headers=headers)
        assert r.status_code == 403 and 'id="login-error"' in r.text, (data, headers)
        assert "retryd_session" not in r.headers.get("set-cookie", "")
    same = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    r = client.post("/ui/login", data={"token": REPLAY_TOKEN, "csrf": csrf}, headers=same)
    assert r.status_code == 303


def test_without_tokens_the_explorer_is_disabled(tmp_path: Path) -> None:
    app = create_app(settings_for(tmp_path, api_tokens=""))
    c = TestClient(app, follow_redirects=False)
    assert c.get("/ui/login").status_code == 503
    assert c.post("/ui/login", data={"token": REPLAY_TOKEN}).status_code == 503
    assert "retryd_login" not in c.get("/ui/login").headers.get("set-cookie", "")


def test_jobs_pages_and_progress(client: TestClient) -> None:
    assert client.get("/ui/jobs/job-x/progress").status_code == 401
    sign_in(client, READ_TOKEN)
    assert 'id="jobs"' in client.get("/ui/jobs").text
    missing = client.get("/ui/jobs/job-x")
    assert missing.status_code == 404
    assert client.get("/ui/jobs/job-x/progress").json()["error"] == "not_found"


def test_static_files_are_only_ours(client: TestClient) -> None:
    js = client.get("/ui/static/explorer.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/static/explorer.css").headers["content-type"].startswith("text/css")
    assert client.get("/ui/static/..%2Fweb.py").status_code == 404
    assert client.get("/ui/static/other.js").status_code == 404


def test_ui_routes_are_not_in_the_api_schema_and_have_bounded_route_labels(
    client: TestClient,
) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/ui")]
    client.get("/ui/jobs/some-random-id-123/progress")
    client.get("/ui/static/explorer.js")
    labels = {
        s.labels["route"] for m in HTTP_REQUESTS.collect() for s in m.samples if "route" in s.labels
    }
    assert "/ui/jobs/{job_id}/progress" in labels and "/ui/static/{name}" in labels
    assert not [label for label in labels if "some-random-id" in label]
