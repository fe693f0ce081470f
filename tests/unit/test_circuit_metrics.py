"""The circuit breaker's metrics: ``PrometheusSink.circuit`` and what the sidecar serves.

In this process the sink's updates are read back from prometheus-client's registry; across
processes, real worker-like processes (``--processes`` children decide alone) write their
multiprocess files into one metrics dir and the sidecar's ``SidecarCollector`` serves them:
the worst live process's state, counters summed, ``group`` on every series, and a dead
process's state gone once it is marked dead (as the supervisor does)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.multiprocess import mark_process_dead

from retryd.metrics.sink import PrometheusSink
from retryd.policy.circuit import Breaker, BreakerPolicy, CircuitAction, CircuitSnapshot

REPO = Path(__file__).resolve().parents[2]


def value(name: str, **labels: str) -> float:
    found = REGISTRY.get_sample_value(name, labels)
    return found if found is not None else 0.0


def totals() -> dict[str, float]:
    return {
        "open": value("retryd_circuit_transitions_total", to="open"),
        "half_open": value("retryd_circuit_transitions_total", to="half_open"),
        "closed": value("retryd_circuit_transitions_total", to="closed"),
        "held": value("retryd_circuit_held_total"),
        "probes": value("retryd_circuit_probes_total"),
    }


def test_sink_sets_the_state_and_adds_only_what_is_new() -> None:
    sink = PrometheusSink(["t.retry_1s"])
    assert value("retryd_circuit_state") == 0  # closed from the start
    for state in ("open", "half_open", "closed"):  # every transition series exists at start
        found = REGISTRY.get_sample_value("retryd_circuit_transitions_total", {"to": state})
        assert found is not None, state
    start = totals()
    now = 1_000
    breaker = Breaker(BreakerPolicy(probe_initial_s=1), now, draw=lambda: 0.5)

    def publish() -> CircuitSnapshot:
        snap = breaker.snapshot()
        sink.circuit(snap)
        return snap

    breaker.force(CircuitAction.OPEN, now, "ops")
    breaker.count_held(4)
    publish()
    assert value("retryd_circuit_state") == 2
    publish()  # the same snapshot again (e.g. only the last error changed): nothing added
    now += 1500
    assert breaker.probe_due(now)
    publish()
    assert value("retryd_circuit_state") == 1
    breaker.probe_failed(now, "ConnectionError at t/0/1")
    breaker.count_held()
    publish()
    assert value("retryd_circuit_state") == 2
    breaker.force(CircuitAction.CLOSE, now, "ops")
    publish()
    assert value("retryd_circuit_state") == 0
    end = totals()
    delta = {k: end[k] - start[k] for k in end}
    assert delta == {"open": 2, "half_open": 1, "closed": 1, "held": 5, "probes": 1}


WORKER = textwrap.dedent(
    """
    import sys
    from retryd.runtime.paths import prepare_metrics_env
    from pathlib import Path
    prepare_metrics_env(Path(sys.argv[1]))
    from retryd.metrics.sink import PrometheusSink
    from retryd.policy.circuit import Breaker, BreakerPolicy, CircuitAction
    sink = PrometheusSink([])
    breaker = Breaker(BreakerPolicy(), 0, draw=lambda: 0.5)
    if sys.argv[2] == "open":
        breaker.force(CircuitAction.OPEN, 1, "ops")
        breaker.count_held(7)
    sink.circuit(breaker.snapshot())
    import os
    print("done", os.getpid(), flush=True)
    """
)


SIDECAR = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from retryd.runtime.paths import metrics_dir, prepare_metrics_env
    prepare_metrics_env(Path(sys.argv[1]))  # as `retryd sidecar` does
    from retryd.metrics.exposition import SidecarCollector, exposition
    print(exposition(SidecarCollector(metrics_dir(Path(sys.argv[1])), group="g")).decode())
    """
)


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RETRYD_", "PROMETHEUS_"))}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def run_worker(state_dir: Path, state: str) -> int:
    """A process that reports ``state`` through the sink, then exits; returns its PID."""
    proc = python(WORKER, str(state_dir), state)
    assert proc.returncode == 0 and proc.stdout.startswith("done "), proc.stderr[-2000:]
    return int(proc.stdout.split()[1])


def served(state_dir: Path) -> dict[str, float]:
    """The circuit series a sidecar process serves for ``state_dir``."""
    proc = python(SIDECAR, str(state_dir))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = {}
    text = proc.stdout
    for line in text.splitlines():
        if line.startswith("retryd_circuit"):
            name, _, number = line.rpartition(" ")
            out[name] = float(number)
    return out


def test_sidecar_serves_the_worst_live_process_with_the_group(tmp_path: Path) -> None:
    closed_pid = run_worker(tmp_path, "closed")
    open_pid = run_worker(tmp_path, "open")
    assert closed_pid != open_pid
    series = served(tmp_path)
    assert series['retryd_circuit_state{group="g"}'] == 2  # worst of the live processes
    assert series['retryd_circuit_transitions_total{group="g",to="open"}'] == 1
    assert series['retryd_circuit_transitions_total{group="g",to="closed"}'] == 0
    assert series['retryd_circuit_held_total{group="g"}'] == 7
    assert series['retryd_circuit_probes_total{group="g"}'] == 0
    # The open process died (the supervisor marks it dead): its state goes, its counts stay.
    mark_process_dead(open_pid, str(tmp_path / "metrics"))
    series = served(tmp_path)
    assert series['retryd_circuit_state{group="g"}'] == 0
    assert series['retryd_circuit_held_total{group="g"}'] == 7


def test_sink_counts_quick_retries_and_the_records_they_rescued() -> None:
    from retryd.worker.events import BatchStats

    sink = PrometheusSink([])
    before = (value("retryd_quick_retries_total"), value("retryd_quick_rescued_total"))
    stats = BatchStats()
    stats.quick_retries, stats.quick_rescued = 7, 3
    sink.batch(stats, 0.0, 1.0)
    sink.batch(BatchStats(), 1.0, 2.0)
    after = (value("retryd_quick_retries_total"), value("retryd_quick_rescued_total"))
    assert (after[0] - before[0], after[1] - before[1]) == (7, 3)
