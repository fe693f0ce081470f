"""Retry lateness in share mode (issue 26): every record fails once and is retried after 1 s.

``bench/bench_share.py --scenario lateness`` runs it. N records are produced to a fresh
one-partition topic, then read by one of three systems, each on a share group of its own:

- ``retryd``: ``retryd worker`` (CLI, one process) with ``consumer_mode = share`` and a single
  1 s tier, at the defaults otherwise, except what share mode or the test itself needs:
  ``ordering = none`` (share mode refuses key order), ``handler_timeout_s = 20`` (the default
  30 s cannot fit the broker's default 30 s record lock, so the worker would refuse to start),
  ``circuit_breaker = false`` (every first call fails on purpose: that is no outage) and topic
  names of its own on the shared broker. The handler (``fail_once``) fails a record's first
  call (retryable) and accepts the second; each call appends one line to a file.
- ``release``: the broker alone, a plain confluent-kafka ``ShareConsumer`` (explicit
  acknowledgement) that RELEASEs a failed record: the broker hands it out again at once, so
  a "1 s retry" comes back about 1 s early. Nothing in a share group can hold a released
  record back.
- ``hold``: the broker alone, delaying by holding: the consumer keeps the failed records of
  its batch acquired until 1 s after the last failure, then RELEASEs them. Never early, but
  the consumer takes nothing else meanwhile (it cannot poll with records unacknowledged), the
  delay has to fit in the record lock (15-60 s) and every retry spends one of the record's
  2-10 deliveries.

Per record: lateness = second call - (first call's failure + 1 s); early = lateness < 0. For
retryd also the second call against the copy's ``retry_timestamp`` (its due time), and the
due time against failure + 1 s (the routing: the failure reported, the copy planned). Drain:
first call to the last second call. CPU: the consuming process (retryd's worker; for the
broker alone, this process while it consumes), first call to last, per record.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench import harness as h

DELAY_S = 1.0
HANDLER = "python:bench.share_lateness:fail_once"
SYSTEMS = ("retryd", "release", "hold")
CALLS_ENV = "BENCH_SHARE_CALLS_FILE"
TIMEOUT_S = 300.0

# ------------------------------------------------------------------ the handler (worker side)
_fd: int | None = None


def _write(line: bytes) -> None:
    """One ``os.write`` per call on an O_APPEND file: lines from concurrent calls never mix."""
    global _fd
    if _fd is None:
        _fd = os.open(os.environ[CALLS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, line)


def fail_once(message: Any) -> None:
    """First call (main topic): fails, retryable; second call (from the tier): succeeds.
    Lines: ``F <key> <failure time>`` and ``R <key> <call time> <retry_timestamp ms>``."""
    now = time.time()
    key = message.key or b"-"
    if message.retry_number == 0:
        _write(b"F %s %.6f\n" % (key, time.time()))
        raise RuntimeError("bench: first call fails")
    _write(b"R %s %.6f %s\n" % (key, now, message.header("retry_timestamp") or b"0"))


# ------------------------------------------------------------------ measuring
def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _summary(
    n: int, failed: dict[bytes, float], second: dict[bytes, float], calls: int
) -> dict[str, Any]:
    """Lateness per record (ms) against failure + 1 s, and the run's drain."""
    lateness = [(second[k] - failed[k] - DELAY_S) * 1000 for k in second if k in failed]
    if len(lateness) < n:
        raise SystemExit(f"only {len(lateness)} of {n} records were retried and handled")
    gaps = [x + DELAY_S * 1000 for x in lateness]
    return {
        "records": n,
        "calls": calls,
        "handled_twice": len(lateness),
        "lateness_p50_ms": round(_pct(lateness, 0.50), 1),
        "lateness_p99_ms": round(_pct(lateness, 0.99), 1),
        "lateness_max_ms": round(max(lateness), 1),
        "lateness_min_ms": round(min(lateness), 1),
        "early": sum(1 for x in lateness if x < 0),
        "gap_p50_ms": round(_pct(gaps, 0.50), 1),
        "gap_p99_ms": round(_pct(gaps, 0.99), 1),
        "drain_s": round(max(second.values()) - min(failed.values()), 3),
    }


