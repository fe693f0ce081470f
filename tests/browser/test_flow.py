"""The explorer's main flow in a real browser, as an operator walks it: sign in, filter, open a
record, dry-run, replay it, watch the job finish, then replay everything the filter matches
and see the dead letters counted as replayed, not waiting; and the pages used with the keyboard
alone, at a desktop size and at a phone's width."""

from __future__ import annotations

import re
from typing import Any

from tests.browser.conftest import (
    DESKTOP,
    PHONE,
    REPLAY_TOKEN,
    Explorer,
    Tab,
    layout_fits,
    sign_in,
)
from tests.support import read_topic, wait_for

REASON = "malformed"  # realistic(): every 4th record, all from env.other


def number(text: str) -> int:
    found = re.search(r"\d[\d,]*", text)
    assert found, f"no number in {text!r}"
    return int(found.group().replace(",", ""))


def reason_count(page: Any, reason: str) -> int:
    """Dead letters waiting with ``reason`` in the overview's table of the failed topic (0 when
    the reason has no row)."""
    row = page.locator("table#by-reason tr", has=page.locator(f"text={reason}")).first
    if row.count() == 0:
        return 0
    cells = row.locator("td").all_inner_texts()
    return number(next(c for c in cells if re.fullmatch(r"\s*\d[\d,]*\+?\s*", c)))


def waiting(page: Any) -> int:
    """The failed topic's count of dead letters waiting (not replayed), as the overview says."""
    text = page.locator("section#overview section.dlt").first.inner_text()
    found = re.search(r"(\d[\d,]*) waiting", text)
    assert found, text
    return int(found.group(1).replace(",", ""))


def filter_by(page: Any, *, dead_reason: str, original_topic: str) -> None:
    page.select_option("form#filters select[name=dead_reason]", dead_reason)
    page.fill("form#filters input[name=original_topic]", original_topic)
    with page.expect_navigation():
        page.click("button#apply-filters")


def wait_done(page: Any, polls: list[str]) -> int:
    """The job page's script updates the state until the job is done (``polls`` collects its
    progress requests); returns the replayed count as the page shows it."""
    finished_at_load = page.get_attribute("section#job", "data-finished") == "true"
    page.wait_for_function(
        "() => document.querySelector('#job-state').textContent.trim() === 'done'",
        timeout=30_000,
    )
    if not finished_at_load:  # the script watched it: polled, then hid the cancel button
        assert polls, "the job page never asked for progress"
        assert page.get_attribute("section#job", "data-finished") == "true"
        assert not page.is_visible("button#cancel-job-button")
    assert number(page.inner_text("#job-errors")) == 0
    return number(page.inner_text("#job-replayed"))


