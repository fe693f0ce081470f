"""A real Prometheus server for tests (the Debian ``prometheus`` package), and the shipped
dashboard's queries with Grafana's variables filled in.

The server scrapes given targets every second and evaluates a copy of the shipped alert rules
every second; it is started on a free loopback port and stopped by PID.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from retryd.kafka.embedded import free_port
from tests.support import wait_for

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "retryd.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST = REPO / "deploy" / "prometheus" / "alerts_test.yml"
PROMETHEUS = shutil.which("prometheus")
VARIABLE_RE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref: str
    expr: str


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panel_queries(board: dict[str, Any]) -> list[PanelQuery]:
    return [
        PanelQuery(p["title"], t["refId"], t["expr"])
        for p in board["panels"]
        if p.get("type") != "row"
        for t in p.get("targets", [])
    ]


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variables (``$name`` and ``${name}``) replaced; an unknown one is an error."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr}")
        return values[name]

    return VARIABLE_RE.sub(one, expr)


RANGE_RE = re.compile(r"\[\d+[smhdwy]\]")


def rules_with_short_for(
    path: Path, target: Path, for_: str = "1s", windows: dict[str, str] | None = None
) -> dict[str, str]:
    """A copy of the shipped rules with every ``for`` shortened and, for the alerts named in
    ``windows``, every range (``[5m]``) set to the given one (the expressions otherwise
    unchanged); returns alert name -> shipped expression."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    exprs = {}
    for group in data["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            exprs[rule["alert"]] = rule["expr"]
            if "for" in rule:
                rule["for"] = for_
            window = (windows or {}).get(rule["alert"])
            if window is not None:
                shortened = RANGE_RE.sub(f"[{window}]", rule["expr"])
                assert shortened != rule["expr"], f"{rule['alert']} has no range to shorten"
                rule["expr"] = shortened
    target.write_text(yaml.safe_dump(data), encoding="utf-8")
    return exprs


class PrometheusServer:
    def __init__(self, workdir: Path, targets: list[str], job: str, rule_file: Path) -> None:
        assert PROMETHEUS is not None, "prometheus is not installed (apt-get install prometheus)"
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rule_file)],
            "scrape_configs": [
                {
                    "job_name": job,
                    "scrape_timeout": "1s",
                    "static_configs": [{"targets": targets}],
                }
            ],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrometheusServer:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    str(PROMETHEUS),
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                return httpx.get(self.url + "/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 30, 0.1, "prometheus /-/ready")
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def api(self, path: str, **params: Any) -> Any:
        resp = httpx.get(self.url + "/api/v1/" + path, params=params, timeout=10)
        body = resp.json()
        assert resp.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; the result vector (raises on a query Prometheus rejects)."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def values(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in self.query(expr)}

    def firing(self, alert: str) -> list[dict[str, str]]:
        alerts = self.api("alerts")["alerts"]
        return [
            a["labels"]
            for a in alerts
            if a["labels"]["alertname"] == alert and a["state"] == "firing"
        ]

    def series(self, match: str) -> list[dict[str, str]]:
        result: list[dict[str, str]] = self.api("series", **{"match[]": match})
        return result

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
