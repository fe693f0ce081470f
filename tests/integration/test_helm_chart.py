"""deploy/helm/retryd, rendered, linted and validated without a cluster, and kept equal to the
kustomize base.

Helm itself is built from the Go module proxy by ``tests/tools.py`` (cached; skipped only
without Go). The chart is rendered with its default values, with every option on
(``ci/all-on-values.yaml``), with an existing Secret, and with the example overlay's settings
(``ci/kustomize-example-values.yaml``); each rendering goes through the checks of
``test_kubernetes_manifests.py`` that apply to it (strict Kubernetes 1.30 schemas, real CLI
commands and settings, requests and limits, selectors). The drift test renders the kustomize
overlay and the chart with the same settings and compares the pods field by field: they are
equal but for ``DRIFT_ALLOWED``.
"""

from __future__ import annotations

import copy
import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from retryd import __version__
from retryd.config import load_settings
from tests import tools
from tests.integration import helm_support
from tests.integration import test_kubernetes_manifests as km
from tests.integration.helm_support import CHART, KUBERNETES_VERSION, SCHEMA, objects, render

kubernetes_validate = pytest.importorskip("kubernetes_validate")

CI = CHART / "ci"
OVERLAY = km.KUBE / "overlays" / "example"
SECRET_FILES = (
    f"secret.apiTokens={OVERLAY / 'secrets' / 'api-tokens'},"
    f"secret.kafkaProperties={OVERLAY / 'secrets' / 'kafka.properties'}"
)
LIKE_KUSTOMIZE = ("-f", str(CI / "kustomize-example-values.yaml"), "--set-file", SECRET_FILES)
RENDERINGS: dict[str, tuple[str, ...]] = {
    "default": (),
    "all-on": ("-f", str(CI / "all-on-values.yaml")),
    "existing-secret": ("-f", str(CI / "existing-secret-values.yaml")),
    "like-kustomize": LIKE_KUSTOMIZE,
}

# Where the chart's pod may differ from the kustomize overlay's, and why: substrings of the
# paths of pod_facts(). Anything else that differs fails the drift test.
DRIFT_ALLOWED = {
    # Helm's conventional labels beside the overlay's (name, part-of, component: compared);
    # selectors also have the release's instance label, so that two releases never share pods.
    "app.kubernetes.io/instance": "Helm: the release",
    "app.kubernetes.io/managed-by": "Helm",
    "app.kubernetes.io/version": "Helm: the chart's appVersion",
    "helm.sh/chart": "Helm: the chart and its version",
    # kustomize rolls pods on a changed ConfigMap or Secret by hashing their names; the chart
    # by annotations (the prometheus.io ones are compared).
    "annotations.checksum/": "Helm: checksum/config, checksum/secret",
    # kustomize appends a content hash to generated names; the chart's names are fixed.
    "volumes.config.configMap.name": "kustomize: name hash",
    "volumes.secrets.secret.secretName": "kustomize: name hash",
    # The chart states IfNotPresent, Kubernetes' default for a tagged, non-latest image, where
    # kustomize's manifests leave it unset.
    "imagePullPolicy": "the same policy, stated",
    # One Job per release revision (a Job's pod template cannot change on upgrade).
    "job.name": "Helm: <fullname>-topics-<revision>",
}


@pytest.fixture(scope="module")
def helm() -> str:
    return tools.helm()


@pytest.fixture(scope="module")
def rendered(helm: str) -> dict[str, list[dict[str, Any]]]:
    return {
        name: objects(helm, *args, namespace="orders" if name == "like-kustomize" else "default")
        for name, args in RENDERINGS.items()
    }


@pytest.fixture(scope="module")
def kustomized() -> list[dict[str, Any]]:
    return km.render(OVERLAY)


# --- the chart as Helm sees it --------------------------------------------------------------------


def test_chart_is_this_release() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert KUBERNETES_VERSION == km.KUBERNETES_VERSION
    assert chart["kubeVersion"] == f">={KUBERNETES_VERSION}-0"


