"""Handlers retryd runs in the peer shapes (``python:bench.peers_py.handlers:<name>``).

``keyed`` sleeps a random 0-5 ms, as the Java peers' handlers do (a blocking call on one of
the worker's handler threads). ``fail_once`` fails every record's first call and records, per
call, the wall-clock millisecond it started (and, for a retried call, the copy's due time) in
``BENCH_PEERS_CALLS``: one line per call, written as it happens (1,000 lines a run), so
nothing is lost however the worker is stopped.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

_CALLS = os.environ.get("BENCH_PEERS_CALLS")
_LOCK = threading.Lock()
_FILE = open(_CALLS, "a", encoding="ascii", buffering=1) if _CALLS else None  # noqa: SIM115


def keyed(message: Any) -> None:
    """Key-ordered concurrency: a handler that waits 0-5 ms (I/O, not CPU)."""
    time.sleep(random.random() * 0.005)


def fail_once(message: Any) -> None:
    """Retry path: the first call fails, the retried call (from the 1 s tier) succeeds."""
    now = int(time.time() * 1000)
    if message.retry_number == 0:
        line = f"first {now}\n"
    else:
        line = f"retry {now} {int(message.header('retry_timestamp'))}\n"
    if _FILE is not None:
        with _LOCK:
            _FILE.write(line)
    if message.retry_number == 0:
        raise RuntimeError("bench: first attempt fails")
