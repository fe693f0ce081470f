"""A handler module whose import blocks until the test releases it: a worker caught in the
middle of its start (tests/integration/test_worker_processes.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

_gate = Path(os.environ["RETRYD_TEST_START_GATE"])
(_gate / "importing").touch()
_deadline = time.monotonic() + 60
while not (_gate / "release").exists() and time.monotonic() < _deadline:
    time.sleep(0.02)  # a stand-in for a slow import, polled against a deadline


def handle(record: object) -> None:
    """Every record succeeds."""
