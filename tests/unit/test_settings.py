"""Settings: RETRYD_* environment, TOML file, precedence, validation messages, redaction."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retryd.config import Role, Settings, load_settings, redact_kafka
from retryd.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's or CI's own RETRYD_* variables must not leak into these tests."""
    for name in list(os.environ):
        if name.startswith("RETRYD_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "retryd.toml"
    path.write_text(text, encoding="utf-8")
    return path


def problems(config: Path | None = None, **overrides: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(config, **overrides)
    return info.value.problems


def test_defaults() -> None:
    s = load_settings()
    assert s.bootstrap_servers == "localhost:9092"
    assert s.retry_sequence == "5m,5m,30m,30m,30m,1h"
    assert s.plan.tier_topics == ["retry_5m", "retry_30m", "retry_1h"]
    assert s.failed_topic == "failed_topic" and s.role is Role.ALL
    assert s.tier_partitions is None and s.api_token is None
    assert s.kafka_common() == {"bootstrap.servers": "localhost:9092"}


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValueError):
        s.group_id = "other"  # type: ignore[misc]


# --- sources and precedence ---------------------------------------------------------------------


def test_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYD_BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    monkeypatch.setenv("RETRYD_MAIN_TOPICS", " orders, payments ,,")
    monkeypatch.setenv("RETRYD_PROCESSES", "4")
    monkeypatch.setenv("RETRYD_ROLE", "tiers")
    monkeypatch.setenv("RETRYD_HANDLER_TIMEOUT_S", "2.5")
    monkeypatch.setenv("RETRYD_TIER_PARTITIONS", "12")
    s = load_settings()
    assert s.bootstrap_servers == "k1:9092,k2:9092"
    assert s.main_topics == ["orders", "payments"]
    assert (s.processes, s.role, s.handler_timeout_s, s.tier_partitions) == (
        4,
        Role.TIERS,
        2.5,
        12,
    )


def test_toml_file(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        """
bootstrap_servers = "toml:9092"
main_topics = ["a", "b"]
retry_sequence = "1s,10s"
state_dir = "/var/lib/retryd"
[kafka]
"security.protocol" = "SSL"
"enable.idempotence" = true
"linger.ms" = 5
""",
    )
    s = load_settings(cfg)
    assert s.bootstrap_servers == "toml:9092" and s.main_topics == ["a", "b"]
    assert s.plan.delays_ms == (1000, 10_000)
    assert s.state_dir == Path("/var/lib/retryd")
    assert s.kafka == {"security.protocol": "SSL", "enable.idempotence": "true", "linger.ms": "5"}


def test_toml_under_retryd_table(tmp_path: Path) -> None:
    cfg = write(tmp_path, '[retryd]\ngroup_id = "g2"\n[retryd.kafka]\n"client.id" = "x"\n')
    s = load_settings(cfg)
    assert s.group_id == "g2" and s.kafka == {"client.id": "x"}


def test_precedence_override_env_toml_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write(
        tmp_path, 'group_id = "toml"\nfailed_topic = "toml_dead"\nbatch_size = 7\nprocesses = 3\n'
    )
    monkeypatch.setenv("RETRYD_GROUP_ID", "env")
    monkeypatch.setenv("RETRYD_FAILED_TOPIC", "env_dead")
    s = load_settings(cfg, group_id="override", processes=None)
    assert s.group_id == "override"  # override > env > toml
    assert s.failed_topic == "env_dead"  # env > toml
    assert s.batch_size == 7  # toml > default
    assert s.processes == 3  # None override means "not given"
    assert s.session_timeout_ms == 45_000  # default


def test_list_precedence_and_comma_strings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(tmp_path, 'main_topics = ["t1"]\nnon_retryable = "KeyError, ValueError"\n')
    assert load_settings(cfg).non_retryable == ["KeyError", "ValueError"]
    monkeypatch.setenv("RETRYD_MAIN_TOPICS", "e1,e2")
    assert load_settings(cfg).main_topics == ["e1", "e2"]
    assert load_settings(cfg, main_topics="o1").main_topics == ["o1"]
    assert load_settings(cfg, main_topics=["o2", "o3"]).main_topics == ["o2", "o3"]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=50)
