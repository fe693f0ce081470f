"""Worker benchmarks: ``retryd worker`` run through the CLI at default settings, against raw
confluent-kafka loops measured in the same run, reported as ratios.

    python bench/bench_worker.py                 # every scenario, 3 repeats, medians
    python bench/bench_worker.py --quick         # seconds: checks the harness, not the numbers
    python bench/bench_worker.py --only success,routing --repeat 5

Each scenario runs on a fresh broker: Apache Kafka, one KRaft node (``retryd.kafka.apache``,
its default version), with the JVM settings of Kafka's start scripts; ``RETRYD_BENCH_BROKER=tansu``
for the embedded Tansu, ``RETRYD_TEST_BOOTSTRAP`` for an existing cluster. retryd throughput
is read from the worker's own metric files (``retryd_messages_total``), the way a dashboard
sees it, from the first record counted to the N-th; raw loops time first record to N-th done.
So group joins never count. Results go to ``bench/results/worker-<broker>.json`` and the worker
table of that broker in ``BENCHMARKS.md``.

``routing`` measures default routing and routing with ``exactly_once`` in the same run, on the
same topic, after the same raw loop: three rows (each vs raw, and exactly-once vs default).

``tracing`` runs the success path three ways on one topic, in an order that turns with each
repeat: the source tree before tracing existed (``--before``, a copy of that revision), this
one with tracing off (the OTEL_* variables unset: the extra installed but not configured), and
this one with tracing on (OTLP/HTTP to a local receiver that accepts and discards): two rows,
off vs before (the cost of tracing being there) and on vs before (for information), as
throughput and as the worker's CPU per record. It runs only when named (``--only tracing``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness as h  # noqa: E402

PARTITIONS = 6
VALUE_BYTES = 200


def _value(i: int) -> bytes:
    head = str(i).encode()
    return head + b"x" * (VALUE_BYTES - len(head))


class Run:
    """One scenario's context: scratch directory, quick mode, extra settings."""

    def __init__(self, quick: bool, scratch: Path) -> None:
        self.quick = quick
        self.scratch = scratch
        # Quick mode only: a short session timeout (the embedded broker's first JoinGroup
        # waits half of it). Full runs keep every default.
        self.base_env = {"RETRYD_SESSION_TIMEOUT_MS": "6000"} if quick else {}

    def cli(self, bootstrap: str, topic: str, handler: str, **env: str) -> h.Cli:
        state = self.scratch / uuid.uuid4().hex[:8]
        return h.Cli(
            bootstrap,
            topic,
            handler,
            state,
            extra_env={**self.base_env, **env},
            log=self.scratch / "worker.log",
        )


def _throughput(
    run: Run, cli: h.Cli, topic: str, outcome: str, n: int, *args: str, committed: bool = False
) -> dict:
    """Throughput from the worker's metrics, first counted record to the n-th. With
    ``committed``, also the seconds until the group's committed offsets on ``topic`` cover
    all n records (the input side of a routed copy made durable)."""
    proc = cli.start(*args)
    metrics = h.Metrics(cli.state_dir)
    commit_s = None
    cpu: list[float] = []
    try:
        elapsed = h.time_until(
            lambda: metrics.messages(topic, outcome),
            n,
            proc,
            timeout_s=900,
            on_first=lambda: cpu.append(h.cpu_seconds(proc.pid)),
        )
        cpu.append(h.cpu_seconds(proc.pid))
        if committed:
            first = time.monotonic() - elapsed
            h.wait_committed(cli.bootstrap, cli.group, topic, PARTITIONS, n, proc, timeout_s=120)
            commit_s = time.monotonic() - first
        rss = h.peak_rss_mb(proc.pid) if not args else None
    finally:
        code = h.stop(proc)
    if code != 0:
        raise SystemExit(f"retryd worker exited with {code} (see {cli.log})")
    out = {"seconds": elapsed, "msgs_per_s": n / elapsed}
    if len(cpu) == 2:  # the worker's CPU from the first counted record to the n-th, per record
        out["cpu_us_per_msg"] = (cpu[1] - cpu[0]) / n * 1e6
    if commit_s is not None:
        out["committed_seconds"] = commit_s
    if rss is not None:
        out["rss_mb"] = rss
    return out