def test_filter_open_dry_run_replay_and_watch(explorer: Explorer, tab: Tab) -> None:
    env = explorer.env
    page = tab.page
    polls: list[str] = []
    page.on("response", lambda r: polls.append(r.url) if r.url.endswith("/progress") else None)
    sign_in(page, explorer.url, REPLAY_TOKEN)
    assert reason_count(page, REASON) == 3
    total_before = waiting(page)

    page.click("a#nav-browse")
    page.wait_for_selector("form#filters")
    filter_by(page, dead_reason=REASON, original_topic=env.other)
    rows = page.locator("table#records tr.record")
    assert rows.count() == 3
    assert number(page.inner_text("#result-count")) == 3
    assert rows.locator("td.replayed").all_inner_texts() == ["", "", ""]

    # One record: open it, dry-run, confirm, watch.
    with page.expect_navigation():
        rows.first.locator("a.record-link").click()
    assert page.is_visible("section#record")
    # The page offers the same replay through the API, with a placeholder for the token.
    partition, offset = page.url.split("/dead-letters/")[1].split("?")[0].split("/")
    curl = page.inner_text("pre#copy-curl")
    assert "$RETRYD_TOKEN" in curl and REPLAY_TOKEN not in curl, curl
    assert f"/v1/failed/{partition}/{offset}/replay" in curl, curl
    with page.expect_navigation():
        page.click("button#replay-one-button")
    assert page.is_visible("section#dry-run")
    assert number(page.inner_text("#dry-run-count")) == 1
    with page.expect_navigation():
        page.click("button#confirm-replay-button")
    assert re.search(r"/ui/jobs/[\w-]+$", page.url), page.url
    assert wait_done(page, polls) == 1
    assert len(read_topic(explorer.sidecar.deployment.bootstrap, env.other)) == 1

    # Everything the filter matches: the dry run counts what a replay would do, and skips the
    # one replayed already (the replay ledger remembers it).
    page.goto(f"{explorer.url}/dead-letters?dead_reason={REASON}&original_topic={env.other}")
    with page.expect_navigation():
        page.click("button#replay-filter-button")
    assert page.is_visible("section#dry-run")
    assert number(page.inner_text("#dry-run-count")) == 2
    assert "3 matched, 1 skipped" in page.inner_text("section#dry-run")
    assert page.locator("table#dry-run-sample tr.sample").count() >= 2
    polls.clear()
    with page.expect_navigation() as nav:
        page.click("button#confirm-replay-button")
    # At one replay a second the job is still running when its page is rendered: the page
    # then watches it finish.
    at_load = re.search(r'id="job-state"[^>]*>([^<]*)<', nav.value.text())
    assert at_load and at_load.group(1).strip() != "done", at_load
    skips_at_load = re.search(r'id="job-skip-reasons"[^>]*>([^<]*)<', nav.value.text())
    assert skips_at_load and skips_at_load.group(1) in ("none", "already_replayed 1")
    assert wait_done(page, polls) == 2
    assert polls, "the job page never asked for progress"
    # the skip reasons row follows the job too (rendered "none" when the job had not reached
    # the replayed record yet; the script's polls fill it in)
    assert page.inner_text("#job-skip-reasons").strip() == "already_replayed 1"
    copies = read_topic(explorer.sidecar.deployment.bootstrap, env.other)
    assert sorted(c.key for c in copies) == [b"ord-4403", b"ord-4407", b"ord-4411"]

    # Replaying does not delete: the dead letters stay in the failed topic and the list still
    # shows them, marked replayed (by the replay ledger); the record page says so, and the
    # overview no longer counts them as waiting.
    page.goto(f"{explorer.url}/dead-letters?dead_reason={REASON}&original_topic={env.other}")
    assert rows.count() == 3
    assert [t.strip() for t in rows.locator("td.replayed").all_inner_texts()] == ["yes"] * 3
    with page.expect_navigation():
        rows.first.locator("a.record-link").click()
    assert "Already replayed" in page.inner_text("#record-replayed")
    page.click("a#nav-overview")
    page.wait_for_selector("section#overview")
    assert reason_count(page, REASON) == 0
    assert waiting(page) == total_before - 3


def test_replay_selected_with_the_keyboard(explorer: Explorer, tab: Tab) -> None:
    """Tick two records of a page, replay the selection, confirm: keyboard only (Space on the
    boxes, Enter on the buttons); the job is listed on the jobs page."""
    env = explorer.env
    page = tab.page
    polls: list[str] = []
    page.on("response", lambda r: polls.append(r.url) if r.url.endswith("/progress") else None)
    sign_in(page, explorer.url, REPLAY_TOKEN, next_path="/ui/dead-letters?error_class=TimeoutError")
    rows = page.locator("table#records tr.record")
    assert rows.count() == 3  # realistic(): ord-4400, ord-4404, ord-4408
    boxes = rows.locator("input.select-record")
    # The header box ticks and unticks every box of the page (the script does it).
    page.focus("input#select-all")
    page.keyboard.press("Space")
    assert all(b.is_checked() for b in boxes.all())
    page.keyboard.press("Space")
    assert not any(b.is_checked() for b in boxes.all())
    chosen = {b"ord-4404", b"ord-4408"}
    for key in sorted(chosen):
        box = rows.filter(has_text=key.decode()).locator("input.select-record")
        box.focus()
        page.keyboard.press("Space")
        assert box.is_checked()
    page.focus("button#replay-selected-button")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert number(page.inner_text("#dry-run-count")) == 2
    assert page.locator("table#dry-run-sample tr.sample").count() == 2
    page.focus("button#confirm-replay-button")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    job_id = page.url.rsplit("/", 1)[-1]
    assert wait_done(page, polls) == 2
    copies = read_topic(explorer.sidecar.deployment.bootstrap, env.main)
    assert {c.key for c in copies} == chosen
    page.click("a#nav-jobs")
    page.wait_for_selector("table#jobs")
    row = page.locator("table#jobs tr.job", has=page.locator(f"a.job-link:text-is('{job_id}')"))
    assert "done" in row.inner_text(), row.inner_text()


