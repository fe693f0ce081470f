"""The dashboard and the alerts on a real Prometheus, scraping two real sidecars.

Two "pods" of one consumer group, as a Deployment with two replicas runs them: each has its own
state dir, a worker in HTTP mode (against the demo business service, which fails a share of
requests) and a sidecar. Prometheus (the Debian package) scrapes both sidecars every second
under a job not named "retryd", with the shipped alert rules (``for`` shortened in a copy, the
expressions unchanged). Then, through Prometheus's HTTP API:

- every dashboard panel query returns data (a metric a panel needs that retryd does not export
  fails here), and every template variable has values;
- every alert expression is accepted, and none fires on healthy traffic;
- a replay by ``retryd replay`` (another process) reaches the replay panel, counted once;
- the main-topic lag panel equals the true lag (committed offsets and log ends read
  independently), while a plain ``sum`` over both sidecars shows twice that;
- the promtool test series have the label sets the exporter really produces;
- an operator opens one pod's circuit breaker (``POST /v1/circuit``, circuit scope): its
  worker applies the order, ``retryd_circuit_state`` 2 is scraped, RetrydCircuitOpen fires
  for the group (its window shortened in the copy) and the circuit panels show it; closing
  resolves it;
- stopping the workers fires RetrydWorkerNotReady for both pods; stopping one sidecar fires
  RetrydSidecarDown for it, and the lag panel stays right with one sidecar left.

The tier template has no ``retry_`` in it, so nothing can find tiers by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from retryd.kafka.embedded import free_port
from retryd.policy.headers import Envelope, routed_headers
from retryd.replay.ledger import LedgerEntry, ReplayLedger
from tests.integration.prometheus_support import (
    ALERTS,
    ALERTS_TEST,
    PROMETHEUS,
    PrometheusServer,
    dashboard,
    panel_queries,
    rules_with_short_for,
    substitute,
)
from tests.integration.sidecar_support import REPO, TOKEN, Env, SidecarProcess
from tests.integration.worker_support import stop_process
from tests.support import create_topics, produce, read_topic, unique, wait_for

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not on PATH (apt-get install prometheus)"
)

JOB = "k8s-retryd-pods"
CIRCUIT_TOKEN = "ops-circuit-token-0123456789abcdef-xyz"
CIRCUIT_WINDOW = "3s"  # RetrydCircuitOpen's 5m, in the test's copy of the rules
TARGET_LABELS = {"job", "instance"}


@dataclass
class Pod:
    name: str
    env: Env
    sidecar: SidecarProcess
    worker: subprocess.Popen[bytes] | None = None

    def start_worker(self, log: Path) -> None:
        with open(log, "ab") as out:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "retryd", "worker"],
                env=self.env.env(self.sidecar.port),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )


def true_main_lag(bootstrap: str, topic: str, group: str) -> int:
    """The group's lag on ``topic`` without retryd's code: committed offsets asked as the
    group (no join), log ends counted by reading the topic."""
    ends: dict[int, int] = {}
    for rec in read_topic(bootstrap, topic):
        ends[rec.partition] = max(ends.get(rec.partition, 0), rec.offset + 1)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in ends], timeout=10)
    finally:
        consumer.close()
    return sum(ends[tp.partition] - max(tp.offset, 0) for tp in committed)


def test_dashboard_and_alerts_on_real_prometheus(bootstrap: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    group = unique("g")
    main = unique("orders")
    business_port = free_port()
    extra = {
        "RETRYD_MAIN_TOPICS": main,
        "RETRYD_RETRY_SEQUENCE": "1s,2s",
        "RETRYD_TIER_TEMPLATE": "{group}.delay-{delay}",
        "RETRYD_HANDLER": f"http://127.0.0.1:{business_port}/handle",
        "RETRYD_HANDLER_TIMEOUT_S": "5",
        "RETRYD_METRICS_INTERVAL_S": "1",
        "RETRYD_HEARTBEAT_STALE_S": "5",
        "RETRYD_LOG_FORMAT": "json",
        "RETRYD_API_TOKENS": f"ops:circuit:{CIRCUIT_TOKEN}",
    }
    pods = []
    for name in ("a", "b"):
        env = Env(bootstrap, tmp_path / name, main=main, other=main, group=group, extra=extra)
        pods.append(Pod(name, env, SidecarProcess(env, tmp_path / f"sidecar-{name}.log")))
    tiers = [f"{group}.delay-1s", f"{group}.delay-2s"]
    create_topics(bootstrap, [main, *tiers], 2)
    create_topics(bootstrap, [pods[0].env.failed], 1)
    business = subprocess.Popen(
        [
            *(sys.executable, "-m", "retryd", "demo", "business", "--port", str(business_port)),
            *("--fail-share", "0.3", "--not-found-share", "0.08", "--latency-ms", "1"),
            *("--seed", "3"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rules = tmp_path / "alerts.yml"
    shipped = rules_with_short_for(ALERTS, rules, windows={"RetrydCircuitOpen": CIRCUIT_WINDOW})
    prom = PrometheusServer(tmp_path, [f"127.0.0.1:{p.sidecar.port}" for p in pods], JOB, rules)
    try:
        for pod in pods:
            pod.sidecar.start()
            pod.start_worker(tmp_path / f"worker-{pod.name}.log")
        prom.start()
        for pod in pods:
            wait_for(
                lambda pod=pod: (
                    httpx.get(pod.sidecar.url + "/readyz", timeout=5).status_code == 200
                ),
                60,
                0.2,
                f"pod {pod.name} ready (its worker joined)",
            )
        started = time.monotonic()

        # Traffic: 300 orders; one tier record of another group (skipped, not handled).
        produce(
            bootstrap,
            main,
            [(f"c{i % 40}".encode(), f'{{"order": {i}}}'.encode()) for i in range(300)],
        )
        now_ms = int(time.time() * 1000)
        foreign = Envelope(main, 0, 0, now_ms, retry_number=1, retry_timestamp=now_ms, group="x")
        produce(bootstrap, tiers[0], [(b"k", b"v", routed_headers([], foreign))], partition=0)

        board = dashboard()
        values = {
            "job": JOB,
            "group": group,
            "instance": ".*",
            "topic": ".*",
            "datasource": "prometheus",
            "__rate_interval": "15s",
            "__range": "10m",
        }
        lag_expr = substitute(
            next(q.expr for q in panel_queries(board) if q.panel == "Main-topic lag"), values
        )

        def drained() -> bool:
            lag = prom.values(lag_expr)
            backlog = prom.values(f'max by (topic) (retryd_failed_backlog{{group="{group}"}})')
            tier = prom.values(
                "sum(max by (topic, partition) "
                f'(retryd_consumer_lag{{group="{group}", kind="tier"}}))'
            )
            return (
                bool(lag)
                and set(lag.values()) == {0.0}
                and sum(backlog.values()) > 0
                and set(tier.values()) == {0.0}
            )

        wait_for(drained, 120, 0.5, "traffic handled: main lag 0, tiers empty, dead letters")
        handled_s = time.monotonic() - started

        # A replay from another process (the CLI) reaches the replay panel, once.
        cli = subprocess.run(
            [sys.executable, "-m", "retryd", "replay", "--yes", "--json", "-b", bootstrap],
            env=pods[0].env.env(0),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr[-2000:]
        replayed = json.loads(cli.stdout)["replayed"]
        assert replayed > 0
        replay_expr = substitute(
            next(q.expr for q in panel_queries(board) if q.panel == "Replayed in range"), values
        )

        counted = f'retryd_replayed_total{{group="{group}", status="replayed", source="cli"}}'
        wait_for(
            lambda: list(prom.values(counted).values()) == [float(replayed)] * 2,
            60,
            0.5,
            f"both sidecars counted the {replayed} CLI replays from the ledger",
        )
        # The panel takes them once (increase() extrapolates a little: never twice as many).
        panel = {dict(k).get("source"): v for k, v in prom.values(replay_expr).items()}
        assert replayed <= panel["cli"] < 1.5 * replayed, (panel, replayed)
        # A Spark task's replay leaves the same trace: a ledger entry naming spark@<host>
        # (written here with the ReplayLedger the task uses, without starting Spark).
        ledger = ReplayLedger({"bootstrap.servers": bootstrap}, pods[0].env.ledger)
        try:
            ledger.record(f"{pods[0].env.failed}/0/999999", LedgerEntry("r-spark", by="spark@x"))
        finally:
            ledger.close()
        spark = counted.replace('source="cli"', 'source="spark"')
        wait_for(
            lambda: list(prom.values(spark).values()) == [1.0, 1.0],
            60,
            0.5,
            "a Spark replay counted from the ledger by both sidecars",
        )

        # Every panel returns data; every variable has values; every alert expression runs.
        missing: list[str] = []
        for q in panel_queries(board):
            expr = substitute(q.expr, values)
            try:
                wait_for(lambda expr=expr: prom.query(expr), 30, 0.5, q.panel)
            except AssertionError:
                missing.append(f"{q.panel} [{q.ref}]: {expr}")
        assert not missing, "panels without data:\n" + "\n".join(missing)
        assert not prom.query(f'sum(retryd_not_exported_total{{job="{JOB}"}})')  # would be caught
        for var in board["templating"]["list"]:
            if var["type"] != "query":
                continue
            metric_match = substitute(var["definition"], values)
            label = metric_match.rsplit(",", 1)[1].strip(" )")
            selector = metric_match.split("(", 1)[1].rsplit(",", 1)[0]
            found = prom.api(f"label/{label}/values", **{"match[]": selector})
            assert found, f"variable {var['name']}: {var['definition']} has no values"
        for expr in shipped.values():
            prom.query(expr)  # raises on a query Prometheus rejects
        assert not prom.firing("RetrydWorkerNotReady") and not prom.firing("RetrydSidecarDown")
        assert not prom.firing("RetrydCircuitOpen")

        # The promtool tests feed only label sets the exporter really produces.
        real: dict[str, set[frozenset[str]]] = {}
        for series in prom.series('{__name__=~"retryd_.+"}'):
            labels = frozenset(set(series) - TARGET_LABELS - {"__name__"})
            real.setdefault(series["__name__"], set()).add(labels)
        fed = yaml.safe_load(ALERTS_TEST.read_text())
        for case in fed["tests"]:
            for item in case["input_series"]:
                name, _, rest = item["series"].partition("{")
                if not name.startswith("retryd_"):
                    continue
                labels = (
                    frozenset(part.split("=")[0].strip() for part in rest.rstrip("}").split(","))
                    - TARGET_LABELS
                )
                assert labels in real.get(name, set()), (
                    f"alerts_test.yml feeds {name}{sorted(labels)}; the exporter produces "
                    f"{[sorted(x) for x in real.get(name, set())]}"
                )

        # The circuit breaker: an operator opens pod a's circuit through its sidecar; its worker
        # applies the order, Prometheus scrapes the state, the alert fires for the group and
        # the panels show it; closing resolves it.
        state_expr = substitute(
            next(q.expr for q in panel_queries(board) if q.panel == "Circuit state"), values
        )
        moves_expr = substitute(
            next(
                q.expr
                for q in panel_queries(board)
                if q.panel == "Circuit transitions, held records and probes" and q.ref == "A"
            ),
            values,
        )
        assert prom.values(state_expr) == {(("group", group),): 0.0}
        opened = time.monotonic()
        with pods[0].sidecar.client(CIRCUIT_TOKEN) as ops:
            r = ops.post("/v1/circuit", json={"action": "open"})
            assert r.status_code == 202, r.text
            firing = wait_for(
                lambda: prom.firing("RetrydCircuitOpen"), 60, 0.25, "RetrydCircuitOpen fires"
            )
            circuit_alert_s = time.monotonic() - opened
            assert [(a["group"], a["severity"]) for a in firing] == [(group, "critical")]
            assert prom.values(state_expr) == {(("group", group),): 2.0}
            per_pod = prom.values(f'retryd_circuit_state{{group="{group}"}}')
            assert sorted(per_pod.values()) == [0.0, 2.0], per_pod  # pod b stays closed
            wait_for(
                lambda: prom.values(moves_expr).get((("group", group), ("to", "open")), 0) > 0,
                30,
                0.5,
                "the transitions panel shows the opening",
            )
            r = ops.post("/v1/circuit", json={"action": "close"})
            assert r.status_code == 202, r.text
            wait_for(
                lambda: not prom.firing("RetrydCircuitOpen"), 60, 0.25, "RetrydCircuitOpen ends"
            )
            assert prom.values(state_expr) == {(("group", group),): 0.0}

        # Stop the workers: the worker alert fires for both pods.
        stopped = time.monotonic()
        for pod in pods:
            assert pod.worker is not None
            assert stop_process(pod.worker) == 0
        firing = wait_for(
            lambda: (
                len(prom.firing("RetrydWorkerNotReady")) == 2
                and prom.firing("RetrydWorkerNotReady")
            ),
            60,
            0.25,
            "RetrydWorkerNotReady for both pods",
        )
        alert_s = time.monotonic() - stopped
        assert {a["instance"] for a in firing} == {f"127.0.0.1:{p.sidecar.port}" for p in pods}
        assert {a["group"] for a in firing} == {group}

        # Lag with the workers gone: the panel shows the true lag, a plain sum twice that.
        produce(bootstrap, main, [(b"late", b'{"order": -1}')] * 37)
        truth = true_main_lag(bootstrap, main, group)
        assert truth >= 37

        def panel_lag() -> float:
            return sum(prom.values(lag_expr).values())

        wait_for(lambda: panel_lag() == truth, 60, 0.5, f"main-topic lag panel = {truth}")
        naive = f'sum(retryd_consumer_lag{{group="{group}", kind="main"}})'
        wait_for(
            lambda: list(prom.values(naive).values()) == [2 * truth],
            30,
            0.5,
            "a plain sum over the two sidecars: twice the lag",
        )
        assert panel_lag() == truth

        # One sidecar down: its alert fires; the lag stays right with the other one.
        down = pods[1].sidecar
        down.stop()
        wait_for(
            lambda: (
                [a["instance"] for a in prom.firing("RetrydSidecarDown")]
                == [f"127.0.0.1:{down.port}"]
            ),
            60,
            0.25,
            "RetrydSidecarDown for the stopped sidecar",
        )
        assert panel_lag() == truth

        # JSON logs (RETRYD_LOG_FORMAT=json): one object per line, never the API token.
        for log in [tmp_path / "sidecar-a.log", tmp_path / "worker-a.log"]:
            lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
            assert lines and all(json.loads(ln)["level"] for ln in lines), log
            assert TOKEN not in log.read_text() and CIRCUIT_TOKEN not in log.read_text()
        print(
            f"\nreal Prometheus: traffic handled in {handled_s:.1f}s, {replayed} CLI replays, "
            f"true lag {truth} (plain sum {2 * truth}), worker alert firing "
            f"{alert_s:.1f}s after the stop, circuit alert {circuit_alert_s:.1f}s after the "
            f"open order (window {CIRCUIT_WINDOW}), test {time.monotonic() - t0:.1f}s"
        )
    finally:
        prom.stop()
        for pod in pods:
            if pod.worker is not None:
                stop_process(pod.worker)
            pod.sidecar.stop()
        stop_process(business)