@pytest.mark.parametrize("values", [None, *sorted(p.name for p in CI.glob("*.yaml"))])
def test_helm_lint_strict(helm: str, values: str | None) -> None:
    args = [helm, "lint", "--strict", "--kube-version", KUBERNETES_VERSION, str(CHART)]
    if values:
        args += ["-f", str(CI / values)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


def test_schema_knows_every_setting() -> None:
    """The settings part of values.schema.json is derived from retryd's Settings: a new
    setting must be added (python -m tests.integration.helm_support writes it)."""
    schema = json.loads(SCHEMA.read_text())
    assert schema["properties"]["settings"] == helm_support.settings_schema()
    assert schema["additionalProperties"] is False
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("settings.no_such_setting=1", "no_such_setting"),
        ("settings.sidecar_port=9000", "sidecar_port"),  # the chart's: sidecar.port
        ("settings.api_tokens[0]=inline-token", "api_tokens"),  # tokens go in the Secret
        ("settings.log_format=xml", "log_format"),
        ("settings.max_in_flight=many", "max_in_flight"),
        ("sidecar.port=0", "sidecar/port"),
        ("worker.processes=0", "worker/processes"),
        ("worker.resources.limits.cpu=lots", "worker/resources/limits/cpu"),
        ("terminationGracePeriodSeconds=30", "terminationGracePeriodSeconds"),
        ("podMonitor.enabled=yes", "podMonitor/enabled"),
        ("replicas=3", "replicas"),  # replicaCount, misspelt
        ("business.name=worker", "business/name"),
    ],
)
def test_schema_refuses_a_bad_value(helm: str, setting: str, expected: str) -> None:
    out = render(helm, "--set", setting, check=False)
    assert out.returncode != 0, f"{setting} was accepted"
    assert "values don't meet the specifications of the schema" in out.stderr, out.stderr
    assert expected in out.stderr, out.stderr


def test_without_business_container_a_handler_is_required(helm: str) -> None:
    out = render(helm, "--set", "business.enabled=false", check=False)
    assert out.returncode != 0
    assert "handler: set it when business.enabled is false" in out.stderr
    objs = objects(
        helm, "--set", "business.enabled=false", "--set", "handler=python:orders.handlers:handle"
    )
    assert set(km.containers(objs)) == {"worker", "sidecar"}
    toml = tomllib.loads(km.one(objs, "ConfigMap")["data"]["retryd.toml"])
    assert toml["handler"] == "python:orders.handlers:handle"


# --- every rendering, checked as the kustomize base is ------------------------------------------


