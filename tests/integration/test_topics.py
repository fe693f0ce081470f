"""Topic provisioning against the real broker: plan, create (idempotent), check, CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from retryd.config import Settings, load_settings
from retryd.errors import KafkaSetupError
from retryd.kafka.embedded import free_port
from retryd.kafka.topics import (
    check_topics,
    create_topics,
    inspect_topics,
    make_admin,
    partition_counts,
    plan_topics,
    topic_configs,
)
from tests.support import create_topics as raw_create
from tests.support import unique

RETRYD = [sys.executable, "-c", "from retryd.cli import main; main()"]
DAY = 86_400_000


def settings_for(bootstrap: str, main: list[str], **kw: object) -> Settings:
    """Fresh, test-unique names for every topic retryd owns."""
    group = unique("grp")
    fields: dict[str, object] = {
        "bootstrap_servers": bootstrap,
        "main_topics": main,
        "group_id": group,
        "tier_template": "{group}.retry_{delay}",
        "failed_topic": f"{group}.failed",
        "ledger_topic": f"{group}.ledger",
        "retry_sequence": "1s,1m,1m",
        **kw,
    }
    return load_settings(**fields)


@pytest.fixture
def main_topics(bootstrap: str) -> list[str]:
    names = [unique("main-a"), unique("main-b")]
    raw_create(bootstrap, names[:1], partitions=2)
    raw_create(bootstrap, names[1:], partitions=3)
    return names


@pytest.fixture
def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def test_plan_defaults_to_the_main_topics_partitions(
    bootstrap: str, main_topics: list[str], admin: AdminClient
) -> None:
    s = settings_for(bootstrap, main_topics, tier_min_retention_ms=60_000)
    specs = plan_topics(s, admin)
    assert [(x.name, x.kind, x.partitions) for x in specs] == [
        (f"{s.group_id}.retry_1s", "tier", 3),
        (f"{s.group_id}.retry_1m", "tier", 3),
        (s.failed_topic, "failed", 3),
        (s.ledger_topic, "ledger", 1),
    ]
    tier_1s, tier_1m, failed, ledger = specs
    assert tier_1s.config == {"retention.ms": "60000", "cleanup.policy": "delete"}  # min wins
    assert tier_1m.config["retention.ms"] == str(10 * 60_000)  # factor x delay wins
    assert tier_1m.delay_ms == 60_000 and failed.delay_ms is None
    assert failed.config["retention.ms"] == str(30 * DAY)
    assert ledger.config == {"cleanup.policy": "compact"}
    assert all(x.replication_factor == -1 for x in specs)


def test_explicit_tier_partitions_need_no_main_topic(bootstrap: str, admin: AdminClient) -> None:
    s = settings_for(bootstrap, [unique("absent")], tier_partitions=4)
    assert {x.partitions for x in plan_topics(s, admin) if x.kind != "ledger"} == {4}


def test_missing_main_topic_is_a_clear_error(bootstrap: str, admin: AdminClient) -> None:
    absent = unique("absent")
    s = settings_for(bootstrap, [absent])
    with pytest.raises(KafkaSetupError, match=f"main topic\\(s\\) {absent} do not exist"):
        plan_topics(s, admin)
    with pytest.raises(KafkaSetupError, match="tier_partitions"):
        create_topics(s, admin)
    # a metadata listing must not have auto-created it
    assert absent not in partition_counts(admin)
    assert check_topics(s, admin)[0] == (
        f"main topic {absent} is missing (retryd consumes it but does not create it)"
    )


def test_no_main_topics_and_no_size(bootstrap: str, admin: AdminClient) -> None:
    s = settings_for(bootstrap, [])
    with pytest.raises(KafkaSetupError, match="main_topics is empty"):
        plan_topics(s, admin)


def test_create_twice_is_idempotent_and_check_passes(
    bootstrap: str, main_topics: list[str], admin: AdminClient
) -> None:
    s = settings_for(bootstrap, main_topics)
    names = [x.name for x in plan_topics(s, admin)]
    kinds = [("tier", 3), ("tier", 3), ("failed", 3), ("ledger", 1)]
    assert check_topics(s, admin) == [
        f"{kind} topic {n} is missing (planned {p} partitions)"
        for n, (kind, p) in zip(names, kinds, strict=True)
    ]
    first = create_topics(s, admin)
    assert [(st.spec.name, st.status) for st in first] == [(n, "created") for n in names]
    second = create_topics(s, admin)
    assert [(st.spec.name, st.status, st.problems) for st in second] == [
        (n, "exists", ()) for n in names
    ]
    counts = partition_counts(admin)
    assert [counts[n] for n in names] == [3, 3, 3, 1]
    assert check_topics(s, admin) == []
    _, states = inspect_topics(s, admin)
    by_name = {st.spec.name: st for st in states}
    assert by_name[s.ledger_topic].cleanup_policy == "compact"
    assert by_name[names[1]].retention_ms == 7 * DAY


def test_check_reports_missing_and_mis_sized(
    bootstrap: str, main_topics: list[str], admin: AdminClient
) -> None:
    s = settings_for(bootstrap, main_topics)
    g = s.group_id
    # someone created the 1m tier by hand with too few partitions and a retention below the
    # delay, and the ledger without compaction
    raw_create(bootstrap, [f"{g}.retry_1m"], partitions=1, config={"retention.ms": "1000"})
    raw_create(bootstrap, [s.ledger_topic], partitions=1, config={"cleanup.policy": "delete"})
    states = create_topics(s, admin)
    assert {st.spec.name: st.status for st in states} == {
        f"{g}.retry_1s": "created",
        f"{g}.retry_1m": "mis-sized",
        s.failed_topic: "created",
        s.ledger_topic: "mis-sized",
    }
    problems = check_topics(s, admin)
    assert problems == [
        f"tier topic {g}.retry_1m has 1 partition(s), fewer than the planned 3",
        f"tier topic {g}.retry_1m has retention.ms=1000 (1s), shorter than its delay 1m: "
        "records would be deleted before they are due",
        f"ledger topic {s.ledger_topic} has cleanup.policy=delete, expected compact: "
        "replay records would expire and failed records could be replayed twice",
    ]
    # a longer sequence adds a tier that does not exist yet
    longer = load_settings(**{**_fields(s), "retry_sequence": "1s,1m,1h"})
    assert f"tier topic {g}.retry_1h is missing (planned 3 partitions)" in check_topics(
        longer, admin
    )


def _fields(s: Settings) -> dict[str, object]:
    keys = ("bootstrap_servers", "main_topics", "group_id", "tier_template", "failed_topic")
    return {k: getattr(s, k) for k in (*keys, "ledger_topic")}


def test_unreachable_cluster(bootstrap: str) -> None:
    s = load_settings(bootstrap_servers=f"127.0.0.1:{free_port()}", tier_partitions=1)
    with pytest.raises(KafkaSetupError, match="cannot list topics"):
        plan_topics(s, make_admin(s), timeout_s=2)


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RETRYD, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env, check=False
    )


def group_env(group: str) -> dict[str, str]:
    """The environment without any RETRYD_* setting of the caller, naming ``group``'s own
    tiers, failed topic and ledger."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYD_")}
    return env | {
        "RETRYD_GROUP_ID": group,
        "RETRYD_FAILED_TOPIC": f"{group}.failed",
        "RETRYD_LEDGER_TOPIC": f"{group}.ledger",
        "RETRYD_TIER_TEMPLATE": "{group}.retry_{delay}",
    }


