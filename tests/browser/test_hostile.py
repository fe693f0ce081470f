"""Dead letters that carry markup, direction overrides, a 1 MB value and bytes that are not
UTF-8 (in keys, values, header names and values, error classes and messages) are listed and
opened in a real browser, and nothing they carry runs, loads, opens a dialog or breaks the
page's width.

Most checks run with the Content-Security-Policy bypassed (``bypass_csp``): the escaping alone
must keep the pages inert, the policy is the second line. One pass runs with the policy on and
asserts the browser reported no violation (a violation means markup got through escaping).
"""

from __future__ import annotations

from typing import Any

from tests.browser.conftest import (
    ONE_MB,
    PHONE,
    REPLAY_TOKEN,
    SCRIPT,
    Explorer,
    Tab,
    artifacts_dir,
    layout_fits,
    sign_in,
)

RLO = "\u202e"
# What a page may show of one value: the explorer's preview bound (64 KiB) with room for the
# pretty-printing and hex layout around it; a 1 MB value must not reach the page whole.
PAYLOAD_SHOWN_MAX = 4 * 64 * 1024

INJECTED = """() => ({
  handlers: document.querySelectorAll(
    '[onerror],[onload],[onclick],[onmouseover],[onfocus],[onanimationstart]').length,
  images: [...document.images].map(i => i.getAttribute('src')),
  inlineScripts: [...document.scripts].filter(s => !s.src).length,
  foreignScripts: [...document.scripts].filter(
    s => s.src && new URL(s.src).origin !== location.origin).length,
  svgs: [...document.querySelectorAll('svg')].filter(s => !s.classList.contains('sparkline'))
    .length,
  rlo: document.body.innerText.includes('\u202e'),
})"""


def assert_no_markup(page: Any, where: str) -> None:
    """No element a record's bytes could have made: handlers, images, inline or foreign
    scripts, stray SVG; and no raw right-to-left override in the visible text."""
    found = page.evaluate(INJECTED)
    assert found["handlers"] == 0, (where, found)
    assert found["images"] == [], (where, found)
    assert found["inlineScripts"] == 0, (where, found)
    assert found["foreignScripts"] == 0, (where, found)
    assert found["svgs"] == 0, (where, found)
    assert found["rlo"] is False, (where, "a raw U+202E reached the page's text")


def record_url(explorer: Explorer, partition: int, offset: int) -> str:
    return f"{explorer.url}/dead-letters/{partition}/{offset}?topic={explorer.env.failed}"


def test_hostile_records_listed_inert(explorer: Explorer, open_tab: Any) -> None:
    for viewport, csp in (({"width": 1280, "height": 800}, False), (PHONE, True)):
        tab: Tab = open_tab(viewport, bypass_csp=not csp)
        page = tab.page
        sign_in(page, explorer.url, REPLAY_TOKEN)
        assert page.is_visible("section#overview")  # error classes and messages are listed here
        assert_no_markup(page, "overview")
        assert layout_fits(page), f"overview wider than {viewport}"
        page.goto(explorer.url + "/dead-letters?original_topic=" + explorer.env.main)
        rows = page.locator("table#records tr.record")
        shown = {
            (int(r.get_attribute("data-partition")), int(r.get_attribute("data-offset")))
            for r in rows.all()
        }
        for rec in explorer.hostile:
            assert (rec.partition, rec.offset) in shown, f"{rec.name} not listed"
        assert_no_markup(page, "browse")
        assert layout_fits(page), f"browse page wider than {viewport}"
        # The markup is shown as text.
        assert SCRIPT in page.inner_text("table#records")
        tab.guard.assert_inert(page)


def test_hostile_records_opened_inert(explorer: Explorer, open_tab: Any) -> None:
    tab: Tab = open_tab(bypass_csp=True)
    page = tab.page
    sign_in(page, explorer.url, REPLAY_TOKEN)
    for rec in explorer.hostile:
        response = page.goto(record_url(explorer, rec.partition, rec.offset))
        assert response.status == 200, (rec.name, response.status)
        assert page.is_visible("section#record"), rec.name
        page.screenshot(path=str(artifacts_dir() / f"hostile-record-{rec.name}.png"))
        assert_no_markup(page, rec.name)
        assert layout_fits(page), f"the page of {rec.name} is wider than the viewport"
        payload = page.inner_text("pre#payload")
        assert len(payload) <= PAYLOAD_SHOWN_MAX, (rec.name, len(payload))
        headers_text = page.inner_text("table#headers")
        if rec.name == "script-key":
            assert SCRIPT in page.inner_text("#record-key")
        if rec.name == "rtl-key":
            key = page.inner_text("#record-key")
            assert "\\u202e" in key, key  # shown as a visible escape
        if rec.name == "markup-headers":
            assert SCRIPT in headers_text and "\\u202e" in headers_text
        if rec.name == "one-mb":
            assert page.is_visible("#payload-truncated")
            size = page.inner_text("#payload-size").replace(",", "").replace(" ", "")
            assert str(ONE_MB) in size, size
            assert len(payload) < ONE_MB // 4
        if rec.name == "not-utf8":
            assert "c3 28 a0 a1" in page.inner_text("#record-key"), "key not shown as hex"
            assert "c3 28 a0 a1" in headers_text.replace("\n", " "), headers_text
            # x-bin: all 256 byte values, shown as hex
            assert "00 01 02 03" in headers_text, headers_text
    tab.guard.assert_inert(page)
    # The copy-as-curl block never holds the real token.
    assert REPLAY_TOKEN not in page.content()

    # The widest of them on a phone: long unbroken text wraps, tables scroll in their box.
    phone: Tab = open_tab(PHONE, bypass_csp=True)
    sign_in(phone.page, explorer.url, REPLAY_TOKEN)
    for name in ("long-line", "one-mb", "markup-headers", "not-utf8"):
        rec = explorer.record(name)
        phone.page.goto(record_url(explorer, rec.partition, rec.offset))
        assert phone.page.is_visible("section#record"), name
        assert layout_fits(phone.page), f"the page of {name} is wider than a phone"
        assert_no_markup(phone.page, name)
    phone.guard.assert_inert(phone.page)


def test_the_guard_sees_injected_markup(explorer: Explorer, open_tab: Any) -> None:
    """The checks above would see a payload that got through: markup put into a page the way a
    broken template would put it runs, hits the canary and loads ``x``."""
    tab: Tab = open_tab(bypass_csp=True)
    page = tab.page
    page.goto(explorer.url + "/login")
    page.evaluate(
        """(markup) => { document.querySelector('main').innerHTML += markup; }""",
        '<img src=x onerror="window.__pwned=1">',
    )
    page.wait_for_function("window.__pwnedHits.length > 0")
    assert tab.guard.pwned(page) == ["1"]
    found = page.evaluate(INJECTED)
    assert found["handlers"] == 1 and found["images"] == ["x"]
    page.wait_for_function(
        "performance.getEntriesByType('resource').some(e => /\\/x$/.test(e.name))"
    )
    assert any(url.endswith("/x") for url in tab.guard.stray_requests), tab.guard.stray_requests
