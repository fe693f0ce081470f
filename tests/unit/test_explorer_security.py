"""The explorer's headers, same-origin check, the sign-in form's CSRF token, sign-in redirect
targets and filters (pure)."""

from __future__ import annotations

import pytest

from retryd.explorer.filters import FilterProblem, UiFilter, instant, read_records
from retryd.explorer.security import CSP, SECURITY_HEADERS, LoginForms, safe_next, same_origin

NOW = 1_700_000_000_000
HOST = {"host": "retryd.example:8080"}


def test_the_policy_allows_only_our_own_script_and_style() -> None:
    assert "script-src 'self'" in CSP and "'unsafe-inline'" not in CSP
    assert "frame-ancestors 'none'" in CSP and "default-src 'none'" in CSP
    assert SECURITY_HEADERS["Cache-Control"] == "no-store"
    assert SECURITY_HEADERS["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ({}, True),  # curl: the CSRF token still decides
        ({"origin": "null"}, False),  # a sandboxed frame, a data: page
        ({"origin": "http://retryd.example:8080"}, True),
        ({"origin": "HTTP://RETRYD.EXAMPLE:8080"}, True),
        ({"origin": "https://retryd.example:8080"}, False),  # other scheme
        ({"origin": "http://evil.example"}, False),
        ({"origin": "http://retryd.example:8080.evil.example"}, False),
        ({"origin": "http://retryd.example:8080/path"}, False),
        ({"sec-fetch-site": "same-origin", "origin": "http://retryd.example:8080"}, True),
        ({"sec-fetch-site": "same-origin", "origin": "null"}, False),  # both are checked
        ({"sec-fetch-site": "same-origin", "origin": "http://evil.example"}, False),
        ({"sec-fetch-site": "none"}, True),
        ({"sec-fetch-site": "cross-site", "origin": "http://retryd.example:8080"}, False),
        ({"sec-fetch-site": "cross-site"}, False),
        ({"sec-fetch-site": "same-site"}, False),
    ],
)
def test_same_origin(headers: dict[str, str], ok: bool) -> None:
    assert same_origin({**HOST, **headers}, "http") is ok


def test_an_origin_without_a_host_is_refused() -> None:
    assert not same_origin({"origin": "http://a"}, "http")


def test_our_pages_make_browsers_send_their_real_origin() -> None:
    """With ``no-referrer`` a browser sends ``Origin: null`` on our own form POSTs."""
    assert SECURITY_HEADERS["Referrer-Policy"] == "same-origin"


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def test_the_sign_in_forms_token_is_bound_to_the_browsers_cookie() -> None:
    clock = Clock()
    forms = LoginForms(max_age_s=600, clock=clock)
    cookie, token = forms.issue(None)
    assert forms.check(cookie, token)
    assert forms.issue(cookie) == (cookie, token)  # a second tab shares the pair
    other_cookie, other_token = forms.issue(None)  # what an attacker fetches for itself
    assert other_cookie != cookie and other_token != token
    assert not forms.check(cookie, other_token)  # the attacker's field, the victim's cookie
    assert not forms.check(None, token) and not forms.check(cookie, None)
    assert not forms.check(cookie, "") and not forms.check(cookie, token[:-1])
    assert not forms.check(cookie + "x", token)
    # Another process (another key) never accepts it.
    assert not LoginForms(clock=clock).check(cookie, token)


def test_a_sign_in_form_expires_and_is_renewed_after_half_its_life() -> None:
    clock = Clock()
    forms = LoginForms(max_age_s=600, clock=clock)
    cookie, token = forms.issue(None)
    clock.now += 299
    assert forms.issue(cookie)[0] == cookie
    clock.now += 2
    renewed, renewed_token = forms.issue(cookie)
    assert renewed != cookie and forms.check(renewed, renewed_token)
    assert forms.check(cookie, token)  # the first pair is still good...
    clock.now += 300
    assert not forms.check(cookie, token)  # ...for max_age_s
    clock.now -= 10_000
    assert not forms.check(renewed, renewed_token)  # issued "in the future": not ours


