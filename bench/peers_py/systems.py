"""How ``bench/bench_peers.py`` runs each system on one prepared topic and what it reads back.

Every runner gets a topic already holding its records (produced before the consumer starts)
and a fresh group, and returns one figure: ``handled``, ``wall_s`` and ``cpu_s`` from the first
record handled to the N-th, measured on the system's own process (all of its threads), plus
what the shape adds (lateness, drain). The raw loop and the Python peers time themselves in a
child process of their own; retryd runs as users run it, ``retryd worker`` through the CLI, and
is timed from its metric files the way bench_worker times it, its CPU read from /proc.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.bench_worker import Run
from bench.peers_py import envs

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "bench" / "peers_py" / "child.py"


def _child(python: str, system: str, bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    """Run ``child.py`` for one system in a fresh process of ``python``, in a scratch
    directory (quix-streams keeps a state directory in its working directory)."""
    group = f"bench-{system}-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="retryd-peer-") as scratch:
        out = subprocess.run(
            [python, str(CHILD), system, bootstrap, topic, group, str(count)],
            cwd=scratch,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(Path.home())},
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    if out.returncode != 0:
        raise RuntimeError(f"{system} exited with {out.returncode}:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def raw(bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    """The bare confluent-kafka loop of the harness (consume(500) + store_offsets)."""
    got = _child(sys.executable, "raw", bootstrap, topic, count)
    import confluent_kafka

    return {
        **got,
        "version": f"confluent-kafka {_version(confluent_kafka.version())}",
        "config": "consume(500), store_offsets per record, auto commit every 5 s",
    }


def _version(v: Any) -> str:
    """confluent-kafka's version(): a string in some releases, (string, int) in others."""
    return str(v[0] if isinstance(v, tuple) else v)


PY_PEERS = {
    "quix-streams": (
        "quix-streams",
        "Application defaults (at-least-once, commit every 5 s), sdf.update(noop), bytes serdes",
    ),
    "faststream-batch": (
        "faststream",
        "KafkaBroker (aiokafka), subscriber batch=True, AckPolicy.ACK (commit after each batch)",
    ),
    "faststream-message": (
        "faststream",
        "KafkaBroker (aiokafka), one message per call, AckPolicy.ACK (commit after each message)",
    ),
}


def python_peer(system: str, bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    peer, config = PY_PEERS[system]
    python, version = envs.ensure(peer)
    got = _child(str(python), system, bootstrap, topic, count)
    return {**got, "version": f"{envs.PEERS[peer][0]} {version}", "config": config}


# ------------------------------------------------------------------ retryd
def _counted(metrics: h.Metrics, outcome: str, skip_topic: str | None = None) -> float:
    """retryd_messages_total of ``outcome`` over every topic but ``skip_topic``."""
    import struct

    try:
        families = list(metrics._collector.collect())
    except struct.error:  # a metric file being created right now
        return metrics._last
    total = 0.0
    for family in families:
        if family.name != "retryd_messages":
            continue
        for s in family.samples:
            if (
                s.name == "retryd_messages_total"
                and s.labels.get("outcome") == outcome
                and s.labels.get("topic") != skip_topic
            ):
                total += s.value
    metrics._last = total
    return total


def _retryd_timed(
    cli: h.Cli, count: int, outcome: str, skip_topic: str | None = None
) -> dict[str, Any]:
    """Start the worker, time the first counted record to the N-th, CPU of the worker process
    over the same span (the 20 ms poll of the metric files bounds the resolution)."""
    proc = cli.start()
    metrics = h.Metrics(cli.state_dir)
    cpu: list[float] = []
    try:
        wall = h.time_until(
            lambda: _counted(metrics, outcome, skip_topic),
            count,
            proc,
            timeout_s=900,
            interval_s=0.02,
            on_first=lambda: cpu.append(h.cpu_seconds(proc.pid)),
        )
        cpu.append(h.cpu_seconds(proc.pid))
    finally:
        code = h.stop(proc)
    if code != 0:
        raise SystemExit(f"retryd worker exited with {code} (see {cli.log})")
    return {"handled": count, "wall_s": wall, "cpu_s": cpu[1] - cpu[0]}


def _retryd_version() -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return f"retryd {commit or 'unknown'}"


def retryd_success(run: Run, bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    cli = run.cli(bootstrap, topic, "python:bench.handlers:noop")
    cli.topics_create()
    got = _retryd_timed(cli, count, "success")
    return {
        **got,
        "version": _retryd_version(),
        "config": "retryd worker CLI defaults (max_in_flight=16, ordering=key, batch_size=500), "
        "no-op sync handler",
    }


def retryd_keyed(run: Run, bootstrap: str, topic: str, count: int, in_flight: int) -> dict:
    cli = run.cli(
        bootstrap,
        topic,
        "python:bench.peers_py.handlers:keyed",
        RETRYD_MAX_IN_FLIGHT=str(in_flight),
    )
    cli.topics_create()
    got = _retryd_timed(cli, count, "success")
    return {
        **got,
        "version": _retryd_version(),
        "config": f"CLI defaults, max_in_flight={in_flight}, ordering=key, sync handler "
        "sleeping 0-5 ms",
    }


def retryd_retry(run: Run, bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    """Every record fails once and comes back from a 1 s tier: lateness = the retried call's
    start minus the copy's due time (``retry_timestamp``); drain = first call to last retried
    call; span = first retried call to last (what the Java peers' wall time covers). The
    circuit breaker is off: every first call fails on purpose, which it would read as an
    outage and hold."""
    calls = run.scratch / f"calls-{uuid.uuid4().hex[:6]}.txt"
    cli = run.cli(
        bootstrap,
        topic,
        "python:bench.peers_py.handlers:fail_once",
        RETRYD_RETRY_SEQUENCE="1s",
        RETRYD_CIRCUIT_BREAKER="false",
        RETRYD_TIER_TEMPLATE="{group}.retry_{delay}",
        BENCH_PEERS_CALLS=str(calls),
    )
    cli.topics_create()
    got = _retryd_timed(cli, count, "success", skip_topic=topic)
    firsts, late, retried = [], [], []
    for line in calls.read_text().split("\n"):
        parts = line.split()
        if parts and parts[0] == "first":
            firsts.append(int(parts[1]))
        elif parts and parts[0] == "retry":
            retried.append(int(parts[1]))
            late.append(int(parts[1]) - int(parts[2]))
    if not late or not firsts:
        raise SystemExit("retry shape: no retried call was recorded")
    return {
        **got,
        "drain_s": (max(retried) - min(firsts)) / 1000,
        "span_s": (max(retried) - min(retried)) / 1000,
        "lateness_ms": lateness(late),
        "early": sum(1 for v in late if v < 0),
        "version": _retryd_version(),
        "config": "CLI defaults, retry_sequence=1s, circuit_breaker=false, "
        "tier_template={group}.retry_{delay}",
    }


def lateness(values: list[int]) -> dict[str, float]:
    values = sorted(values)

    def pct(p: float) -> float:
        return float(values[min(len(values) - 1, int(p * len(values)))])

    return {
        "p50": pct(0.5),
        "p99": pct(0.99),
        "max": float(values[-1]),
        "min": float(values[0]),
        "mean": statistics.fmean(values),
    }
