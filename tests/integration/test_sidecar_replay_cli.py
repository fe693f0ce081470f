"""`retryd replay` over the same job code: dry-run tables, a real run, the ledger, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.sidecar_support import REPO, Env, failed_headers, seed
from tests.support import read_topic


def _run(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "retryd", "replay", *args],
        env={**env.env(0), "COLUMNS": "160"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_replay_cli(bootstrap: str, tmp_path: Path) -> None:
    env = Env(bootstrap, tmp_path / "state").create()
    records = [
        (
            f"k{i}".encode(),
            f"v{i}".encode(),
            failed_headers(env.main if i % 4 else env.other, error_class=f"E{i % 2}"),
        )
        for i in range(40)
    ]
    seed(bootstrap, env.failed, records)

    dry = _run(env, "--dry-run", "--original-topic", env.main)
    assert dry.returncode == 0, dry.stderr
    assert "dry run: nothing was produced" in dry.stdout
    assert "would replay, by target topic" in dry.stdout and env.main in dry.stdout
    assert " 30 " in dry.stdout  # matched and to-replay counts in the summary table
    assert read_topic(bootstrap, env.main) == []

    real = _run(env, "--original-topic", env.main, "--rate", "200", "--json")
    assert real.returncode == 0, real.stderr
    snap = json.loads(real.stdout)
    assert snap["state"] == "completed" and snap["replayed"] == 30 and snap["failed"] == 0
    assert len(read_topic(bootstrap, env.main, expect=30)) == 30

    # No filter: every record of failed_topic. Refused without a terminal unless --yes.
    refused_all = _run(env, "--json")
    assert refused_all.returncode == 2 and "--yes" in refused_all.stderr, refused_all.stderr
    assert len(read_topic(bootstrap, env.other)) == 0
    again = _run(env, "--json", "--yes")
    snap = json.loads(again.stdout)
    assert snap["replayed"] == 10 and snap["skipped_reasons"] == {"already_replayed": 30}

    # Time filters: ISO-8601 or relative. Everything was dead-lettered just now.
    recent = _run(env, "--dry-run", "--json", "--since", "10m", "--force")
    assert json.loads(recent.stdout)["matched"] == 40, recent.stderr
    old = _run(env, "--dry-run", "--json", "--until", "2001-09-09T01:46:40Z", "--force")
    assert json.loads(old.stdout)["matched"] == 0, old.stderr
    bad_time = _run(env, "--since", "yesterday")
    assert bad_time.returncode == 2 and "ISO-8601" in bad_time.stderr

    bad = _run(env, "--dead-reason", "bored")
    assert bad.returncode == 2 and "--dead-reason" in bad.stderr
    refused = _run(env, "--target", "elsewhere", "--yes")
    assert refused.returncode == 1 and "allow-list" in refused.stderr