@pytest.mark.parametrize(
    "cookie",
    ["", "x" * 200, "nodot", "abc.def", "\u00b2.x" + "a" * 40, "12.short", "-5." + "a" * 40],
)
def test_forged_sign_in_cookies_are_refused(cookie: str) -> None:
    forms = LoginForms(clock=Clock())
    assert not forms.check(cookie, "anything")
    fresh, token = forms.issue(cookie)
    assert fresh != cookie and forms.check(fresh, token)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (None, "/ui/"),
        ("/ui/dead-letters?dead_reason=exhausted", "/ui/dead-letters?dead_reason=exhausted"),
        ("/ui/jobs/job-1", "/ui/jobs/job-1"),
        ("https://evil.example/ui/", "/ui/"),
        ("//evil.example/ui/", "/ui/"),
        ("/\\evil.example", "/ui/"),
        ("/ui/../v1/failed", "/ui/"),
        ("/v1/replays", "/ui/"),
        ("/uix", "/ui/"),
        ("javascript:alert(1)", "/ui/"),
        ("/ui/\r\nSet-Cookie: x=1", "/ui/"),
        ("/ui/" + "a" * 5000, "/ui/"),
    ],
)
def test_sign_in_sends_the_browser_only_under_ui(target: str | None, expected: str) -> None:
    assert safe_next(target) == expected


def test_filters_read_from_a_form() -> None:
    uf = UiFilter.read(
        {"dead_reason": ["exhausted"], "key": [" spaced key "], "since": [" -1h "], "x": ["y"]}
    )
    assert uf.dead_reason == "exhausted" and uf.key == " spaced key " and uf.since == "-1h"
    flt = uf.to_filter(NOW)
    assert flt.since_ms == NOW - 3_600_000 and flt.key == b" spaced key "
    assert dict(uf.items())["since"] == "-1h"
    assert "dead_reason=exhausted" in uf.query(cursor="abc")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("-30m", NOW - 1_800_000),
        ("-2d", NOW - 2 * 86_400_000),
        ("2h ago", NOW - 7_200_000),
        ("1700000000000", 1_700_000_000_000),
        ("2023-11-14T22:13:20Z", 1_700_000_000_000),
    ],
)
def test_time_forms(text: str, expected: int) -> None:
    assert instant("since", text, NOW) == expected


@pytest.mark.parametrize(
    "values",
    [
        {"since": ["yesterday"]},
        {"until": ["12345678901234567890"]},
        {"dead_reason": ["<script>"]},
        {"fingerprint": ["not hex!"]},
        {"error_class": ["x" * 2000]},
    ],
)
def test_bad_filters_are_refused_by_field(values: dict[str, list[str]]) -> None:
    with pytest.raises(FilterProblem) as err:
        UiFilter.read(values).to_filter(NOW)
    assert "<script>" not in str(err.value) and "x" * 100 not in str(err.value)


def test_selections() -> None:
    assert read_records(["0:5", "1:7", "0:5"]) == {(0, 5), (1, 7)}
    for bad in ([], ["0:x"], ["-1:2"], ["0:1:2"], [f"0:{i}" for i in range(501)]):
        with pytest.raises(FilterProblem):
            read_records(bad)


def test_binary_keys_are_filtered_by_base64() -> None:
    flt = UiFilter.read({"key_base64": ["/+4A"]}).to_filter(NOW)
    assert flt.key == b"\xff\xee\x00" and not flt.nothing
    both = UiFilter.read({"key": ["a"], "key_base64": ["Yg=="]}).to_filter(NOW)
    assert both.nothing  # two different keys: nothing matches (as the API)
    with pytest.raises(FilterProblem, match="base64"):
        UiFilter.read({"key_base64": ["not base64!"]}).to_filter(NOW)
