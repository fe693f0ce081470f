"""The share-mode lateness benchmark runs end to end (``bench/bench_share.py --scenario
lateness --quick``: 50 records, one run of each system) on the suite's broker. This checks the
harness and the one property that holds at any size, not the numbers (BENCHMARKS.md has
those): every record is handled exactly twice by each system; retryd's retried calls are
never before the copy's due time; the broker's RELEASE brings every record back before its
1 s delay, and holding the records for it does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ON_TANSU, broker_older_than

pytestmark = pytest.mark.skipif(
    ON_TANSU or broker_older_than(4, 2),
    reason="share groups (KIP-932) need Apache Kafka 4.2 or newer",
)

REPO = Path(__file__).resolve().parents[2]
RECORDS = 50


@pytest.mark.timeout(180)
def test_share_lateness_quick_mode_handles_every_record_twice_never_early(
    bootstrap: str, tmp_path: Path
) -> None:
    result = tmp_path / "share-lateness.json"
    env = {**os.environ, "RETRYD_TEST_BOOTSTRAP": bootstrap, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [
            sys.executable,
            "bench/bench_share.py",
            "--scenario",
            "lateness",
            "--quick",
            "--records",
            str(RECORDS),
            "--out",
            str(result),
        ],
        cwd=REPO,
        env={**env, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(result.read_text())
    summary = report["summary"]
    assert set(summary) == {"retryd", "release", "hold"}
    for system, row in summary.items():
        assert row["runs"] == 1, system
        assert (row["handled_twice"], row["calls"]) == (RECORDS, 2 * RECORDS), (system, row)
    retryd = summary["retryd"]
    # never before its due time, nor before the failure + 1 s (the due time is planned from
    # now rounded up to the millisecond)
    assert retryd["early_vs_due"] == 0, retryd
    assert retryd["early"] == 0, retryd
    assert retryd["lateness_min_ms"] >= 0.0, retryd
    assert retryd["drain_s"] >= 1.0, retryd  # a 1 s tier cannot drain sooner
    assert summary["release"]["early"] == RECORDS, summary["release"]  # back at once
    assert summary["hold"]["early"] == 0, summary["hold"]
