"""The chaos report: one JSON document per pytest session, one row per scenario.

Path: ``$RETRYD_CHAOS_REPORT``, else ``chaos-report.json`` in pytest's temporary directory.
A session starts the document afresh and each scenario appends its row as soon as it has its
numbers, *before* asserting, so a failing scenario is reported too. ``report-full.json`` beside
this module is the committed full-size run (README, "Reliability"), ``report-cluster-full.json``
that of the scenarios on a three-node cluster (``test_cluster_*.py``). A row added to them from
a later session (``test_strict_kills.py``'s) carries that session's ``seed`` and ``started``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from tests.conftest import broker_name

REPORT_ENV = "RETRYD_CHAOS_REPORT"

Row = dict[str, Any]


class ChaosReport:
    def __init__(self, path: Path, scale: str, seed: int) -> None:
        self.path = path
        self.doc: dict[str, Any] = {
            "suite": "retryd chaos (tests/chaos)",
            "scale": scale,
            "seed": seed,
            "broker": broker_name(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "scenarios": [],
        }
        self._write()

    def add(self, row: Row) -> None:
        self.doc["scenarios"].append(row)
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=2) + "\n")
        tmp.replace(self.path)


def report_path(default_dir: Path) -> Path:
    configured = os.environ.get(REPORT_ENV)
    return Path(configured) if configured else default_dir / "chaos-report.json"
