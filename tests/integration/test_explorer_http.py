"""The dead-letter explorer (/ui) over real HTTP against a real `retryd sidecar` process and the
real broker: sign-in and session cookie, security headers, scopes, CSRF, session expiry,
browsing with filters and cursors, the record page, dry runs, replays (one, selected, by
filter) landing in the main topic through the API's job manager, and the audit trail.
The pages' behaviour in a real browser: tests/browser/."""

from __future__ import annotations

import base64
import html
import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from retryd.explorer.security import CSP
from tests.integration.sidecar_support import Env, SidecarProcess, failed_headers, seed, wait_job
from tests.support import read_topic, wait_for

READ_TOKEN = "explorer-read-token-0123456789abcdefgh"
REPLAY_TOKEN = "explorer-replay-token-0123456789abcdef"
TOKENS = f"viewer:read:{READ_TOKEN},operator:replay:{REPLAY_TOKEN}"
N = 12  # plain dead letters; every third one non_retryable, the others exhausted
HOSTILE_KEY = b"<script>alert('k')</script>\xe2\x80\xaeevil"
HOSTILE_HEADER = b'"><img src=x onerror=alert(1)>'
BIG = 300_000
SECURITY = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


@pytest.fixture(scope="module")
def deployment(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Env:
    env = Env(
        bootstrap,
        tmp_path_factory.mktemp("explorer") / "state",
        extra={"RETRYD_API_TOKENS": TOKENS},
    )
    env.create(failed_partitions=2, main_partitions=1)
    for i in range(N):
        headers = failed_headers(
            env.main,
            error_class="ValueError" if i % 2 else "TimeoutError",
            dead_reason="non_retryable" if i % 3 == 0 else "exhausted",
            original_offset=i,
            retry_number=2,
        )
        seed(
            bootstrap,
            env.failed,
            [(f"k{i}".encode(), json.dumps({"i": i}).encode(), headers)],
            i % 2,
        )
    hostile = failed_headers(
        env.main,
        error_class="HostileError",
        user=[("note", HOSTILE_HEADER), ("rtl", "a\u202eb".encode()), ("bin", b"\xff\x00\xfe")],
    )
    seed(bootstrap, env.failed, [(HOSTILE_KEY, b"\xff\xfe\x00\x01invalid utf-8", hostile)], 0)
    big = failed_headers(env.main, error_class="BigError")
    seed(bootstrap, env.failed, [(b"big", b"y" * BIG, big)], 1)
    return env


@pytest.fixture(scope="module")
def sidecar(deployment: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    log = tmp_path_factory.mktemp("explorer-log") / "sidecar.log"
    proc = SidecarProcess(deployment, log).start()
    try:
        yield proc
    finally:
        proc.stop()


def browser(sidecar: SidecarProcess) -> httpx.Client:
    return httpx.Client(base_url=sidecar.url, timeout=60, follow_redirects=False)


def login_csrf(client: httpx.Client) -> str:
    """The sign-in form's CSRF token; its pre-session cookie stays in the client."""
    return csrf_of(client.get("/ui/login").text)


def sign_in(client: httpx.Client, token: str) -> str:
    """Signs in and returns the session's CSRF token (from the sign-out form)."""
    form = {"token": token, "next": "/ui/jobs", "csrf": login_csrf(client)}
    r = client.post("/ui/login", data=form)
    assert r.status_code == 303, r.text
    page = client.get("/ui/jobs")
    assert page.status_code == 200
    return csrf_of(page.text)


def csrf_of(text: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', text)
    assert found is not None
    return found.group(1)


def rows_of(text: str) -> list[tuple[int, int]]:
    return [
        (int(p), int(o)) for p, o in re.findall(r'data-partition="(\d+)" data-offset="(\d+)"', text)
    ]


def element_text(text: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)<', text, re.S)
    assert found is not None, f"#{element_id} missing"
    return html.unescape(found.group(1)).strip()


def assert_secure(r: httpx.Response) -> None:
    for name, value in SECURITY.items():
        assert r.headers.get(name) == value, (r.url, name, r.headers.get(name))
    assert READ_TOKEN not in r.text and REPLAY_TOKEN not in r.text


def test_sign_in_cookie_and_security_headers(sidecar: SidecarProcess) -> None:
    with browser(sidecar) as c:
        r = c.get("/ui/dead-letters?dead_reason=exhausted")
        assert r.status_code == 303
        assert r.headers["location"].startswith("/ui/login?next=/ui/dead-letters")
        assert_secure(r)
        login = c.get("/ui/login")
        assert login.status_code == 200 and 'id="login"' in login.text
        assert_secure(login)
        csrf = csrf_of(login.text)
        wrong = c.post("/ui/login", data={"token": "not-a-valid-token-" * 3, "csrf": csrf})
        assert wrong.status_code == 401
        assert element_text(wrong.text, "login-error") == "Sign-in failed: the token is not valid."
        ok = c.post(
            "/ui/login",
            data={"token": REPLAY_TOKEN, "next": "https://evil.example/", "csrf": csrf},
        )
        assert ok.status_code == 303 and ok.headers["location"] == "/ui/"
        (cookie,) = [
            v for v in ok.headers.get_list("set-cookie") if v.startswith("retryd_session=")
        ]
        assert cookie.startswith("retryd_session=")
        flags = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/ui"} <= flags
        assert "secure" not in flags  # plain HTTP here; Secure when the sidecar serves TLS
        for path in ("/ui/", "/ui/dead-letters", "/ui/jobs", "/ui/static/explorer.js"):
            page = c.get(path)
            assert page.status_code == 200, (path, page.text[-500:])
            assert_secure(page)
            head = c.head(path)  # the same answer without its body
            assert head.status_code == 200 and head.content == b"", path
            assert head.headers["content-type"] == page.headers["content-type"]
            assert_secure(head)
        overview = c.get("/ui/").text
        for element in ("by-reason", "by-fingerprint", "tiers", "workers-alive", "jobs-running"):
            assert f'id="{element}"' in overview, element
        assert "svg" in overview and 'class="sparkline"' in overview
        # the totals: N + 2 dead letters in failed_topic, none replayed yet at this point
        assert re.search(rf"\b{N + 2} records in the topic", overview)
        # Each fingerprint links to the dead letters it counts.
        counted = re.findall(
            r'href="([^"]*fingerprint=[0-9a-f]+)">[0-9a-f]+</a></td>\s*<td class="wrap">.*?</td>'
            r"\s*<td>(\d+)</td>",
            overview,
            re.S,
        )
        assert len(counted) == 4  # ValueError, TimeoutError, HostileError, BigError
        assert sum(int(n) for _, n in counted) == N + 2
        for link, n in counted:
            listed = c.get(html.unescape(link) + "&limit=200")
            assert len(rows_of(listed.text)) == int(n), link
        out = c.post("/ui/logout", data={"csrf": csrf_of(c.get("/ui/jobs").text)})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert c.get("/ui/jobs").status_code == 303


def test_browse_newest_first_with_filters_and_cursor(sidecar: SidecarProcess) -> None:
    with browser(sidecar) as c:
        sign_in(c, READ_TOKEN)
        seen: list[tuple[int, int]] = []
        url = "/ui/dead-letters?limit=5"  # 3 pages
        times: list[str] = []
        pages = 0
        while url:
            page = c.get(url)
            assert page.status_code == 200, page.text[-800:]
            seen += rows_of(page.text)
            times += re.findall(r'<td class="nowrap">([^<]+)</td>', page.text)
            found = re.search(r'id="next-page" href="([^"]+)"', page.text)
            url = html.unescape(found.group(1)) if found else ""
            pages += 1
            assert pages < 10
        assert len(seen) == len(set(seen)) == N + 2 and pages == 3
        instants = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in times]
        assert instants == sorted(instants, reverse=True)  # newest first
        reasons = c.get("/ui/dead-letters", params={"dead_reason": "non_retryable"})
        assert len(rows_of(reasons.text)) == len([i for i in range(N) if i % 3 == 0])
        by_class = c.get("/ui/dead-letters", params={"error_class": "ValueError", "since": "-1h"})
        assert len(rows_of(by_class.text)) == N // 2
        by_key = c.get("/ui/dead-letters", params={"key": "k3"})
        assert len(rows_of(by_key.text)) == 1
        binary_key = base64.b64encode(HOSTILE_KEY).decode()
        by_binary_key = c.get("/ui/dead-letters", params={"key_base64": binary_key})
        assert len(rows_of(by_binary_key.text)) == 1
        none = c.get("/ui/dead-letters", params={"until": "-1h"})
        assert rows_of(none.text) == []
        bad = c.get("/ui/dead-letters", params={"since": "yesterday-ish"})
        assert bad.status_code == 400 and 'id="filter-error"' in bad.text
        # A read-only session sees no act controls.
        assert "select-record" not in reasons.text and 'id="replay-filter"' not in reasons.text


def test_record_page_decodes_headers_and_renders_hostile_content_inert(
    sidecar: SidecarProcess,
) -> None:
    with browser(sidecar) as c:
        sign_in(c, REPLAY_TOKEN)
        listed = c.get("/ui/dead-letters", params={"error_class": "HostileError"})
        ((p, o),) = rows_of(listed.text)
        r = c.get(f"/ui/dead-letters/{p}/{o}")
        assert r.status_code == 200
        assert_secure(r)
        body = r.text
        assert "<script>alert" not in body and "<img src=x" not in body
        assert "&lt;script&gt;alert" in body and "&lt;img src=x onerror=alert(1)&gt;" in body
        assert "\u202e" not in body and "\\u202e" in body  # the RTL override shown, inert
        assert "ff fe 00 01" in element_text(body, "payload")  # invalid UTF-8: hex
        assert "ff 00 fe" in body  # a binary header value as hex
        for label in ("Retry number", "Original coordinates", "Error class", "Dead reason"):
            assert label in body, label
        curl = element_text(body, "copy-curl")
        assert "$RETRYD_TOKEN" in curl and f"/v1/failed/{p}/{o}/replay" in curl
        assert 'id="replay-one"' in body
        big = c.get("/ui/dead-letters", params={"error_class": "BigError"})
        ((bp, bo),) = rows_of(big.text)
        page = c.get(f"/ui/dead-letters/{bp}/{bo}")
        assert element_text(page.text, "payload-size") == f"{BIG} bytes"
        assert 'id="payload-truncated"' in page.text
        assert len(page.content) < BIG  # cut at the bound
        ((kp, ko),) = rows_of(c.get("/ui/dead-letters", params={"key": "k3"}).text)
        pretty = c.get(f"/ui/dead-letters/{kp}/{ko}")
        assert element_text(pretty.text, "payload") == '{\n  "i": 3\n}'
        assert element_text(pretty.text, "record-key") == "k3"


def test_read_scope_cannot_act_and_csrf_and_origin_are_checked(sidecar: SidecarProcess) -> None:
    form = {"mode": "filter", "error_class": "ValueError"}
    with browser(sidecar) as reader:
        csrf = sign_in(reader, READ_TOKEN)
        r = reader.post("/ui/replay/dry-run", data={**form, "csrf": csrf})
        assert r.status_code == 403 and 'id="forbidden"' in r.text
        assert_secure(r)
        assert reader.post("/ui/replay", data={**form, "csrf": csrf}).status_code == 403
    with browser(sidecar) as operator:
        csrf = sign_in(operator, REPLAY_TOKEN)
        assert operator.post("/ui/replay/dry-run", data=form).status_code == 403
        wrong = {**form, "csrf": csrf[:-2] + "xx"}
        assert operator.post("/ui/replay/dry-run", data=wrong).status_code == 403
        foreign = operator.post(
            "/ui/replay/dry-run",
            data={**form, "csrf": csrf},
            headers={"Origin": "https://evil.example"},
        )
        assert foreign.status_code == 403
    with httpx.Client(base_url=sidecar.url) as anon:
        r = anon.post("/ui/replay", data=form)
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")


def test_dry_run_then_replay_by_filter_through_the_job_manager(
    sidecar: SidecarProcess, deployment: Env
) -> None:
    with browser(sidecar) as c, sidecar.client(REPLAY_TOKEN) as api:
        csrf = sign_in(c, REPLAY_TOKEN)
        form = {"mode": "filter", "csrf": csrf, "dead_reason": "non_retryable", "since": "-1h"}
        dry = c.post("/ui/replay/dry-run", data=form)
        assert dry.status_code == 200, dry.text[-800:]
        expected = len([i for i in range(N) if i % 3 == 0])
        assert int(element_text(dry.text, "dry-run-count")) == expected
        assert len(re.findall(r'<tr class="sample">', dry.text)) == expected
        confirm = dict(
            re.findall(
                r'<input type="hidden" name="([^"]+)" value="([^"]*)">',
                dry.text.split('id="confirm-replay"')[1].split("</form>")[0],
            )
        )
        confirm = {k: html.unescape(v) for k, v in confirm.items()}
        started = c.post("/ui/replay", data=confirm)
        assert started.status_code == 303, started.text[-800:]
        job_id = started.headers["location"].rsplit("/", 1)[1]
        assert job_id in [j["id"] for j in api.get("/v1/replays").json()["jobs"]]
        done = wait_job(api, job_id)
        assert done["state"] == "completed" and done["replayed"] == expected
        assert done["requested_by"] == "operator"
        page = c.get(f"/ui/jobs/{job_id}")
        assert element_text(page.text, "job-state") == "done"
        assert element_text(page.text, "job-replayed") == str(expected)
        progress = c.get(f"/ui/jobs/{job_id}/progress").json()
        assert progress["finished"] and progress["replayed"] == expected
    copies = read_topic(deployment.bootstrap, deployment.main, expect=expected)
    assert len(copies) >= expected
    log = sidecar.log_path.read_text()
    assert f"job_created actor=operator job={job_id}" in log
    assert re.search(rf"replay actor=operator .*job={job_id}", log)


def test_replay_one_and_selected(sidecar: SidecarProcess, deployment: Env) -> None:
    with browser(sidecar) as c, sidecar.client(REPLAY_TOKEN) as api:
        csrf = sign_in(c, REPLAY_TOKEN)
        listed = rows_of(
            c.get(
                "/ui/dead-letters",
                params={"error_class": "TimeoutError", "dead_reason": "exhausted"},
            ).text
        )
        (p1, o1), (p2, o2), (p3, o3) = listed[:3]
        one = {"mode": "one", "csrf": csrf, "record": f"{p1}:{o1}"}
        dry = c.post("/ui/replay/dry-run", data=one)
        assert int(element_text(dry.text, "dry-run-count")) == 1
        r = c.post("/ui/replay", data=one)
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/jobs/one-")
        page = c.get(r.headers["location"])
        assert element_text(page.text, "job-state") == "done"
        again = c.post("/ui/replay", data=one)
        assert again.status_code == 409  # the API's ledger check: already replayed
        record = c.get(f"/ui/dead-letters/{p1}/{o1}")
        assert 'id="record-replayed"' in record.text
        listed_again = c.get("/ui/dead-letters", params={"error_class": "TimeoutError"}).text
        rows = re.findall(r'data-partition="(\d+)" data-offset="(\d+)".*?</tr>', listed_again, re.S)
        marked = re.findall(
            r'data-partition="(\d+)" data-offset="(\d+)"(?:(?!</tr>).)*class="replayed">yes<',
            listed_again,
            re.S,
        )
        assert rows and (str(p1), str(o1)) in marked and (str(p2), str(o2)) not in marked
        selected = {"mode": "selected", "csrf": csrf, "record": [f"{p2}:{o2}", f"{p3}:{o3}"]}
        dry = c.post("/ui/replay/dry-run", data=selected)
        assert int(element_text(dry.text, "dry-run-count")) == 2
        r = c.post("/ui/replay", data=selected)
        assert r.status_code == 303
        job_id = r.headers["location"].rsplit("/", 1)[1]
        done = wait_job(api, job_id)
        assert done["replayed"] == 2 and done["matched"] == 2
    log = sidecar.log_path.read_text()
    assert re.search(rf"replay actor=operator record={deployment.failed}/{p1}/{o1} ", log)


def test_a_slow_job_shows_progress_and_is_cancelled(sidecar: SidecarProcess) -> None:
    with browser(sidecar) as c, sidecar.client(REPLAY_TOKEN) as api:
        csrf = sign_in(c, REPLAY_TOKEN)
        form = {"mode": "filter", "csrf": csrf, "error_class": "ValueError"}
        form["dead_reason"] = "exhausted"  # 4 records no other test replays
        bad = c.post("/ui/replay", data={**form, "max_per_second": "0"})
        assert bad.status_code == 400
        r = c.post("/ui/replay", data={**form, "max_per_second": "1"})
        assert r.status_code == 303
        job_url = r.headers["location"]

        def replaying() -> dict[str, object] | None:
            p = c.get(job_url + "/progress").json()
            return p if p["replayed"] >= 1 else None

        wait_for(replaying, 30, 0.1, "the first record of the slow job")
        page = c.get(job_url)
        assert element_text(page.text, "job-state") == "running"
        assert 'id="cancel-job-button"' in page.text
        cancelled = c.post(job_url + "/cancel", data={"csrf": csrf})
        assert cancelled.status_code == 303
        job = api.get("/v1/replays/" + job_url.rsplit("/", 1)[1]).json()
        assert job["state"] == "cancelled" and 1 <= job["replayed"] < 4
        page = c.get(job_url)
        assert element_text(page.text, "job-state") == "cancelled"
        assert 'id="cancel-job"' not in page.text
    log = sidecar.log_path.read_text()
    assert f"job_cancelled actor=operator job={job['id']}" in log


def test_session_expires(deployment: Env, tmp_path: Path) -> None:
    """A session ends explorer_session_max_s after sign-in even while it is in use."""
    short = Env(
        deployment.bootstrap,
        tmp_path / "state",
        main=deployment.main,
        other=deployment.other,
        group=deployment.group,
        extra={"RETRYD_API_TOKENS": TOKENS, "RETRYD_EXPLORER_SESSION_MAX_S": "1.5"},
    )
    with SidecarProcess(short, tmp_path / "short.log") as proc, browser(proc) as c:
        signed_in_at = time.monotonic()
        sign_in(c, READ_TOKEN)

        def expired() -> httpx.Response | None:
            r = c.get("/ui/jobs")
            return r if r.status_code == 303 else None

        r = wait_for(expired, 20, 0.1, "the session to expire")
        assert time.monotonic() - signed_in_at >= 1.5
        assert "expired=1" in r.headers["location"]
        notice = c.get(r.headers["location"])
        assert element_text(notice.text, "login-notice") == "Your session expired; sign in again."
    assert READ_TOKEN not in (tmp_path / "short.log").read_text()


def test_tokens_never_reach_the_log(sidecar: SidecarProcess) -> None:
    log = sidecar.log_path.read_text()
    assert "ui_sign_in actor=operator scope=replay" in log
    assert READ_TOKEN not in log and REPLAY_TOKEN not in log
