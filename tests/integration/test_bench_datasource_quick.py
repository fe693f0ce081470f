"""``bench/bench_datasource.py --quick``: the benchmark harness works end to end (produce,
raw scans, Spark reads, checks, summary, results file). It asserts the harness, not numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import bench_datasource
from tests.integration.spark_support import spark  # noqa: F401

pytestmark = pytest.mark.spark


def test_quick_mode_runs_the_whole_harness(
    spark,  # noqa: F811 - the harness uses this running session instead of starting one
    bootstrap: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--quick", "--bootstrap", bootstrap, "--results-dir", str(tmp_path)]
    assert bench_datasource.main(args) == 0
    printed = capsys.readouterr().out
    assert "ratio raw_default_over_spark_warm:" in printed
    (written,) = tmp_path.glob("datasource-*.json")
    result = json.loads(written.read_text())
    assert result["quick"] and result["records"] == 20_000 and result["spark_session_reused"]
    samples = result["samples_seconds"]
    assert len(samples["spark_cold"]) == 1 and len(samples["spark_warm"]) == 1
    assert len(samples["raw_default"]) == len(samples["raw_tuned"]) == 3
    assert set(result["ratios"]) == {
        "raw_default_over_spark_warm", "raw_default_over_spark_cold",
        "raw_tuned_over_spark_warm", "raw_tuned_over_spark_cold",
    }  # fmt: skip
    assert all(value > 0 for value in result["ratios"].values())
    # the suite's session has no Kafka connector: the harness says so instead of failing
    assert result["native_connector"]["measured"] is False
    assert "no Kafka connector" in result["native_connector"]["why_not"]
    assert result["broker"]["label"] == f"external cluster at {bootstrap}"