def _read_calls(path: Path) -> tuple[dict[bytes, float], dict[bytes, float], dict[bytes, int], int]:
    failed: dict[bytes, float] = {}
    second: dict[bytes, float] = {}
    due: dict[bytes, int] = {}
    calls = 0
    if not path.exists():
        return failed, second, due, calls
    for line in path.read_bytes().splitlines():
        parts = line.split()
        if not parts:
            continue
        calls += 1
        if parts[0] == b"F":
            failed.setdefault(parts[1], float(parts[2]))
        elif parts[0] == b"R" and len(parts) == 4:
            second.setdefault(parts[1], float(parts[2]))
            due[parts[1]] = int(parts[3])
    return failed, second, due, calls


def _new_topic(bootstrap: str, n: int) -> str:
    topic = f"blate-{uuid.uuid4().hex[:8]}.main"
    h.create_topics(bootstrap, [topic], 1)
    h.produce(bootstrap, topic, n, value=lambda i: b"x" * 100, key=lambda i: b"%d" % i)
    return topic


# ------------------------------------------------------------------ retryd
def run_retryd(bootstrap: str, n: int, tmp: Path) -> dict[str, Any]:
    topic = _new_topic(bootstrap, n)
    calls = tmp / f"{topic}.calls"
    group = topic.removesuffix(".main")
    cli = h.Cli(
        bootstrap,
        topic,
        HANDLER,
        tmp / group,
        group=group,
        log=tmp / f"{group}.log",
        extra_env={
            CALLS_ENV: str(calls),
            "RETRYD_CONSUMER_MODE": "share",
            "RETRYD_ORDERING": "none",
            "RETRYD_RETRY_SEQUENCE": "1s",
            "RETRYD_HANDLER_TIMEOUT_S": "20",
            "RETRYD_CIRCUIT_BREAKER": "false",
            "RETRYD_TIER_TEMPLATE": "{group}.retry_{delay}",
            "RETRYD_FAILED_TOPIC": f"{group}.failed",
            "RETRYD_LOG_LEVEL": "WARNING",
        },
    )
    cli.topics_create()
    proc = cli.start()
    cpu: list[float] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while True:
            failed, second, due, count = _read_calls(calls)
            if failed and not cpu:
                cpu.append(h.cpu_seconds(proc.pid))
            if len(second) >= n:
                cpu.append(h.cpu_seconds(proc.pid))
                break
            if proc.poll() is not None:
                raise SystemExit(f"retryd: the worker exited {proc.returncode} (see {cli.log})")
            if time.monotonic() > deadline:
                raise SystemExit(f"retryd: {len(second)} of {n} retried after {TIMEOUT_S:g}s")
            time.sleep(0.05)  # a benchmark's progress check, not the worker's synchronisation
    finally:
        h.stop(proc)
    failed, second, due, count = _read_calls(calls)  # the calls made while stopping too
    got = _summary(n, failed, second, count)
    # lateness = routing (failure + 1 s -> the copy's due time) + the tier (due -> call)
    keys = [k for k in second if due.get(k) and k in failed]
    vs_due = [second[k] * 1000 - due[k] for k in keys]
    routing = [due[k] - (failed[k] + DELAY_S) * 1000 for k in keys]
    got["vs_due_p50_ms"] = round(_pct(vs_due, 0.50), 1)
    got["vs_due_p99_ms"] = round(_pct(vs_due, 0.99), 1)
    got["early_vs_due"] = sum(1 for x in vs_due if x < 0)
    got["routing_p50_ms"] = round(_pct(routing, 0.50), 1)
    got["routing_p99_ms"] = round(_pct(routing, 0.99), 1)
    # a due time before failure + 1 s: retry_timestamp is whole milliseconds, rounded down
    got["due_before_failure_plus_delay"] = sum(1 for x in routing if x < 0)
    got["cpu_ms_per_record"] = round((cpu[1] - cpu[0]) / n * 1000, 3)
    return got