@given(st.lists(st.text(alphabet="abcXYZ019._-", min_size=1, max_size=20), max_size=6))
def test_comma_list_any_topics(topics: list[str]) -> None:
    topics = [t for t in topics if t not in (".", "..")]
    assert load_settings(main_topics=",".join(topics)).main_topics == topics


def test_kafka_passthrough_json_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "RETRYD_KAFKA", json.dumps({"security.protocol": "SASL_SSL", "sasl.password": "pw"})
    )
    s = load_settings(bootstrap_servers="b:1")
    assert s.kafka_common() == {
        "bootstrap.servers": "b:1",
        "security.protocol": "SASL_SSL",
        "sasl.password": "pw",
    }


def test_kafka_env_and_toml_merge_key_by_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write(tmp_path, '[kafka]\n"client.id" = "toml"\n"linger.ms" = "5"\n')
    monkeypatch.setenv("RETRYD_KAFKA", '{"client.id": "env"}')
    assert load_settings(cfg).kafka == {"client.id": "env", "linger.ms": "5"}


def test_kafka_passthrough_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYD_KAFKA", "{not json")
    assert problems() == ["kafka: must be a JSON object of librdkafka options"]
    monkeypatch.setenv("RETRYD_KAFKA", '{"Bad Key": "x"}')
    assert problems() == ["kafka: 'Bad Key' is not a librdkafka option name"]


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "line_start", "why"),
    [
        ({"retry_sequence": "5m,xx"}, "retry_sequence='5m,xx': ", "invalid delay 'xx'"),
        ({"retry_sequence": ""}, "retry_sequence='': ", "comma list"),
        ({"handler": "mod:func"}, "handler='mod:func': ", "python:package.module:function"),
        ({"handler": "python:mod"}, "handler='python:mod': ", "python handler must look like"),
        ({"processes": "zero"}, "processes='zero': ", "valid integer"),
        ({"processes": 0}, "processes=0: ", "greater than or equal to 1"),
        ({"role": "boss"}, "role='boss': ", "'all', 'main' or 'tiers'"),
        ({"main_topics": "ok,a b"}, "main_topics='ok,a b': ", "invalid topic name 'a b'"),
        ({"failed_topic": "x/y"}, "failed_topic='x/y': ", "invalid topic name"),
        ({"ledger_topic": ""}, "ledger_topic='': ", "invalid topic name"),
        ({"tier_template": "retry"}, "tier_template='retry': ", "must contain '{delay}'"),
        ({"tier_template": "r_{x}_{delay}"}, "tier_template='r_{x}_{delay}': ", "may only use"),
        ({"sidecar_port": 70000}, "sidecar_port=70000: ", "less than or equal to 65535"),
        ({"tier_min_retention_ms": 5}, "tier_min_retention_ms=5: ", "greater than or equal"),
    ],
)
def test_invalid_values_name_field_value_and_why(
    overrides: dict[str, object], line_start: str, why: str
) -> None:
    lines = problems(**overrides)
    assert len(lines) == 1, lines
    assert lines[0].startswith(line_start), lines
    assert why in lines[0], lines


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    cfg = write(tmp_path, 'retry_sequence = "5q"\nhandler = "ftp://x"\nbogus_key = 1\n')
    lines = problems(cfg)
    assert len(lines) == 3
    assert any(line.startswith("retry_sequence='5q': ") for line in lines)
    assert any(line.startswith("handler='ftp://x': ") for line in lines)
    assert "bogus_key=1: Extra inputs are not permitted" in lines


def test_cross_field_rules() -> None:
    lines = problems(handler_timeout_s=400)
    assert lines == [
        "handler_timeout_s=400 must be below max_poll_interval_ms=300000 "
        "(a handler call blocks polling)"
    ]
    assert problems(session_timeout_ms=400_000) == [
        "session_timeout_ms must not exceed max_poll_interval_ms"
    ]
    assert problems(main_topics="retry_5m") == [
        "main_topics must not include a tier topic or failed_topic"
    ]


