"""The peers benchmark runs end to end (``--quick``) on the suite's broker: every system that
is available produces its figure, and every shape its row. This checks the harness, not the
numbers (those live in BENCHMARKS.md). The Python peers' environments are made on first use
(a pip install each, cached); a peer that cannot be installed is named in the notes, and the
Java peers are left out with a note until ``bench/peers/java.py`` is in the tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# the first run makes the Python peers' environments (pip) and builds the Java peers (Maven)
@pytest.mark.timeout(1500)
def test_peers_benchmark_quick_mode_gives_every_available_system_a_figure(
    bootstrap: str, tmp_path: Path
) -> None:
    env = {**os.environ, "RETRYD_TEST_BOOTSTRAP": bootstrap, "PYTHONPATH": str(REPO)}
    result = tmp_path / "peers.json"
    out = subprocess.run(
        [sys.executable, "bench/bench_peers.py", "--quick", "--out", str(result)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(result.read_text())
    assert report["errors"] == [], report["errors"]
    summary = report["summary"]
    skipped = " ".join(report["notes"])
    # retryd and the raw loop always run; each peer either gave a figure or is named skipped
    assert {"raw", "retryd"} <= set(summary["success"])
    for system in ("quix-streams", "faststream-batch", "faststream-message", "spring"):
        assert system in summary["success"] or system in skipped, system
    for system in ("parallel-consumer@16", "parallel-consumer@64"):
        assert system in summary["keyed"] or "parallel-consumer" in skipped, system
    assert "spring" in summary["retry"] or "spring" in skipped
    for shape, systems in summary.items():
        for system, row in systems.items():
            assert row["runs"] >= 1, (shape, system)
            if shape == "success":
                assert row["cpu_s_per_million"] > 0 and row["msgs_per_s"] > 0, (system, row)
    assert {"retryd@16", "retryd@64"} <= set(summary["keyed"])
    for row in summary["keyed"].values():
        assert row["wall_s"] > 0
    retried = summary["retry"]["retryd"]
    assert retried["early"] == 0, "a retried call ran before its due time"
    assert retried["drain_s"] >= 1.0, retried  # a 1 s tier cannot drain sooner
    assert {t["row"] for t in report["targets"]} >= {"success_cpu_vs_raw", "retry_early"}
    assert "http" in skipped or report["http"], "the http shape neither ran nor said why"
