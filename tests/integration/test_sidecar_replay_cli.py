"""`retryd replay` over the same job code: dry-run tables, a real run, the ledger, errors."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.sidecar_support import Env, failed_headers, replay_cli, seed
from tests.support import read_topic


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

    dry = replay_cli(env, "--dry-run", "--original-topic", env.main)
    assert dry.returncode == 0, dry.stderr
    assert "dry run: nothing was produced" in dry.stdout
    assert "would replay, by target topic" in dry.stdout and env.main in dry.stdout
    assert " 30 " in dry.stdout  # matched and to-replay counts in the summary table
    assert read_topic(bootstrap, env.main) == []

    real = replay_cli(env, "--original-topic", env.main, "--rate", "200", "--json")
    assert real.returncode == 0, real.stderr
    snap = json.loads(real.stdout)
    assert snap["state"] == "completed" and snap["replayed"] == 30 and snap["failed"] == 0
    assert len(read_topic(bootstrap, env.main, expect=30)) == 30

    # No filter: every record of failed_topic. Refused without a terminal unless --yes.
    refused_all = replay_cli(env, "--json")
    assert refused_all.returncode == 2 and "--yes" in refused_all.stderr, refused_all.stderr
    assert len(read_topic(bootstrap, env.other)) == 0
    again = replay_cli(env, "--json", "--yes")
    snap = json.loads(again.stdout)
    assert snap["replayed"] == 10 and snap["skipped_reasons"] == {"already_replayed": 30}

    # Time filters: ISO-8601 or relative. Everything was dead-lettered just now.
    recent = replay_cli(env, "--dry-run", "--json", "--since", "10m", "--force")
    assert json.loads(recent.stdout)["matched"] == 40, recent.stderr
    old = replay_cli(env, "--dry-run", "--json", "--until", "2001-09-09T01:46:40Z", "--force")
    assert json.loads(old.stdout)["matched"] == 0, old.stderr
    bad_time = replay_cli(env, "--since", "yesterday")
    assert bad_time.returncode == 2 and "ISO-8601" in bad_time.stderr

    bad = replay_cli(env, "--dead-reason", "bored")
    assert bad.returncode == 2 and "--dead-reason" in bad.stderr
    refused = replay_cli(env, "--target", "elsewhere", "--yes")
    assert refused.returncode == 1 and "allow-list" in refused.stderr
