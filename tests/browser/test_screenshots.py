"""The README's screenshots of the explorer, taken from a sidecar holding realistic dead letters
only, next to a live worker of its group (so the overview shows a worker alive, its circuit
and its tiers as an operator sees them): the whole overview page 1280 wide, and the record view
at 1280x800.

Every run saves them as test artifacts; with ``RETRYD_UPDATE_SCREENSHOTS=1`` the run also
replaces ``docs/images/explorer-overview.png`` and ``docs/images/explorer-record.png`` (commit
them). Either way the committed images must exist, be PNGs of that size and stay small."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import httpx

from tests.browser.conftest import REPLAY_TOKEN, Explorer, Tab, artifacts_dir, sign_in
from tests.integration.sidecar_support import REPO
from tests.integration.worker_support import stop_process
from tests.support import create_topics, produce, wait_for

IMAGES = REPO / "docs" / "images"
MAX_BYTES = 300 * 1024
HANDLER = "python:tests.handlers_for_tests:ok"


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

    env = showcase.env
    create_topics(env.bootstrap, [f"{env.group}.retry_1s", f"{env.group}.retry_2s"], 2)
    log = artifacts_dir() / "showcase-worker.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "retryd", "worker"],
            env={**env.env(showcase.sidecar.port), "RETRYD_HANDLER": HANDLER},
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: httpx.get(showcase.sidecar.url + "/readyz", timeout=5).status_code == 200,
            60,
            0.2,
            "the showcase's worker is live",
        )
        produce(env.bootstrap, env.main, [(f"ord-{i}".encode(), b"{}") for i in range(30)])
        sign_in(page, showcase.url, REPLAY_TOKEN)

        def settled() -> bool:
            """The worker's circuit reported and every topic's lag measured (each ~5 s)."""
            page.reload()
            page.wait_for_selector("table#by-reason")
            return page.inner_text("#circuit-state") == "closed" and "unknown" not in (
                page.inner_text("table#tiers")
            )

        wait_for(settled, 60, 1.0, "the overview shows the live worker's circuit and every lag")
        shots = {"explorer-overview.png": page.screenshot(full_page=True)}
    finally:
        stop_process(worker)

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
        width, height = png_size(committed)
        if name == "explorer-overview.png":
            assert width == 1280 and 800 <= height <= 2400, (name, width, height)
        else:
            assert (width, height) == (1280, 800), (name, width, height)
        assert committed.stat().st_size < MAX_BYTES, (name, committed.stat().st_size)