def test_cli_create_then_check(bootstrap: str, main_topics: list[str], tmp_path: Path) -> None:
    group = unique("cli")
    cfg = tmp_path / "retryd.toml"
    cfg.write_text(
        f'group_id = "{group}"\ntier_template = "{{group}}.retry_{{delay}}"\n'
        f'failed_topic = "{group}.failed"\nledger_topic = "{group}.ledger"\n'
        'retry_sequence = "1s,2s"\n',
        encoding="utf-8",
    )
    common = ["-c", str(cfg), "-b", bootstrap, "--main-topics", ",".join(main_topics)]
    before = run_cli("topics", "check", *common)
    assert before.returncode == 1, before.stderr
    assert f"tier topic {group}.retry_2s is missing" in before.stdout
    assert "Traceback" not in before.stderr

    created = run_cli("topics", "create", *common)
    assert created.returncode == 0, created.stdout + created.stderr
    assert "ok: 4 created, 0 already existed" in created.stdout

    again = run_cli("topics", "create", *common)
    assert again.returncode == 0 and "ok: 0 created, 4 already existed" in again.stdout

    after = run_cli("topics", "check", *common)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "ok: all 4 topics in place" in after.stdout
    assert f"{group}.retry_2s" in after.stdout  # the table names every topic

    mis = run_cli("topics", "check", *common, "--tier-partitions", "5")
    assert mis.returncode == 1
    assert f"tier topic {group}.retry_1s has 3 partition(s), fewer than the planned 5" in (
        mis.stdout
    )


