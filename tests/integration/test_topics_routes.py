"""Topic provisioning with error routes, on the real broker: every tier of every route (one per
distinct delay, shared with retry_sequence) and each named dead-letter topic."""

from __future__ import annotations

import subprocess
from pathlib import Path

from confluent_kafka.admin import AdminClient

from retryd.kafka.topics import check_topics, create_topics, partition_counts, plan_topics
from tests.integration.test_topics import group_env, run_cli, settings_for
from tests.support import create_topics as raw_create
from tests.support import unique

DAY = 86_400_000


def test_create_derives_every_route_tier_and_dead_letter_topic(bootstrap: str) -> None:
    main = unique("main-routes")
    raw_create(bootstrap, [main], partitions=2)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    dlt = unique("declined")
    s = settings_for(
        bootstrap,
        [main],
        retry_sequence="1s,1m",
        error_routes={
            "TimeoutError": "exp(1s, x2, n=3, jitter=20%)",  # 1s (shared), 2s, 4s
            "http_5xx": ["1m", "5m"],  # 1m shared, 5m
            "myapp.Declined": f"dlt:{dlt}",
            "http_404": f"dlt:{dlt}",  # a DLT shared by two routes: planned once
            "ValueError": "dead",
        },
    )
    g = s.group_id
    specs = plan_topics(s, admin)
    assert [(x.name, x.kind, x.delay_ms) for x in specs] == [
        (f"{g}.retry_1s", "tier", 1_000),
        (f"{g}.retry_1m", "tier", 60_000),
        (f"{g}.retry_2s", "tier", 2_000),
        (f"{g}.retry_4s", "tier", 4_000),
        (f"{g}.retry_5m", "tier", 300_000),
        (s.failed_topic, "failed", None),
        (dlt, "dlt", None),
        (s.ledger_topic, "ledger", None),
    ]
    dlt_spec = specs[6]
    assert dlt_spec.partitions == 2
    assert dlt_spec.config == {"retention.ms": str(30 * DAY), "cleanup.policy": "delete"}

    states = create_topics(s, admin)
    assert [st.status for st in states] == ["created"] * len(specs)
    counts = partition_counts(admin)
    assert all(counts[x.name] == x.partitions for x in specs)
    assert check_topics(s, admin) == []
    assert [st.status for st in create_topics(s, admin)] == ["exists"] * len(specs)


def test_cli_creates_and_checks_the_routes_topics(bootstrap: str, tmp_path: Path) -> None:
    main = unique("main-cli-routes")
    raw_create(bootstrap, [main], partitions=1)
    group = unique("routes")
    dlt = unique("cli-dlt")
    env = group_env(group) | {"RETRYD_ERROR_ROUTES": f"Locked=3s,3s; Declined=dlt:{dlt}"}
    common = ["-b", bootstrap, "--main-topics", main, "--retry-sequence", "1s"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=env)

    before = cli("topics", "check", *common)
    assert before.returncode == 1, before.stdout + before.stderr
    assert f"dlt topic {dlt} is missing" in before.stdout
    assert f"tier topic {group}.retry_3s is missing" in before.stdout

    created = cli("topics", "create", *common)
    assert created.returncode == 0, created.stdout + created.stderr
    assert "ok: 5 created" in created.stdout  # tiers 1s, 3s + failed + DLT + ledger
    assert cli("topics", "check", *common).returncode == 0

    # the flag wins over the environment, like every other setting
    flagged = cli("topics", "check", *common, "--error-routes", "Locked=7s")
    assert flagged.returncode == 1 and f"{group}.retry_7s is missing" in flagged.stdout

    bad = cli("topics", "check", *common, "--error-routes", "Locked=dlt:; http_404=1m")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "route 'Locked' = 'dlt:'" in bad.stderr
    assert "route 'http_404' = '1m': HTTP 404 is non-retryable" in bad.stderr
    assert "Traceback" not in bad.stderr