def test_bad_env_var_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYD_BATCH_SIZE", "lots")
    assert problems()[0].startswith("batch_size='lots': ")


def test_missing_and_broken_files(tmp_path: Path) -> None:
    assert problems(tmp_path / "nope.toml") == [f"config file {tmp_path / 'nope.toml'}: not found"]
    broken = write(tmp_path, "retry_sequence = \n")
    (line,) = problems(broken)
    assert line.startswith(f"config file {broken}: ")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert problems(binary)[0].startswith(f"config file {binary}: ")


def test_long_values_are_shortened_in_messages() -> None:
    (line,) = problems(retry_sequence="x" * 500)
    assert len(line.split(": ", 1)[0]) < 100


# --- secrets ------------------------------------------------------------------------------------


def test_secrets_redacted_in_safe_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYD_API_TOKEN", "tok-s3cret")
    monkeypatch.setenv(
        "RETRYD_KAFKA",
        json.dumps(
            {
                "sasl.password": "pw-s3cret",
                "ssl.key.password": "kp-s3cret",
                "sasl.oauthbearer.client.secret": "cs-s3cret",
                "ssl.key.pem": "pem-s3cret",
                "sasl.username": "alice",
            }
        ),
    )
    s = load_settings()
    assert s.api_token is not None and s.api_token.get_secret_value() == "tok-s3cret"
    summary = s.safe_summary()
    assert "s3cret" not in json.dumps(summary, default=str)
    assert "s3cret" not in str(s.api_token)
    assert summary["api_token"] == "***"
    assert summary["kafka"]["sasl.username"] == "alice"
    assert summary["kafka"]["sasl.password"] == "***"


def test_secret_values_never_in_error_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYD_KAFKA", '{"sasl.password": ["s3cret"]}')
    lines = problems()
    assert lines and all("s3cret" not in line for line in lines)


def test_blank_api_token_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYD_API_TOKEN", "")
    assert load_settings().api_token is None
    assert load_settings(api_token="  ").api_token is None
    assert load_settings().safe_summary()["api_token"] is None


def test_redact_kafka() -> None:
    assert redact_kafka({"a.token": "x", "b": "y"}) == {"a.token": "***", "b": "y"}


def test_settings_class_reads_env_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYD_GROUP_ID", "direct")
    assert Settings().group_id == "direct"


# --- the shipped example file -------------------------------------------------------------------


def test_example_config_loads_and_documents_every_field() -> None:
    path = REPO / "config" / "retryd.toml"
    s = load_settings(path)
    text = path.read_text(encoding="utf-8")
    for name in Settings.model_fields:
        assert f"RETRYD_{name.upper()}" in text, f"{name}: env var not documented"
        assert f"\n{name} = " in text or f"\n# {name} = " in text or f"[{name}]" in text, name
    defaults = load_settings()
    examples = {"main_topics"}  # values the file sets on purpose to show the format
    for name in Settings.model_fields:
        if name not in examples:
            assert getattr(s, name) == getattr(defaults, name), f"{name} differs from default"


# --- credentials from a mounted file ------------------------------------------------------------


def test_kafka_file_adds_options_over_the_table_and_never_shows_values(tmp_path: Path) -> None:
    creds = tmp_path / "kafka.properties"
    creds.write_text(
        "# from a Secret\nsecurity.protocol=SASL_SSL\nsasl.password = p=ss w0rd\n\n"
        "! also a comment\n"
    )
    s = load_settings(kafka={"security.protocol": "PLAINTEXT", "acks": "all"}, kafka_file=creds)
    assert s.kafka_common()["security.protocol"] == "SASL_SSL"
    assert s.kafka_common()["sasl.password"] == "p=ss w0rd"
    assert s.kafka_common()["acks"] == "all"
    assert "w0rd" not in str(s.safe_summary())
    creds.write_text("sasl.password=hunter2\nnot an option\n")
    with pytest.raises(ConfigError) as info:
        load_settings(kafka_file=creds)
    assert info.value.problems == [f"kafka_file {creds} line 2: expected key=value"]
    assert "hunter2" not in str(info.value)
    assert load_settings(kafka_file="").kafka_file is None  # blank = not set (compose)
