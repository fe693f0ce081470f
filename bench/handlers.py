"""Business handlers the worker benchmarks run (``python:bench.handlers:<name>``).

They do as little as possible, so the benchmark measures retryd, not the handler. The
lateness handler records when each tier call started relative to its due time and writes the
samples when the process exits (``BENCH_LATENESS_FILE``).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from typing import Any

_LATENESS: list[int] = []
_LATENESS_FILE = os.environ.get("BENCH_LATENESS_FILE")
_DETAIL: list[str] | None = [] if os.environ.get("BENCH_LATENESS_DETAIL") else None


def noop(message: Any) -> None:
    """Success path."""


def burn(message: Any) -> None:
    """CPU-bound business code: about 50 µs of pure Python per record (process scaling)."""
    deadline = time.perf_counter() + 0.00005
    while time.perf_counter() < deadline:
        pass


def fail_first(message: Any) -> None:
    """Every message fails once on its main topic (routing path)."""
    if message.retry_number == 0:
        raise RuntimeError("bench: first attempt fails")


async def async_sleep20(message: Any) -> None:
    """An ``async def`` handler awaiting 20 ms."""
    await asyncio.sleep(0.02)


def tiers(message: Any) -> None:
    """Fails until retry ``k`` (the value's first byte, '0'-'3'): spreads traffic over the
    tiers; records the lateness of every tier call against ``retry_timestamp``."""
    if message.retry_number:
        due = message.header("retry_timestamp")
        if due is not None:
            _LATENESS.append(int(time.time() * 1000) - int(due))
            if _DETAIL is not None:
                _DETAIL.append(
                    f"{message.topic} {message.partition} {message.offset} "
                    f"{int(time.time() * 1000)} {int(due)}"
                )
    value = message.value or b"0"
    if message.retry_number < value[0] - 48:
        raise RuntimeError("bench: not yet")


def _dump() -> None:
    if _LATENESS_FILE and _LATENESS:
        with open(_LATENESS_FILE, "a", encoding="ascii") as fh:
            fh.write("\n".join(map(str, _LATENESS)) + "\n")
    if _DETAIL:
        with open(os.environ["BENCH_LATENESS_DETAIL"], "a", encoding="ascii") as fh:
            fh.write("\n".join(_DETAIL) + "\n")


atexit.register(_dump)


_CALLS_FILE = os.environ.get("BENCH_CALLS_FILE")


def sleep20_logged(message: Any) -> None:
    """A 20 ms call (a slow service) whose end time is appended to ``BENCH_CALLS_FILE`` in one
    write (``bench_share``: calls per second across processes)."""
    time.sleep(0.02)
    if _CALLS_FILE:
        fd = os.open(_CALLS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"%.6f\n" % time.time())
        finally:
            os.close(fd)