def test_replay_without_javascript(explorer: Explorer, open_tab: Any) -> None:
    """Every page works with scripting off: sign in, filter, dry run, replay, and the job page
    shows the state at load time with a refresh link, followed until the job is done."""
    t: Tab = open_tab(java_script_enabled=False)
    page = t.page
    sign_in(page, explorer.url, REPLAY_TOKEN)
    page.goto(f"{explorer.url}/dead-letters?original_topic={explorer.spare_topic}")
    assert page.locator("table#records tr.record").count() == 1
    with page.expect_navigation():
        page.click("button#replay-filter-button")
    assert number(page.inner_text("#dry-run-count")) == 1
    with page.expect_navigation():
        page.click("button#confirm-replay-button")
    assert page.is_visible("section#job")

    def done() -> bool:
        if page.inner_text("#job-state").strip() == "done":
            return True
        with page.expect_navigation():
            page.click("a#job-refresh")
        return False

    wait_for(done, 30, 0.2, "the job page to show done")
    assert number(page.inner_text("#job-replayed")) == 1
    (copy,) = read_topic(explorer.sidecar.deployment.bootstrap, explorer.spare_topic)
    assert copy.key == b"spare-1"


def focus_state(page: Any) -> dict[str, Any]:
    state: dict[str, Any] = page.evaluate(
        """() => {
            const el = document.activeElement;
            const style = getComputedStyle(el);
            return {
                id: el.id, tag: el.tagName.toLowerCase(), name: el.getAttribute('name'),
                inFilters: !!el.closest('form#filters'),
                visible: (style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0)
                    || style.boxShadow !== 'none',
            };
        }"""
    )
    return state


def test_keyboard_reaches_skip_link_and_filters(explorer: Explorer, tab: Tab) -> None:
    page = tab.page
    sign_in(page, explorer.url, REPLAY_TOKEN, next_path="/ui/dead-letters")
    page.keyboard.press("Tab")
    first = focus_state(page)
    assert first["id"] == "skip-to-main", first
    assert first["visible"], "the skip link's focus is not visible"
    page.keyboard.press("Enter")
    reached = []
    for _ in range(40):
        page.keyboard.press("Tab")
        state = focus_state(page)
        reached.append(state)
        assert state["visible"], f"focus not visible on {state}"
        if state["inFilters"] and state["name"] == "original_topic":
            break
    else:
        raise AssertionError(f"Tab never reached the filters: {reached}")
    # Typing and Enter apply the filter without a mouse.
    page.keyboard.type(explorer.env.other)
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert f"original_topic={explorer.env.other}" in page.url


def test_pages_fit_desktop_and_phone(explorer: Explorer, open_tab: Any) -> None:
    partition, offset = explorer.record("ord-4400").coordinates
    paths = [
        "/",
        "/dead-letters",
        f"/dead-letters/{partition}/{offset}?topic={explorer.env.failed}",
        "/jobs",
    ]
    for viewport in (DESKTOP, PHONE):
        t: Tab = open_tab(viewport)
        sign_in(t.page, explorer.url, REPLAY_TOKEN)
        for path in paths:
            response = t.page.goto(explorer.url + path)
            assert response.status == 200, (path, response.status)
            assert layout_fits(t.page), f"{path} overflows at {viewport}"