# ------------------------------------------------------------------ the broker alone
def _earliest(bootstrap: str, group: str) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entry = ConfigEntry(
        "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def run_broker(bootstrap: str, n: int, hold: bool) -> dict[str, Any]:
    """A share consumer that RELEASEs a failed record at once (``hold=False``) or once it
    has held its batch's failures for ``DELAY_S`` (module docstring)."""
    from confluent_kafka import AcknowledgeType, ShareConsumer

    topic = _new_topic(bootstrap, n)
    group = f"{topic.removesuffix('.main')}.share"
    _earliest(bootstrap, group)
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
        }
    )
    consumer.subscribe([topic])
    failed: dict[bytes, float] = {}
    second: dict[bytes, float] = {}
    calls = 0
    cpu0: float | None = None
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(second) < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"broker {hold=}: {len(second)} of {n} after {TIMEOUT_S:g}s")
            held = []
            for msg in consumer.poll(0.5):
                if msg.error():
                    raise SystemExit(f"share consumer: {msg.error()}")
                now = time.time()
                if cpu0 is None:
                    cpu0 = time.process_time()
                calls += 1
                key = msg.key() or b"-"
                if key in failed:  # its second call: succeeds
                    second.setdefault(key, now)
                    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                    continue
                failed[key] = time.time()
                if hold:
                    held.append(msg)
                else:
                    consumer.acknowledge(msg, AcknowledgeType.RELEASE)
            if held:
                # the delay this variant expresses: the batch's records stay acquired
                due = max(failed[m.key() or b"-"] for m in held) + DELAY_S
                time.sleep(max(0.0, due - time.time()))
                for msg in held:
                    consumer.acknowledge(msg, AcknowledgeType.RELEASE)
            consumer.commit_async()
        cpu = time.process_time() - (cpu0 or 0.0)
    finally:
        consumer.close()
    got = _summary(n, failed, second, calls)
    got["cpu_ms_per_record"] = round(cpu / n * 1000, 3)
    return got


# ------------------------------------------------------------------ runs
def run(bootstrap: str, n: int, runs: int, tmp: Path) -> dict[str, Any]:
    """``runs`` rounds of every system, alternating the order (each round reverses the last);
    per system the medians over its runs, and every run's figures."""
    per: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    for i in range(runs):
        for system in SYSTEMS if i % 2 == 0 else tuple(reversed(SYSTEMS)):
            if system == "retryd":
                got = run_retryd(bootstrap, n, tmp)
            else:
                got = run_broker(bootstrap, n, hold=system == "hold")
            got = {"system": system, "run": i + 1, "load_1m": round(os.getloadavg()[0], 2), **got}
            print(got, flush=True)
            per[system].append(got)
    medians = {}
    for system, rows in per.items():
        keys = [k for k, v in rows[0].items() if isinstance(v, int | float) and k != "run"]
        med: dict[str, Any] = {k: statistics.median(r[k] for r in rows) for k in keys}
        # counts are totals over the runs (every early call counts), the rest medians
        for k in ("records", "calls", "handled_twice", "early"):
            med[k] = sum(r[k] for r in rows)
        for k in ("early_vs_due", "due_before_failure_plus_delay"):
            if k in med:
                med[k] = sum(r[k] for r in rows)
        med["lateness_min_ms"] = min(r["lateness_min_ms"] for r in rows)
        med["lateness_max_ms"] = max(r["lateness_max_ms"] for r in rows)
        med["lateness_p99_ms_worst_run"] = max(r["lateness_p99_ms"] for r in rows)
        med["runs"] = len(rows)
        medians[system] = med
    return {"summary": medians, "runs": [r for rows in per.values() for r in rows]}
