"""Issue 9, item 2: /metrics does not grow with what clients send. Invented and unusual HTTP
methods on invented paths, with and without a token, leave only bounded label values (method
from a fixed set or ``other``, route = a route template or ``unmatched``, status from a fixed
set or its class); series an older sidecar left in the multiprocess files with free-form labels
are not served."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from retryd.kafka.embedded import free_port
from retryd.metrics.http import AUTH_FAILURE_REASONS, METHODS
from tests.integration.sidecar_support import TOKEN, Env, SidecarProcess

# Methods the HTTP parser lets through to the app (a made-up one may be refused before it).
WEBDAV = ["PROPFIND", "MKCOL", "LOCK", "UNLOCK", "SEARCH", "PURGE", "REPORT", "COPY", "MOVE"]
LEGACY = """
import os, sys
from prometheus_client import Counter
c = Counter("retryd_http_requests", "old", ["method", "route", "status"])
for i in range(int(sys.argv[1])):
    c.labels(method=f"M{i}", route=f"/v1/x{i}", status="299").inc()
"""


def _families(url: str) -> tuple[str, dict[str, list]]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return text, {fam.name: fam.samples for fam in text_string_to_metric_families(text)}


def test_request_metrics_keep_bounded_labels(tmp_path: Path) -> None:
    env = Env(f"127.0.0.1:{free_port()}", tmp_path / "state")  # no broker needed
    metrics_dir = env.state_dir / "metrics"
    metrics_dir.mkdir(parents=True)
    # What a sidecar that took labels from requests left behind (the files outlive it).
    subprocess.run(
        [sys.executable, "-c", LEGACY, "150"],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
        check=True,
    )
    with SidecarProcess(env, tmp_path / "sidecar.log") as sidecar:
        _, before = _families(sidecar.url)
        with httpx.Client(base_url=sidecar.url, timeout=10) as client:
            for i in range(300):
                method = WEBDAV[i % len(WEBDAV)] if i % 2 else f"INVENTED{i}"
                path = f"/v1/zz{i}" if i % 3 else f"/random/{i}/path"
                headers = {"Authorization": f"Bearer {TOKEN}"} if i % 5 == 0 else {}
                # A method the HTTP parser itself refuses may just close the connection.
                with contextlib.suppress(httpx.HTTPError):
                    client.request(method, path, headers=headers)
            for method in ("GET", "POST", "DELETE"):
                client.request(method, "/v1/failed", headers={"Authorization": "Bearer wrong"})
        text, after = _families(sidecar.url)
    requests = [s for s in after["retryd_http_requests"] if s.name.endswith("_total")]
    durations = after["retryd_http_request_duration_seconds"]
    routes = {s.labels["route"] for s in requests} | {s.labels["route"] for s in durations}
    methods = {s.labels["method"] for s in requests} | {s.labels["method"] for s in durations}
    statuses = {s.labels["status"] for s in requests}
    assert methods <= METHODS | {"other"}, methods
    assert "other" in methods  # the unusual methods did reach the app, and were folded
    assert routes <= {"unmatched", "/metrics", "/v1/failed", "/healthz"}, routes
    assert statuses <= {"200", "401", "403", "404", "405"}, statuses
    assert len(requests) <= 15, [s.labels for s in requests]
    auth = {s.labels["reason"]: s.value for s in after["retryd_http_auth_failures"]}
    assert set(auth) <= set(AUTH_FAILURE_REASONS)
    assert auth["invalid_token"] >= 3 and auth["missing_token"] >= 50, auth
    assert not any(
        s.labels.get("route", "").startswith("/v1/x") for s in before["retryd_http_requests"]
    )
    print(f"/metrics after 300 hostile requests: {len(text)} bytes, {len(requests)} request series")
    assert len(text) < 40_000, len(text)
