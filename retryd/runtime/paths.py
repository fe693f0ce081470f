"""Where processes on one host share state: heartbeats and multiprocess metric files."""

from __future__ import annotations

import os
from pathlib import Path


def metrics_dir(state_dir: Path) -> Path:
    return state_dir / "metrics"


def heartbeat_dir(state_dir: Path) -> Path:
    return state_dir / "heartbeats"


def prepare_metrics_env(state_dir: Path, *, fresh: bool = False) -> Path:
    """Point prometheus-client's multiprocess mode at ``state_dir/metrics``.

    Must run before ``prometheus_client`` is imported in this process. ``fresh`` empties the
    directory (a supervisor starting a new deployment), otherwise counters of earlier worker
    processes keep counting, so totals survive worker restarts.
    """
    path = metrics_dir(state_dir)
    path.mkdir(parents=True, exist_ok=True)
    if fresh:
        for item in path.glob("*.db"):
            item.unlink(missing_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    import sys

    values = sys.modules.get("prometheus_client.values")
    if values is not None:
        # prometheus_client chose its value class at import; choose again now that the dir is set.
        values.ValueClass = values.get_value_class()  # type: ignore[attr-defined]
    return path