@pytest.mark.parametrize("name", list(RENDERINGS))
def test_rendering_passes_the_manifest_checks(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    objs = rendered[name]
    for obj in objs:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            km.test_podmonitor_shape(objs)
        else:
            kubernetes_validate.validate(obj, km.KUBERNETES_VERSION, strict=True)
    km.test_every_retryd_variable_is_a_setting(objs)
    if name == "all-on":  # its business container is not retryd: check retryd's containers
        _check_retryd_commands(objs)
    else:
        km.test_every_command_is_a_cli_command(objs)
    km.test_every_container_has_requests_and_limits(objs)
    km.test_selectors_match_the_pods(objs)
    if name != "existing-secret":
        km.test_generated_names_are_referenced(objs)


def _check_retryd_commands(objs: list[dict[str, Any]]) -> None:
    """km.test_every_command_is_a_cli_command for the containers of the retryd image only
    (all-on's application container has its own image and command)."""
    (image,) = {c["image"] for c in km.containers(objs).values() if c["name"] == "worker"}
    checked = 0
    for container in km.workloads(objs):
        if container["image"] != image:
            continue
        assert "command" not in container, "the image's entrypoint runs retryd: use args"
        km._check_command(container["args"])
        checked += 1
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            exec_ = container.get(probe, {}).get("exec")
            if exec_:
                assert exec_["command"][0] == "retryd"
                km._check_command(exec_["command"][1:])
                checked += 1
    assert checked == 5  # worker, its two probes, sidecar, topics


def test_default_rendering(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """Without values: the demo pod, no Secret (no tokens: the /v1 API is off), no PodMonitor
    (its CRD may be missing), and settings that load."""
    objs = rendered["default"]
    assert {o["kind"] for o in objs} == {
        "ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "Job",
    }  # fmt: skip
    pod = km.one(objs, "Deployment")["spec"]["template"]["spec"]
    assert "secrets" not in {v["name"] for v in pod["volumes"]}
    settings = load_settings(_write_toml(objs, tmp_path))
    assert settings.api_tokens_file is None and settings.kafka_file is None


def test_existing_secret(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["existing-secret"]
    assert "Secret" not in {o["kind"] for o in objs}
    for workload in ("Deployment", "Job"):
        volumes = km.one(objs, workload)["spec"]["template"]["spec"]["volumes"]
        (secret,) = [v["secret"] for v in volumes if "secret" in v]
        assert secret["secretName"] == "kafka-credentials"
    toml = tomllib.loads(km.one(objs, "ConfigMap")["data"]["retryd.toml"])
    assert toml["kafka_file"] == "/etc/retryd/secrets/kafka.properties"
    assert "api_tokens_file" not in toml


def test_like_kustomize_settings_ports_and_secrets(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    km.test_settings_ports_paths_and_secrets_match(rendered["like-kustomize"], tmp_path)


def test_all_on_settings_ports_and_secrets(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The all-on rendering's settings load as given (numbers, lists and tables through the
    chart's TOML), and its renamed business container, ports and paths agree."""
    from retryd.api.credentials import load_credentials

    objs = rendered["all-on"]
    values = yaml.safe_load((CI / "all-on-values.yaml").read_text())
    settings, _ = km._materialise(objs, tmp_path)
    for key, value in values["settings"].items():
        got = getattr(settings, key)
        got = getattr(got, "value", got)
        assert got == value, key
    assert {t.scope for t in load_credentials(settings).tokens} == {"read", "replay"}
    assert settings.kafka_common()["sasl.mechanism"] == "SCRAM-SHA-512"
    by_name = km.containers(objs)
    assert list(by_name) == ["orders-api", "worker", "sidecar"]
    business = by_name["orders-api"]
    assert business["image"] == "registry.example.com/orders-api:2.3.1"
    assert business["command"] == ["/app/orders-api"]
    assert settings.handler == "http://127.0.0.1:9000/retry/handle"
    assert business["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "business"}
    (port,) = by_name["sidecar"]["ports"]
    assert port["containerPort"] == settings.sidecar_port == 9090
    deployment = km.one(objs, "Deployment")
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "9090"
    assert template["metadata"]["labels"]["example.com/cost-centre"] == "42"
    assert km.one(objs, "Service")["spec"]["ports"][0] == {
        "name": "http", "port": 80, "targetPort": "http",
    }  # fmt: skip
    assert km.one(objs, "PodMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert km.one(objs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == "25%"
    assert by_name["worker"]["env"][0] == {"name": "RETRYD_PROCESSES", "value": "4"}
    assert deployment["metadata"]["name"] == "orders-retryd"
    assert template["spec"]["terminationGracePeriodSeconds"] == 120


def _write_toml(objs: list[dict[str, Any]], directory: Path) -> Path:
    path = directory / "retryd.toml"
    path.write_text(km.one(objs, "ConfigMap")["data"]["retryd.toml"])
    return path


# --- no drift from the kustomize base ------------------------------------------------------------


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif (
        isinstance(value, list)
        and value
        and all(isinstance(i, dict) and "name" in i for i in value)
    ):
        # named lists (containers, env, ports, volumes): by name, and their order
        out[f"{prefix}[names]"] = [item["name"] for item in value]
        for item in value:
            rest = {k: v for k, v in item.items() if k != "name"}
            _flatten(rest, f"{prefix}.{item['name']}", out)
    else:
        out[prefix] = value


def pod_facts(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The workload objects as flat ``path: value`` pairs, allow-listed paths removed."""
    deployment = km.one(objs, "Deployment")
    job = km.one(objs, "Job")
    whole = {
        "deployment": {k: v for k, v in deployment["spec"].items() if k != "template"},
        "pod": copy.deepcopy(deployment["spec"]["template"]),
        "job": {"name": job["metadata"]["name"], **copy.deepcopy(job["spec"])},
        "pdb": km.one(objs, "PodDisruptionBudget")["spec"],
        "service": km.one(objs, "Service")["spec"],
        "podmonitor": km.one(objs, "PodMonitor")["spec"],
        "kinds": sorted(o["kind"] for o in objs),
        "settings": tomllib.loads(km.one(objs, "ConfigMap")["data"]["retryd.toml"]),
    }
    flat: dict[str, Any] = {}
    _flatten(whole, "", flat)
    return {p: v for p, v in flat.items() if not any(a in p for a in DRIFT_ALLOWED)}


def drift(chart: list[dict[str, Any]], kustomize: list[dict[str, Any]]) -> dict[str, Any]:
    a, b = pod_facts(chart), pod_facts(kustomize)
    return {
        path: {"chart": a.get(path, "<missing>"), "kustomize": b.get(path, "<missing>")}
        for path in sorted(set(a) | set(b))
        if a.get(path, "<missing>") != b.get(path, "<missing>")
    }


def test_no_drift_from_the_kustomize_overlay(
    rendered: dict[str, list[dict[str, Any]]], kustomized: list[dict[str, Any]]
) -> None:
    """The overlay and the chart with the same settings (ci/kustomize-example-values.yaml):
    containers, images, arguments, ports, environment, probes, mounts, security contexts,
    resources, volumes, the pod's settings, the PDB, Service, PodMonitor and topics Job are
    the same, but for DRIFT_ALLOWED."""
    facts = pod_facts(kustomized)
    assert len(facts) > 150, "the comparison must cover the pod, not a handful of fields"
    assert any(p.startswith("pod.spec.containers.worker.livenessProbe") for p in facts)
    assert drift(rendered["like-kustomize"], kustomized) == {}


def test_the_drift_check_sees_a_difference(helm: str, kustomized: list[dict[str, Any]]) -> None:
    """Not vacuous: one changed value in the chart shows as exactly that path."""
    changed = objects(
        helm, *LIKE_KUSTOMIZE, "--set", "sidecar.livenessProbe.timeoutSeconds=4",
        namespace="orders",
    )  # fmt: skip
    assert drift(changed, kustomized) == {
        "pod.spec.containers.sidecar.livenessProbe.timeoutSeconds": {"chart": 4, "kustomize": 3}
    }
