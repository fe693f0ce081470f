"""The README's screenshots of the explorer (overview and record view, 1280x800), taken from a
sidecar holding realistic dead letters only.

Every run saves them as test artifacts; with ``RETRYD_UPDATE_SCREENSHOTS=1`` the run also
replaces ``docs/images/explorer-overview.png`` and ``docs/images/explorer-record.png`` (commit
them). Either way the committed images must exist, be 1280x800 PNGs and stay small."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from tests.browser.conftest import REPLAY_TOKEN, Explorer, Tab, artifacts_dir, sign_in
from tests.integration.sidecar_support import REPO

IMAGES = REPO / "docs" / "images"
MAX_BYTES = 300 * 1024


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_readme_screenshots(sidecars: dict[str, Explorer], tab: Tab) -> None:
    showcase = sidecars["showcase"]
    page = tab.page
    update = os.environ.get("RETRYD_UPDATE_SCREENSHOTS") == "1"
    targets = [artifacts_dir()] + ([IMAGES] if update else [])

    sign_in(page, showcase.url, REPLAY_TOKEN)
    page.wait_for_selector("table#by-reason")
    # The dead-letter counts by reason and by error fingerprint (with their sparklines) are
    # the overview's point: the picture starts at the failed topic's section.
    page.evaluate(
        "window.scrollTo(0, document.querySelector('section.dlt').getBoundingClientRect().top"
        " + window.scrollY - 16)"
    )
    shots = {"explorer-overview.png": page.screenshot()}

    page.goto(showcase.url + "/dead-letters")
    with page.expect_navigation():
        page.locator("table#records tr.record a.record-link").first.click()
    page.wait_for_selector("pre#payload")
    shots["explorer-record.png"] = page.screenshot()

    for target in targets:
        target.mkdir(parents=True, exist_ok=True)
        for name, png in shots.items():
            (target / name).write_bytes(png)
    for name in shots:
        committed = IMAGES / name
        assert committed.exists(), f"{committed} missing: run with RETRYD_UPDATE_SCREENSHOTS=1"
        assert png_size(committed) == (1280, 800)
        assert committed.stat().st_size < MAX_BYTES, (name, committed.stat().st_size)
