"""Schemathesis against the served OpenAPI schema of a real `retryd sidecar`: no 5xx, every
response matches the documented status codes, content types and schemas. Then the hostile
inputs a schema does not describe (issue 9, item 5): a tampered cursor nested thousands deep
(400, not a 500 RecursionError), bodies over the size limit with and without Content-Length
(413 before parsing), a deeply nested JSON body (422)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from retryd.runtime.heartbeat import HeartbeatWriter
from tests.integration.sidecar_support import TOKEN, Env, SidecarProcess, failed_headers, seed

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
# Every built-in check but two: use_after_free (DELETE /v1/replays/{id} cancels a job and its
# progress stays readable on purpose, the spec: "progress says where it stopped", so GET after
# DELETE is 200) and object_level_authorization (one token, no per-user objects).
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "positive_data_acceptance",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
    "ensure_resource_availability",
    "ignored_auth",
]
CONFIG = """
# 400 is the answer to a cursor that is a valid string but not one this API handed out
# (opaque cursors cannot be described by a schema); 413 to a body over the size limit (a schema
# bounds each field, not their sum); 503 when Kafka does not answer in time.
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "401", "403", "404", "409", "413", "429", "503"]

# A body over the size limit is rejected with 413 before anything parses it.
[checks.negative_data_rejection]
expected-statuses = [
  "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429",
]
"""
MAX_BODY = 65536  # sidecar_max_body_bytes, the default


def _chunks(total: int, size: int = 16384) -> Iterator[bytes]:
    """A body sent chunked (no Content-Length): the limit must hold without one."""
    sent = 0
    while sent < total:
        part = min(size, total - sent)
        sent += part
        yield b" " * part


def check_hostile_inputs(url: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        deep = base64.urlsafe_b64encode(b"[" * 6_000 + b"]" * 6_000).decode().rstrip("=")
        for cursor in (deep, base64.urlsafe_b64encode(b'{"0": {"0": 1}}').decode(), "%%%"):
            r = client.get("/v1/failed", params={"cursor": cursor})
            assert r.status_code == 400, (cursor[:40], r.status_code, r.text[:300])
            assert r.json()["error"] == "bad_request"
        json_headers = {"content-type": "application/json"}
        big = b"{" + b" " * (5 * 1024 * 1024) + b"}"
        r = client.post("/v1/replays", content=big, headers=json_headers)
        assert r.status_code == 413, r.text[:300]
        assert r.json()["error"] == "payload_too_large"
        r = client.post("/v1/replays", content=_chunks(MAX_BODY + 1), headers=json_headers)
        assert r.status_code == 413, r.text[:300]
        r = client.post("/v1/failed/0/0/replay", content=_chunks(5 * 1024 * 1024))
        assert r.status_code == 413, r.text[:300]
        # Within the limit, a body reaches validation: padded valid JSON is accepted as JSON.
        padded = b'{"dry_run": true, "bogus": 1}' + b" " * (MAX_BODY - 40)
        r = client.post("/v1/replays", content=padded, headers=json_headers)
        assert r.status_code == 422 and "bogus" in r.text, r.text[:300]
        nested = b"[" * 30_000 + b"]" * 30_000
        r = client.post("/v1/replays", content=nested[: MAX_BODY - 1], headers=json_headers)
        assert r.status_code == 422, r.text[:300]
        r = client.post("/v1/replays", content=b"[" * 20_000 + b"]" * 20_000, headers=json_headers)
        assert r.status_code == 422, r.text[:300]
        # A body on a GET is bounded too.
        r = client.request("GET", "/v1/failed", content=_chunks(MAX_BODY * 2))
        assert r.status_code == 413, r.text[:300]
        assert client.get("/healthz").status_code == 200


def test_openapi_schema_is_complete(bootstrap: str, tmp_path: Path) -> None:
    env = Env(bootstrap, tmp_path / "state", extra={"RETRYD_HEARTBEAT_STALE_S": "3600"})
    env.create(failed_partitions=1)
    # A real heartbeat file (this process) so /readyz can answer 200, not only 503.
    heartbeat = HeartbeatWriter(env.state_dir, "all", env.group)
    heartbeat.beat(assigned=1, paused=0, force=True)
    seed(bootstrap, env.failed, [(b"k", b"v", failed_headers(env.main)) for _ in range(3)])
    with SidecarProcess(env, tmp_path / "sidecar.log") as sidecar:
        schema = httpx.get(sidecar.url + "/openapi.json", timeout=10).json()
        paths = schema["paths"]
        assert set(paths) == {
            "/healthz",
            "/readyz",
            "/metrics",
            "/v1/failed",
            "/v1/failed/{partition}/{offset}",
            "/v1/failed/{partition}/{offset}/replay",
            "/v1/replays",
            "/v1/replays/{job_id}",
            "/v1/circuit",
        }
        for path, ops in paths.items():
            for method, op in ops.items():
                codes = set(op["responses"])
                if path.startswith("/v1"):
                    assert {"200", "401", "422", "503"} <= codes | {"200"}, (path, method)
                    assert op.get("security"), (path, method)
                for code, resp in op["responses"].items():
                    assert resp.get("description"), (path, method, code)
        config = tmp_path / "schemathesis.toml"
        config.write_text(CONFIG)
        args = [
            str(SCHEMATHESIS),
            "--config-file",
            str(config),
            "run",
            sidecar.url + "/openapi.json",
            "--header",
            f"Authorization: Bearer {TOKEN}",
            "--checks",
            ",".join(CHECKS),
            "--max-examples",
            "12",
            "--workers",
            "1",
            "--seed",
            "20261121",
            "--request-timeout",
            "30",
            "--no-color",
            "--generation-database",
            "none",
        ]
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=480,
            env={**os.environ, "NO_COLOR": "1"},
        )
        out = proc.stdout + proc.stderr
        print(out[-4000:])
        assert proc.returncode == 0, out[-8000:]
        check_hostile_inputs(sidecar.url)
    heartbeat.remove()
    log = (tmp_path / "sidecar.log").read_text()
    assert "Traceback" not in log, log[-4000:]
    assert json.dumps(schema)  # the schema itself is plain JSON
