"""The worker benchmark harness runs end to end (``--quick``): every scenario produces its row.
This checks the harness, not the numbers (those live in BENCHMARKS.md). The scenarios run on
the suite's broker (the harness's "existing cluster" mode) rather than one started per
scenario as the benchmark runs do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_worker_benchmark_quick_mode_produces_every_row(bootstrap: str) -> None:
    # Every scenario on the suite's broker (fresh topics and groups each): a broker started per
    # scenario, as the real runs do, would add a start-up each to what checks the harness only.
    env = {**os.environ, "RETRYD_TEST_BOOTSTRAP": bootstrap}
    out = subprocess.run(
        [sys.executable, "bench/bench_worker.py", "--quick", "--no-write"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
    assert {r["row"] for r in rows} == {
        "success",
        "routing",
        "routing_eos",
        "routing_eos_cost",
        "http",
        "async",
        "lateness_p50",
        "lateness_p99",
        "lateness_jitter_p99",
        "lateness_jitter_early",
        "memory",
        "memory_shared",
        "scale",
        "late_join",
        "late_join_shared",
    }
    for row in rows:
        assert row["measured"] > 0 or row["row"].startswith("lateness"), row
    early = next(r for r in rows if r["row"] == "lateness_jitter_early")
    assert early["measured"] == 0, "a jittered tier record was handled before it was due"
