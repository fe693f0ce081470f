"""The Helm chart in deploy/helm/retryd, rendered for the tests; the part of its values schema
that is derived from retryd's settings.

``settings_schema()`` is what ``values.schema.json`` must say about ``.Values.settings``: every
setting of ``retryd.config.Settings`` with its JSON type, except the ones the chart sets from
its own values (they are tied to its mounts and ports) and the inline tokens (tokens belong in
the Secret, not in a ConfigMap). A test compares it with the file; after adding a setting,
write the file again with ``python -m tests.integration.helm_support``.
"""

from __future__ import annotations

import enum
import json
import subprocess
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from retryd.config import Settings

REPO = Path(__file__).resolve().parents[2]
# The oldest Kubernetes the manifests are meant for (test_kubernetes_manifests.py): the chart's
# kubeVersion, and the cluster version Helm renders and lints for.
KUBERNETES_VERSION = "1.30.0"
CHART = REPO / "deploy" / "helm" / "retryd"
SCHEMA = CHART / "values.schema.json"

# Set by the chart from its values (the value that sets each one).
CHART_OWNED = {
    "handler": "handler (empty: the business container's URL)",
    "state_dir": "the shared emptyDir, /var/lib/retryd",
    "sidecar_host": "0.0.0.0",
    "sidecar_port": "sidecar.port",
    "api_tokens_file": "secret.apiTokens or secret.existingSecret",
    "kafka_file": "secret.kafkaProperties or secret.existingSecret",
    "processes": "worker.processes (RETRYD_PROCESSES)",
}
INLINE_SECRETS = {"api_token", "api_tokens"}


def _json_type(annotation: Any) -> dict[str, Any]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (only,) = args  # X | None: a null value removes the key (Helm's rule)
        return _json_type(only)
    origin = typing.get_origin(annotation)
    if origin is list:
        return {"type": "array", "items": _json_type(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _json_type(args[1])}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"type": "string", "enum": [e.value for e in annotation]}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer"}
    if annotation is float:
        return {"type": "number"}
    if annotation is str or annotation is Path:
        return {"type": "string"}
    raise TypeError(f"no JSON type for the setting type {annotation!r}")


def settings_schema() -> dict[str, Any]:
    properties = {
        name: _json_type(field.annotation)
        for name, field in sorted(Settings.model_fields.items())
        if name not in CHART_OWNED and name not in INLINE_SECRETS
    }
    return {
        "type": "object",
        "description": (
            "retryd.toml (config/retryd.toml documents every key). Not here, set by the "
            "chart: "
            + "; ".join(f"{k} from {v}" for k, v in CHART_OWNED.items())
            + ". Tokens go in the Secret (secret.apiTokens), never in the settings."
        ),
        "additionalProperties": False,
        "properties": properties,
    }


def render(
    helm: str,
    *args: str,
    release: str = "retryd",
    namespace: str = "default",
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [
            helm,
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            KUBERNETES_VERSION,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check:
        assert out.returncode == 0, out.stderr
    return out


def objects(helm: str, *args: str, **kwargs: Any) -> list[dict[str, Any]]:
    out = render(helm, *args, **kwargs)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


if __name__ == "__main__":  # write the settings part of values.schema.json again
    schema = json.loads(SCHEMA.read_text())
    schema["properties"]["settings"] = settings_schema()
    SCHEMA.write_text(json.dumps(schema, indent=2) + "\n")
