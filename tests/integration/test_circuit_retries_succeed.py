"""Records that fail once and succeed when retried are not an outage (issue 23, item 5): on
real Kafka, the CLI worker at default settings (``retry_sequence=1s``, the circuit breaker on)
drains 20,000 such records, and dead-letters nothing, with the breaker on as with it off.

Two handlers (tests/integration/circuit_handlers.py): one fails every record's first attempt
(``retry_number == 0``: a record held and run again in place fails again, only its tier copy
succeeds), one fails every record's first call (a run again in place succeeds). Each drains
with the breaker off and on, in alternating order (off, on, on, off), each run with its own
topics and group.

What is asserted is the guarantee, never the machine's speed: every record succeeds, none is
dead-lettered, the worker exits cleanly, and the drain never stands still: after the worker's
first call one more record succeeds at least every ``STALL_S`` (``CallLog.follow``), and the
circuit is never not-closed (holding every failure, starting nothing but its probe) for
``STALL_S`` at a stretch. A breaker holding a healthy workload fails both (issue 23 saw a
7-minute drain; the breaker's own pauses for a fail-once workload are one confirming call, or
an open until its first probe at the first tier delay, 1 s +-20 %). How fast it drains with
the breaker on against off is measured, printed and written to
``circuit-retries-succeed-<handler>.json`` (drain time per run on the handler's clock, from the
first call to the last record's first success; the on/off ratio of the medians; the longest
wait between two successes; calls, tier copies, the circuit's holds), not asserted: that is a
speed goal, a benchmark's to keep (issue 32). A fixed 30 s deadline from the spawn, and a
ratio, failed on a busy machine where the breaker did nothing wrong (issue 32, item 3: the
worker's start alone took up to 16 s there, and per-run drains of one test varied 4x while the
breaker confirmed once, closed within 0.1 s and never opened).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.circuit_support import CallLog, circuit_holds, circuit_of, records_in
from tests.integration.worker_support import deployment, stop_process
from tests.support import produce

RECORDS = 20_000
PARTITIONS = 6
ORDER = (False, True, True, False)  # breaker off / on, alternating (drift cancels out)
# The longest the drain may stand still (no record succeeds, or the circuit not closed). On the
# project's 2-core machine with 2 to 12 busy loops beside the test, the longest wait between two
# successes was 3.7 s (the tier delay after a confirmation) and the longest hold 3.3 s (an open
# whose first probe came before the tier copies were fetched); a breaker holding a healthy
# workload holds it for its whole probe backoff, which doubles up to 60 s.
STALL_S = 20.0
# The worker's start (imports, joining the group) is not under test: it took 1.3-16 s there.
# This only keeps a worker that never starts from hanging the test.
START_S = 120.0


def _drain(bootstrap: str, run_dir: Path, handler: str, breaker: bool) -> dict[str, Any]:
    """One run: 20,000 records on a fresh main topic, the CLI worker until every one succeeded
    or the drain stood still."""
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
    try:
        stalled = calls.follow(RECORDS, worker, start_s=START_S, stall_s=STALL_S)
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
        "longest_wait_s": round(calls.longest_wait_s(), 3),
        "calls": calls.calls,
        "failed_calls": calls.failures,
        "tier_copies": records_in(bootstrap, dep.tier("1s")),
        "dead_lettered": records_in(bootstrap, dep.failed),
        "circuit": {k: circuit.get(k) for k in ("state", "transitions", "probes", "held")},
        "circuit_holds_s": circuit_holds(log),
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
    for i, breaker in enumerate(ORDER):
        run_dir = tmp_path / f"{i}-{'on' if breaker else 'off'}"
        runs.append(_drain(bootstrap, run_dir, handler, breaker))
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
        assert max(r["circuit_holds_s"], default=0.0) < STALL_S, r