def test_cli_unreachable_cluster_exits_1() -> None:
    port = free_port()
    out = run_cli(
        "topics", "check", "-b", f"127.0.0.1:{port}", "--tier-partitions=1", "--timeout=2"
    )
    assert out.returncode == 1
    assert "retryd: cannot list topics" in out.stderr
    assert "Traceback" not in out.stderr


def test_cli_min_insync_replicas(bootstrap: str, main_topics: list[str]) -> None:
    """Created with it on every topic, shown in the table, and a topic that differs (here:
    the plan asks for 2 where the topics have 1) is a problem ``check`` names."""
    group = unique("isr")
    common = [
        "-b",
        bootstrap,
        "--main-topics",
        ",".join(main_topics),
        "--retry-sequence",
        "1s",
    ]
    env = group_env(group)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=env)

    created = cli(
        "topics", "create", *common, "--replication-factor", "1", "--min-insync-replicas", "1"
    )
    assert created.returncode == 0, created.stdout + created.stderr
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [f"{group}.retry_1s", f"{group}.failed", f"{group}.ledger"]
    configs = topic_configs(admin, names, 10)
    assert {n: configs[n]["min.insync.replicas"] for n in names} == dict.fromkeys(names, "1")

    refused = cli(
        "topics", "check", *common, "--replication-factor", "1", "--min-insync-replicas", "2"
    )
    assert refused.returncode == 2
    assert "min_insync_replicas=2 exceeds replication_factor=1" in refused.stderr

    differs = cli("topics", "check", *common, "--min-insync-replicas", "2")
    assert differs.returncode == 1
    for name, kind in zip(names, ("tier", "failed", "ledger"), strict=True):
        assert f"{kind} topic {name} has min.insync.replicas=1, planned 2" in differs.stdout


def test_cli_derives_every_tier_of_a_backoff_policy(
    bootstrap: str, main_topics: list[str], tmp_path: Path
) -> None:
    group = unique("pol")
    common = [
        "-b",
        bootstrap,
        "--main-topics",
        ",".join(main_topics),
        "--retry-sequence",
        "exp(1s, x2, max=4s, n=5, jitter=20%, quick=2@100ms)",
    ]
    env = group_env(group)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=env)

    created = cli("topics", "create", *common)
    assert created.returncode == 0, created.stdout + created.stderr
    assert "ok: 5 created" in created.stdout  # tiers 1s, 2s, 4s + failed + ledger
    for delay in ("1s", "2s", "4s"):
        assert f"{group}.retry_{delay}" in created.stdout
    assert cli("topics", "check", *common).returncode == 0

    bad = cli("topics", "check", *common[:-1], "exp(1s, x2, n=3, jitter=80%)")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "invalid jitter '80%'" in bad.stderr and "at most 50%" in bad.stderr
    assert "Traceback" not in bad.stderr
