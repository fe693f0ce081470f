"""Records that fail once and succeed when retried are not an outage (issue 23, item 5): on
real Kafka, the CLI worker at default settings (``retry_sequence=1s``, the circuit breaker on)
drains 20,000 such records within 3x the time it takes with the breaker off, in the same run,
and dead-letters nothing.

Two handlers (tests/integration/circuit_handlers.py): one fails every record's first attempt
(``retry_number == 0``: a record held and run again in place fails again, only its tier copy
succeeds), one fails every record's first call (a run again in place succeeds). Each drains
with the breaker off and on, in alternating order (off, on, on, off), each run with its own
topics and group. Time is the handler's own clock: from the first call to the last record's
first success. Measured (printed and written to ``circuit-retries-succeed-<handler>.json``):
drain time per run, the on/off ratio of the medians, calls, tier copies, circuit transitions.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.circuit_support import CallLog, circuit_of, records_in
from tests.integration.worker_support import deployment, stop_process
from tests.support import produce, wait_for

RECORDS = 20_000
PARTITIONS = 6
ORDER = (False, True, True, False)  # breaker off / on, alternating (drift cancels out)
MAX_RATIO = 3.0
# A run that takes longer has stalled (the breaker off drains in about 3 s here; the issue saw
# 7 minutes with it on): the test stops there and fails with what the run got.
DRAIN_TIMEOUT_S = 30.0


def _drain(bootstrap: str, run_dir: Path, handler: str, breaker: bool) -> dict[str, Any]:
    """One run: 20,000 records on a fresh main topic, the CLI worker until every one succeeded."""
    run_dir.mkdir()
    dep = deployment(
        bootstrap,
        run_dir,
        sequence="1s",
        handler=f"python:tests.integration.circuit_handlers:{handler}",
        partitions=PARTITIONS,
        circuit_breaker=breaker,
        # the worker's defaults (the deployment's are shorter, for tests that hang calls)
        handler_timeout_s=30.0,
        max_poll_interval_ms=300_000,
    )
    produce(bootstrap, dep.main, ((f"k{i}".encode(), f"r-{i}".encode()) for i in range(RECORDS)))
    calls = CallLog(run_dir / "calls.log")
    worker = dep.spawn_worker(calls.path)
    stalled = None
    try:
        try:
            wait_for(
                lambda: calls.read() == RECORDS,
                DRAIN_TIMEOUT_S,
                interval=0.1,
                what=f"{RECORDS} records to succeed",
            )
        except AssertionError as exc:
            stalled = str(exc)
        circuit = circuit_of(dep.settings.state_dir)
    finally:
        code = stop_process(worker)
    log = next(run_dir.glob("*.stderr")).read_text(errors="replace")
    transitions = [line.strip() for line in log.splitlines() if " circuit " in line]
    return {
        "breaker": breaker,
        "drain_s": None if stalled else round(calls.drain_s(), 3),
        "stalled": stalled,
        "succeeded": len(calls.ok_s),
        "calls": calls.calls,
        "failed_calls": calls.failures,
        "tier_copies": records_in(bootstrap, dep.tier("1s")),
        "dead_lettered": records_in(bootstrap, dep.failed),
        "circuit": {k: circuit.get(k) for k in ("state", "transitions", "probes", "held")},
        "circuit_log": transitions[:20],
        "circuit_log_lines": len(transitions),
        "exit_code": code,
    }


@pytest.mark.parametrize("handler", ["fail_first_attempt", "fail_first_call"])
def test_records_that_succeed_when_retried_drain_with_the_breaker_on(
    bootstrap: str, tmp_path: Path, handler: str
) -> None:
    started = time.monotonic()
    runs = []
    for i, on in enumerate(ORDER):
        runs.append(_drain(bootstrap, tmp_path / f"{i}-{'on' if on else 'off'}", handler, on))
        if runs[-1]["stalled"]:
            break  # the verdict is in: no need to wait for another stall

    def median(on: bool) -> float | None:
        """The median drain time with the breaker ``on``/off; None when a run stalled."""
        got = [r["drain_s"] for r in runs if r["breaker"] is on]
        return None if not got or None in got else statistics.median(got)

    off, on = median(False), median(True)
    report = {
        "handler": handler,
        "records": RECORDS,
        "partitions": PARTITIONS,
        "retry_sequence": "1s",
        "drain_s_breaker_off_median": off,
        "drain_s_breaker_on_median": on,
        "ratio_on_off": round(on / off, 2) if on and off else None,
        "test_s": round(time.monotonic() - started, 1),
        "runs": runs,
    }
    (tmp_path / f"circuit-retries-succeed-{handler}.json").write_text(json.dumps(report, indent=2))
    print("circuit, retries succeed:", json.dumps(report))

    for r in runs:
        assert r["stalled"] is None, r
        assert r["succeeded"] == RECORDS, r
        assert r["dead_lettered"] == 0, r
        assert r["exit_code"] == 0, r
    assert on is not None and off is not None and on <= MAX_RATIO * off, report
