"""README command 1: ``retryd dev`` runs on its own embedded broker and checks its own summary."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.worker_support import REPO


def test_retryd_dev_drains_demo_traffic_and_prints_a_matching_summary() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "retryd",
            "dev",
            "--messages",
            "300",
            "--sequence",
            "1s,1s",
            "--processes",
            "2",
            "--partitions",
            "2",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "summary" in text and "drained in" in text
    assert "MISSING" not in text