def _main_topic(bootstrap: str, n: int, keys: int) -> str:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    h.create_topics(bootstrap, [topic], PARTITIONS)
    t0 = time.monotonic()
    h.produce(bootstrap, topic, n, value=_value, key=lambda i: str(i % keys).encode())
    print(f"  produced {n} records in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return topic


# ------------------------------------------------------------------ scenarios
def success(run: Run, n: int) -> dict:
    """Success path: no-op sync handler vs raw consume + store_offsets per message."""
    with h.broker(run.quick) as b:
        topic = _main_topic(b, n, 50_000)
        raw = h.run_child("raw", b, topic, str(n))
        cli = run.cli(b, topic, "python:bench.handlers:noop")
        cli.topics_create()
        one = _throughput(run, cli, topic, "success", n)
    return {
        "raw": raw,
        "retryd": one,
        "ratio": one["msgs_per_s"] / raw["msgs_per_s"],
        "rss_ratio": one["rss_mb"] / raw["rss_mb"],
    }


def scale(run: Run, n: int) -> dict:
    """``--processes 2`` vs 1 on 6 partitions, with CPU-bound business code (~50 µs of Python
    per record), so the figure is retryd's scaling, not the broker's ceiling."""
    with h.broker(run.quick) as b:
        topic = _main_topic(b, n, 50_000)
        cli = run.cli(b, topic, "python:bench.handlers:burn")
        cli.topics_create()
        one = _throughput(run, cli, topic, "success", n, "--processes", "1")
        two = _throughput(
            run,
            run.cli(b, topic, "python:bench.handlers:burn"),
            topic,
            "success",
            n,
            "--processes",
            "2",
        )
    return {"one": one, "two": two, "scale_2v1": two["msgs_per_s"] / one["msgs_per_s"]}


ROUTING_VARIANTS = {"default": {}, "exactly_once": {"RETRYD_EXACTLY_ONCE": "true"}}


def routing(run: Run, n: int, turn: int = 0) -> dict:
    """Every message fails once: routed to the first tier (acks=all) vs raw consume ->
    produce with headers -> store on delivery; then the same with ``exactly_once`` (copies and
    input offsets in one transaction every ``transaction_interval_ms``). One topic, in one
    run: the raw loop first, then both retryd runs in turns (which one goes first alternates
    with ``turn``). Each retryd run has its own group and its own tiers (tier template
    ``{group}.retry_{delay}``), so neither reads the other's copies."""
    with h.broker(run.quick) as b:
        topic = _main_topic(b, n, 50_000)
        h.create_topics(b, [f"{topic}.raw-tier"], PARTITIONS)
        raw = h.run_child("raw_route", b, topic, str(n))
        order = list(ROUTING_VARIANTS)
        if turn % 2:
            order.reverse()
        got: dict[str, dict] = {}
        for variant in order:
            env = {
                "RETRYD_TIER_TEMPLATE": "{group}.retry_{delay}",
                # every message fails: to the outage circuit breaker that is an outage, and it
                # would hold them; this scenario measures the routing path itself
                "RETRYD_CIRCUIT_BREAKER": "false",
                **ROUTING_VARIANTS[variant],
            }
            cli = run.cli(b, topic, "python:bench.handlers:fail_first", **env)
            cli.topics_create()
            got[variant] = _throughput(run, cli, topic, "retried", n, committed=True)
    default, eos = got["default"], got["exactly_once"]
    return {
        "raw": raw,
        "retryd": default,
        "retryd_exactly_once": eos,
        "order": order,
        "ratio": default["msgs_per_s"] / raw["msgs_per_s"],
        "eos_ratio": eos["msgs_per_s"] / raw["msgs_per_s"],
        "eos_vs_default": eos["msgs_per_s"] / default["msgs_per_s"],
    }


class _Sink:
    """A local OTLP/HTTP receiver that answers every export with an empty success."""

    def __enter__(self) -> str:
        import http.server
        import threading

        sink = self
        self.exports = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                sink.exports += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _source_tree(rev: str, into: Path) -> Path:
    """A copy of the repository at ``rev`` (``git archive``: the working tree is untouched)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", rev], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def tracing_cost(
    run: Run, n: int, turn: int, before: Path, after: Path, modes: list[str] | None = None
) -> dict:
    """Success path from the tree before tracing, with tracing off and on (``modes``, a
    subset of those three): one topic, fresh groups, the order turning with ``turn`` so no
    mode always runs first."""
    modes = modes or ["before", "off", "on"]
    modes = modes[turn % len(modes) :] + modes[: turn % len(modes)]
    out: dict[str, Any] = {"order": modes}
    sink = _Sink()
    with h.broker(run.quick) as b, sink as endpoint:
        topic = _main_topic(b, n, 50_000)
        for mode in modes:
            env = {}
            if mode == "on":
                env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "bench"}
            cli = run.cli(b, topic, "python:bench.handlers:noop", **env)
            cli.root = before if mode == "before" else after
            if mode == modes[0]:
                cli.topics_create()
            out[mode] = _throughput(run, cli, topic, "success", n)
            if mode == "on":
                out["on"]["exports"] = sink.exports  # OTLP requests received: spans went out
    for mode in ("off", "on"):
        if mode in out and "before" in out:
            out[f"{mode}_vs_before"] = out[mode]["msgs_per_s"] / out["before"]["msgs_per_s"]
            out[f"{mode}_cpu_vs_before"] = (
                out[mode]["cpu_us_per_msg"] / out["before"]["cpu_us_per_msg"]
            )
    return out


def _concurrent(run: Run, n: int, handler: Callable[[int], str]) -> dict:
    """200 keys, one process, max_in_flight=64, ordering=key; the handler takes 20 ms."""
    in_flight, latency = 64, 0.02
    from retryd.kafka.embedded import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "http_server.py"), str(port), str(latency)],
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "ready"
        with h.broker(run.quick) as b:
            topic = _main_topic(b, n, 200)
            cli = run.cli(b, topic, handler(port), RETRYD_MAX_IN_FLIGHT=str(in_flight))
            cli.topics_create()
            got = _throughput(run, cli, topic, "success", n)
    finally:
        h.stop(server, 10)
    ideal = in_flight / latency
    return {"retryd": got, "ideal_msgs_per_s": ideal, "ratio": got["msgs_per_s"] / ideal}


def http(run: Run, n: int) -> dict:
    return _concurrent(run, n, lambda port: f"http://127.0.0.1:{port}/handle")


def async_handler(run: Run, n: int) -> dict:
    return _concurrent(run, n, lambda port: "python:bench.handlers:async_sleep20")


def lateness(run: Run, n: int, sequence: str = "2s,5s,10s") -> dict:
    """n messages produced at a steady rate, each failing 1-3 times over tiers 2s, 5s, 10s
    (``lateness_jitter``: the same with ``jitter=20%``, each due time moved by up to ±20 % of
    its delay); lateness = handler call start minus retry_timestamp."""
    rate = 2000.0 if not run.quick else 500.0
    samples_file = run.scratch / f"lateness-{uuid.uuid4().hex[:6]}.txt"
    with h.broker(run.quick) as b:
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        h.create_topics(b, [topic], PARTITIONS)
        cli = run.cli(
            b,
            topic,
            "python:bench.handlers:tiers",
            RETRYD_RETRY_SEQUENCE=sequence,
            RETRYD_CIRCUIT_BREAKER="false",  # most calls fail on purpose: not an outage here
            BENCH_LATENESS_FILE=str(samples_file),
        )
        cli.topics_create()
        proc = cli.start("--until-drained")
        try:
            _wait_assigned(cli.state_dir, proc)
            h.produce(
                b,
                topic,
                n,
                value=lambda i: str(i % 3 + 1).encode() + b"x" * (VALUE_BYTES - 1),
                key=lambda i: str(i % 50_000).encode(),
                rate=rate,
            )
            proc.wait(600)
        finally:
            h.stop(proc)
    values = sorted(int(x) for x in samples_file.read_text().split())
    if not values:
        raise SystemExit("lateness: no tier calls were recorded")

    def pct(p: float) -> float:
        return float(values[min(len(values) - 1, int(p * len(values)))])

    return {
        "tier_calls": len(values),
        "rate_per_s": rate,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": float(values[-1]),
        "early_calls": sum(1 for v in values if v < 0),
    }


def _wait_assigned(state_dir: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    from retryd.runtime.heartbeat import read_heartbeats

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"retryd worker exited with {proc.returncode}")
        if any(hb.assigned_partitions for hb in read_heartbeats(state_dir)):
            return
        time.sleep(0.1)
    raise SystemExit("the worker was never assigned partitions")


def _tier_headers(topic: str, group: str, due_ms: int) -> Callable[[int], list[tuple[str, bytes]]]:
    due = str(due_ms).encode()

    def headers(i: int) -> list[tuple[str, bytes]]:
        return [
            ("retry_number", b"1"),
            ("retry_timestamp", due),
            ("retryd_original_topic", topic.encode()),
            ("retryd_original_partition", b"0"),
            ("retryd_original_offset", str(i).encode()),
            ("retryd_group", group.encode()),
        ]

    return headers


TIER_CONSUMER_MODES = ("own", "shared")  # role all: tiers on their own member, or shared


def memory(run: Run, n_small: int, n_big: int) -> dict:
    """Peak RSS of a worker facing n_big vs n_small not-yet-due records in a tier, with the
    tiers on their own consumer (the default) and, for the record, on the shared one."""
    out: dict[str, Any] = {}
    for mode in TIER_CONSUMER_MODES:
        for label, n in (("small", n_small), ("big", n_big)):
            out[f"{mode}_{label}"] = _memory_once(run, n, mode)
        out[f"{mode}_ratio"] = (
            out[f"{mode}_big"]["peak_rss_mb"] / out[f"{mode}_small"]["peak_rss_mb"]
        )
    out["ratio"] = out["own_ratio"]
    return out


def _memory_once(run: Run, n: int, mode: str) -> dict:
    with h.broker(run.quick) as b:
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        h.create_topics(b, [topic], PARTITIONS)
        cli = run.cli(b, topic, "python:bench.handlers:noop", RETRYD_TIER_CONSUMER=mode)
        cli.topics_create()
        headers = _tier_headers(topic, cli.group, int(time.time() * 1000) + 3_600_000)
        t0 = time.monotonic()
        h.produce(b, "retry_1h", n, value=_value, key=lambda i: str(i).encode(), headers=headers)
        print(f"  produced {n} tier records in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        proc = cli.start()
        try:
            _wait_assigned(cli.state_dir, proc)
            time.sleep(4 if run.quick else 20)  # let it fill its buffers and pause
            return {"records": n, "peak_rss_mb": h.peak_rss_mb(proc.pid)}
        finally:
            h.stop(proc)


def late_join(run: Run, n: int) -> dict:
    """Classic protocol, role all: one worker process runs alone, a second one (another
    ``retryd worker``, same group) joins once the first is busy. Throughput once both run
    (from the joiner's first record to the n-th) vs one process alone on the same shape,
    ~50 µs of CPU per record; with the tiers on their own consumer (the default) and on the
    shared one. A joiner given only tier partitions adds nothing."""
    out: dict[str, Any] = {}
    with h.broker(run.quick) as b:
        topic = _main_topic(b, n, 50_000)
        cli = run.cli(b, topic, "python:bench.handlers:burn")
        cli.topics_create()
        one = _throughput(run, cli, topic, "success", n)
        out["one"] = one
        for mode in TIER_CONSUMER_MODES:
            topic = _main_topic(b, n, 50_000)
            first = run.cli(b, topic, "python:bench.handlers:burn", RETRYD_TIER_CONSUMER=mode)
            first.topics_create()
            second = run.cli(b, topic, "python:bench.handlers:burn", RETRYD_TIER_CONSUMER=mode)
            second.group = first.group
            res = _two_members(first, second, topic, n)
            res["vs_one"] = res["msgs_per_s"] / one["msgs_per_s"]
            out[mode] = res
    out["ratio"] = out["own"]["vs_one"]
    out["shared_ratio"] = out["shared"]["vs_one"]
    return out


def _two_members(first: h.Cli, second: h.Cli, topic: str, n: int) -> dict:
    a = first.start()
    b: subprocess.Popen[bytes] | None = None
    ma, mb = h.Metrics(first.state_dir), h.Metrics(second.state_dir)
    try:
        h.time_until(lambda: ma.messages(topic, "success"), max(1, n // 20), a, timeout_s=300)
        b = second.start()

        # from the joiner's first record: both members run (its join's rebalance included)
        def total() -> float:
            return ma.messages(topic, "success") + mb.messages(topic, "success")

        # (or the first finished everything alone: a quick run's N can be that small)
        h.time_until(
            lambda: n if total() >= n else mb.messages(topic, "success"), 1, b, timeout_s=300
        )
        at_join = min(total(), n - 1)
        started = time.monotonic()
        h.time_until(total, n, a, timeout_s=900)
        elapsed = time.monotonic() - started
        done_b = mb.messages(topic, "success")
    finally:
        h.stop(a)
        if b is not None:
            h.stop(b)
    return {
        "seconds": elapsed,
        "msgs_per_s": (n - at_join) / max(elapsed, 1e-6),
        "joiner_share": done_b / n,
    }


# ------------------------------------------------------------------ report
# row -> (scenario, figure, key in the scenario's result, comparison, target or None)
TARGETS: dict[str, tuple[str, str, str, str, float | None]] = {
    "success": (
        "success",
        "success path, default settings vs raw consume + store",
        "ratio",
        ">=",
        0.85,
    ),
    "routing": (
        "routing",
        "routing, every message fails once vs raw consume → produce → store on delivery",
        "ratio",
        ">=",
        0.80,
    ),
    "routing_eos": (
        "routing",
        "routing with exactly_once (same run) vs the same raw loop",
        "eos_ratio",
        ">=",
        None,
    ),
    "routing_eos_cost": (
        "routing",
        "routing with exactly_once vs default routing (same run): the cost of exactly-once",
        "eos_vs_default",
        ">=",
        None,
    ),
    "http": (
        "http",
        "HTTP handler 20 ms, 200 keys, 1 process, max_in_flight=64 vs 64/20ms",
        "ratio",
        ">=",
        0.70,
    ),
    "async": (
        "async",
        "async def handler awaiting 20 ms, same shape vs 64/20ms",
        "ratio",
        ">=",
        0.80,
    ),
    "lateness_p50": ("lateness", "due lateness p50 (ms), tiers 2s/5s/10s", "p50_ms", "<=", 50),
    "lateness_p99": ("lateness", "due lateness p99 (ms), tiers 2s/5s/10s", "p99_ms", "<=", 250),
    "lateness_jitter_p99": (
        "lateness_jitter",
        "due lateness p99 (ms), tiers 2s/5s/10s with jitter=20%",
        "p99_ms",
        "<=",
        250,
    ),
    "lateness_jitter_early": (
        "lateness_jitter",
        "calls before their jittered retry_timestamp, tiers 2s/5s/10s with jitter=20%",
        "early_calls",
        "<=",
        0,
    ),
    "memory": (
        "memory",
        "peak RSS, 1,000,000 vs 10,000 not-yet-due tier records (tiers on their own consumer)",
        "ratio",
        "<=",
        1.10,
    ),
    "memory_shared": (
        "memory",
        "the same with tier_consumer=shared (one consumer for main topics and tiers; same run)",
        "shared_ratio",
        "<=",
        None,
    ),
    "late_join": (
        "late_join",
        "2 processes vs 1, the second joining late (classic protocol, ~50 µs CPU per record)",
        "ratio",
        ">=",
        1.8,
    ),
    "late_join_shared": (
        "late_join",
        "the same with tier_consumer=shared (same run)",
        "shared_ratio",
        ">=",
        None,
    ),
    "scale": (
        "scale",
        "2 processes vs 1, 6 partitions, ~50 µs of CPU per record",
        "scale_2v1",
        ">=",
        1.7,
    ),
    "tracing_off": (
        "tracing",
        "success path, tracing off (extra installed, OTEL_* unset) vs before tracing (same run)",
        "off_vs_before",
        ">=",
        None,
    ),
    "tracing_off_cpu": (
        "tracing",
        "worker CPU per record, tracing off vs before tracing (same run; 1.0 = no cost)",
        "off_cpu_vs_before",
        "<=",
        None,
    ),
    "tracing_on_cpu": (
        "tracing",
        "worker CPU per record, tracing on vs before tracing (same run)",
        "on_cpu_vs_before",
        "<=",
        None,
    ),
    "tracing_on": (
        "tracing",
        "success path, tracing on (every call a span, OTLP/HTTP) vs before tracing (same run)",
        "on_vs_before",
        ">=",
        None,
    ),
}


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summarize(results: dict[str, list[dict]]) -> list[dict]:
    rows = []
    for name, (source, label, key, op, target) in TARGETS.items():
        runs = results.get(source)
        if not runs or any(key not in r for r in runs):
            continue
        value = _median(runs, key)
        met: bool | None = None
        if target is not None:
            met = value >= target if op == ">=" else value <= target
        rows.append(
            {
                "row": name,
                "figure": label,
                "target": f"{op} {target}" if target is not None else "-",
                "measured": round(value, 3),
                "runs": [round(r[key], 3) for r in runs],
                "met": met,
            }
        )
    return rows


def _met(row: dict) -> str:
    return "-" if row["met"] is None else ("met" if row["met"] else "not met")


def _version(v: Any) -> str:
    """confluent-kafka's version(): a string in some releases, (string, int) in others."""
    return str(v[0] if isinstance(v, tuple) else v)


def machine(quick: bool = False) -> dict[str, Any]:
    import confluent_kafka

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "confluent_kafka": _version(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
        "broker": h.broker_info(quick),
        "retryd_commit": commit,
        "load_average_at_end": [round(x, 2) for x in load],
    }


def write_markdown(rows: list[dict], info: dict[str, Any], params: dict[str, Any]) -> None:
    """The worker table of this broker kind between its markers in BENCHMARKS.md (each broker
    has its own block, so a run on one never overwrites the other's numbers)."""
    path = ROOT / "BENCHMARKS.md"
    broker = info["broker"]
    begin, end = f"<!-- worker:{broker['kind']}:begin -->", f"<!-- worker:{broker['kind']}:end -->"
    flags = ""
    if broker.get("jvm_flags"):
        props = ", ".join(f"`{k}={v}`" for k, v in broker.get("overrides", {}).items())
        flags = f" (JVM: `{' '.join(broker['jvm_flags'])}`" + (f"; {props})" if props else ")")
    lines = [
        begin,
        f"### Worker on {broker['label']}",
        "",
        f"Machine: {info['cpus']} CPUs, {info['platform']}, Python {info['python']}, "
        f"confluent-kafka {info['confluent_kafka']} (librdkafka {info['librdkafka']}), "
        f"broker: {broker['label']}{flags}, retryd {info['retryd_commit']}, "
        f"load average at the end {', '.join(str(x) for x in info['load_average_at_end'])}.",
        f"Settings: `retryd worker` CLI defaults (max_in_flight=16, ordering=key, batch_size=500, "
        f"multiprocess metrics on) except where a row says otherwise; {PARTITIONS} partitions, "
        f"{VALUE_BYTES}-byte values; N = {params['n']} (success, routing), {params['n_http']} "
        f"(HTTP, async), {params['n_lateness']} (lateness), {params['n_scale']} (scaling); "
        f"{params['repeat']} repeat(s), "
        "median shown, every run listed.",
        "",
        "| figure | target | measured (median) | runs | met |",
        "|---|---|---|---|---|",
    ]
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    measured = {r["figure"] for r in rows}
    kept = _kept_rows(text, begin, end, measured)
    for r in rows:
        runs = ", ".join(str(x) for x in r["runs"])
        lines.append(f"| {r['figure']} | {r['target']} | {r['measured']} | {runs} | {_met(r)} |")
    lines += kept
    lines.append(end)
    block = "\n".join(lines)
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def _kept_rows(text: str, begin: str, end: str, measured: set[str]) -> list[str]:
    """The rows of the broker's earlier table that this run did not measure (``--only``),
    kept and marked with the revision that measured them, so a partial run never drops the
    other figures."""
    if begin not in text or end not in text:
        return []
    old = text[text.index(begin) : text.index(end)]
    found = re.search(r"retryd (\w+), load average", old)
    rev = found.group(1) if found else "earlier"
    kept = []
    for line in old.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("figure", "---") or cells[0] in measured:
            continue
        if "(run of retryd" not in cells[3]:
            cells[3] += f" (run of retryd {rev})"
        kept.append("| " + " | ".join(cells) + " |")
    return kept


def child(args: argparse.Namespace) -> None:
    import resource

    kind, bootstrap, topic, n = args.child
    route = f"{topic}.raw-tier" if kind == "raw_route" else None
    cpu: list[float] = []
    elapsed = h.raw_loop(
        bootstrap,
        topic,
        int(n),
        route,
        on_first=lambda: cpu.append(time.process_time()),
        on_done=lambda: cpu.append(time.process_time()),
    )
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"seconds": elapsed, "msgs_per_s": int(n) / elapsed, "rss_mb": rss_mb}
    if len(cpu) == 2:  # the process's CPU (all threads), first message to the n-th
        out["cpu_us_per_msg"] = (cpu[1] - cpu[0]) / int(n) * 1e6
    print(json.dumps(out))


SCENARIOS = (
    "success",
    "routing",
    "http",
    "async",
    "lateness",
    "lateness_jitter",
    "memory",
    "scale",
    "late_join",
    "tracing",
)
# Run only when named: it compares two source trees (``--before``/``--after``).
DEFAULT_SCENARIOS = tuple(s for s in SCENARIOS if s != "tracing")


def _trees(before: str | None, after: str | None, scratch: Path) -> tuple[Path, Path]:
    """Source trees for the tracing scenario: ``before`` (default: the parent of the commit
    that added ``retryd/tracing``) and ``after`` (default: this working tree)."""
    if before is None:
        added = subprocess.run(
            ["git", "log", "--diff-filter=A", "--format=%H", "--", "retryd/tracing/__init__.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        if not added:
            raise SystemExit("tracing: no commit adds retryd/tracing; name one with --before")
        before = f"{added[-1]}~1"
    old = _source_tree(before, scratch / "before")
    new = _source_tree(after, scratch / "after") if after else ROOT
    return old, new


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the harness")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--only", default=",".join(DEFAULT_SCENARIOS))
    ap.add_argument("--messages", type=int, help="N for success/routing (default 500000)")
    ap.add_argument("--no-write", action="store_true", help="print only; keep result files")
    ap.add_argument(
        "--before",
        default=None,
        help="tracing: the revision to compare with (default: the one before retryd/tracing)",
    )
    ap.add_argument(
        "--after", default=None, help="tracing: the revision measured (default: the working tree)"
    )
    ap.add_argument(
        "--tracing-modes",
        default="before,off,on",
        help="tracing: the modes to run (a subset of before,off,on)",
    )
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    quick = args.quick
    repeat = args.repeat or (1 if quick else 3)
    params = {
        "n": 5_000 if quick else 500_000,
        "n_http": 600 if quick else 20_000,
        "n_lateness": 1_000 if quick else 50_000,
        "n_scale": 2_000 if quick else 100_000,
        # the joiner's join (a cooperative rebalance, seconds) must be a small part of the run
        "n_late": 2_000 if quick else 400_000,
        "mem": (2_000, 20_000) if quick else (10_000, 1_000_000),
        "repeat": repeat,
    }
    if args.messages:
        params["n"] = args.messages
    wanted = [s for s in args.only.split(",") if s]
    unknown = set(wanted) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenarios: {', '.join(sorted(unknown))}")
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="retryd-bench-") as scratch:
        run = Run(quick, Path(scratch))
        trees: tuple[Path, Path] | None = None
        if "tracing" in wanted:
            trees = _trees(args.before, args.after, Path(scratch))
        for i in range(repeat):
            for name in wanted:
                print(f"[{i + 1}/{repeat}] {name}", file=sys.stderr)
                if name == "success":
                    res = success(run, params["n"])
                elif name == "routing":
                    res = routing(run, params["n"], i)
                elif name == "http":
                    res = http(run, params["n_http"])
                elif name == "async":
                    res = async_handler(run, params["n_http"])
                elif name == "lateness":
                    res = lateness(run, params["n_lateness"])
                elif name == "lateness_jitter":
                    res = lateness(run, params["n_lateness"], "2s,5s,10s, jitter=20%")
                elif name == "scale":
                    res = scale(run, params["n_scale"])
                elif name == "late_join":
                    res = late_join(run, params["n_late"])
                elif name == "tracing":
                    assert trees is not None
                    modes = [m for m in args.tracing_modes.split(",") if m]
                    res = tracing_cost(run, params["n"], i, *trees, modes)
                else:
                    res = memory(run, *params["mem"])
                print(f"  {json.dumps(res)}", file=sys.stderr)
                results.setdefault(name, []).append(res)
    rows = summarize(results)
    info = machine(quick)
    for r in rows:
        print(
            f"{r['row']:14s} {r['measured']:>9} (target {r['target']}) "
            f"{_met(r).upper() if r['met'] is False else _met(r)}  runs={r['runs']}"
        )
    report = {"quick": quick, "params": params, "machine": info, "rows": rows, "results": results}
    print(json.dumps({"rows": rows}))
    if not args.no_write and not quick:
        out = ROOT / "bench" / "results" / f"worker-{info['broker']['kind']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():  # a partial run (--only) keeps the other scenarios' results
            earlier = json.loads(out.read_text())
            for name, runs in earlier.get("results", {}).items():
                if name not in results:
                    report["results"][name] = runs  # type: ignore[index]
                    report.setdefault("kept_from", {})[name] = earlier.get("machine", {}).get(  # type: ignore[union-attr]
                        "retryd_commit"
                    )
        out.write_text(json.dumps(report, indent=2))
        write_markdown(rows, info, params)


if __name__ == "__main__":
    main()
