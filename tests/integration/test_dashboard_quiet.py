"""On a healthy, quiet system every dashboard panel shows a number, never "No data".

One pod (a worker with a handler that always succeeds, and its sidecar) handles a few records;
nothing fails, nothing is skipped, replayed, dead-lettered or held by a circuit. Prometheus
(the Debian package) scrapes the sidecar. Every query of every panel must then return at least
one series of numbers (NaN, e.g. a latency quantile of no observations, is drawn as nothing),
and the panels of events that did not happen must show 0: an operator reads an empty panel as
"the exporter is broken", a 0 as "nothing of that kind happened".
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.prometheus_support import (
    ALERTS,
    PROMETHEUS,
    PrometheusServer,
    dashboard,
    panel_queries,
    rules_with_short_for,
    substitute,
)
from tests.integration.sidecar_support import REPO, Env, SidecarProcess
from tests.integration.worker_support import stop_process
from tests.support import create_topics, produce, unique, wait_for

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not on PATH (apt-get install prometheus)"
)

JOB = "retryd-quiet"

# Panels of events a quiet system never has: each must show exactly 0 (not "No data").
ZERO_PANELS = {
    "Dead letters by reason",
    "Dead letters in range",
    "Replayed in range",
    "Replays by status",
    "Abandoned handler calls",
    "Skipped tier records",
    "Circuit transitions, held records and probes",
    "Blocked keys",
    "Quick retries and parked records",
}


def test_every_panel_shows_a_number_on_a_quiet_system(bootstrap: str, tmp_path: Path) -> None:
    group = unique("g")
    main = unique("quiet")
    extra = {
        "RETRYD_HANDLER": "python:tests.handlers_for_tests:ok",
        "RETRYD_METRICS_INTERVAL_S": "1",
        "RETRYD_HEARTBEAT_STALE_S": "5",
    }
    env = Env(bootstrap, tmp_path / "pod", main=main, other=main, group=group, extra=extra)
    create_topics(bootstrap, [main, f"{group}.retry_1s", f"{group}.retry_2s"], 2)
    create_topics(bootstrap, [env.failed], 1)
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    rules = tmp_path / "alerts.yml"
    rules_with_short_for(ALERTS, rules)
    worker: subprocess.Popen[bytes] | None = None
    sidecar.start()
    prom = PrometheusServer(tmp_path, [f"127.0.0.1:{sidecar.port}"], JOB, rules)
    try:
        with open(tmp_path / "worker.log", "ab") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "retryd", "worker"],
                env=env.env(sidecar.port),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        prom.start()
        wait_for(
            lambda: httpx.get(sidecar.url + "/readyz", timeout=5).status_code == 200,
            60,
            0.2,
            "the pod is ready (its worker joined)",
        )
        produce(bootstrap, main, [(f"k{i}".encode(), b"{}") for i in range(20)])
        wait_for(
            lambda: (
                prom.values(f'sum(retryd_messages_total{{group="{group}", outcome="success"}})')
                == {(): 20.0}
            ),
            60,
            0.5,
            "20 records handled, as Prometheus sees it",
        )
        values = {
            "job": JOB,
            "group": group,
            "instance": ".*",
            "topic": ".*",
            "datasource": "prometheus",
            "__rate_interval": "15s",
            "__range": "10m",
        }
        board = dashboard()
        queries = panel_queries(board)
        assert {q.panel for q in queries} >= ZERO_PANELS, "a panel this test names was renamed"
        empty: list[str] = []
        not_zero: list[str] = []
        for q in queries:
            expr = substitute(q.expr, values)
            try:
                wait_for(lambda expr=expr: prom.query(expr), 20, 0.5, q.panel)
            except AssertionError:
                empty.append(f"{q.panel} [{q.ref}]: {expr}")
                continue
            shown = prom.values(expr)
            if any(math.isnan(v) for v in shown.values()):
                empty.append(f"{q.panel} [{q.ref}] (NaN, drawn as nothing): {expr}")
            elif q.panel in ZERO_PANELS and any(v != 0 for v in shown.values()):
                not_zero.append(f"{q.panel} [{q.ref}]: {shown}")
        assert not empty, "panels showing No data on a quiet system:\n" + "\n".join(empty)
        assert not not_zero, "panels of events that did not happen, not 0:\n" + "\n".join(not_zero)
    finally:
        prom.stop()
        if worker is not None:
            stop_process(worker)
        sidecar.stop()
