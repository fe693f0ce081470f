"""The HTTP handler's throughput: the adapter alone, and ``retryd worker`` through the CLI,
against the Go business service (``bench/goservice.py``), next to a plain async client.

    python bench/bench_http.py adapter [--seconds 3] [--in-flight 16,64,256] [--delay 0,20]
    python bench/bench_http.py cli [--quick]      # needs RETRYD_TEST_BOOTSTRAP or starts a broker

``adapter``: ``HttpHandler.acall`` (and ``HttpBulkHandler.acall_batch``) driven directly by
``in_flight`` asyncio tasks, no Kafka: calls (records) per second and this process's CPU
microseconds per call. This is what the handler is tuned with.

``cli`` (``run(bootstrap, quick)``): ``retryd worker --handler http://.../handle`` at default
settings with ``RETRYD_MAX_IN_FLIGHT`` 16/64/256, throughput read from the worker's metrics as
in ``bench_worker``; next to a baseline in the same run: a confluent-kafka consumer and an
aiohttp client posting each record with the same concurrency to the same service. Rows at
0 ms and 20 ms; at 20 ms also the ratio to in_flight / latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import goservice  # noqa: E402

VALUE_BYTES = 200
PARTITIONS = 6


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _messages(n: int) -> list[Any]:
    from retryd.handlers.base import Message

    return [
        Message(
            key=b"key-%d" % (i % 1000),
            value=(b"%d" % i).ljust(VALUE_BYTES, b"x"),
            topic="orders",
            partition=i % PARTITIONS,
            offset=i,
        )
        for i in range(n)
    ]


async def _drive(
    call: Callable[[Any], Awaitable[Any]], items: list[Any], in_flight: int, seconds: float
) -> tuple[int, float, float]:
    """``in_flight`` tasks calling ``call`` back to back for ``seconds`` (after a warm-up of
    a tenth of that): (calls, wall seconds, CPU seconds)."""
    stop_at = 0.0
    count = 0
    measuring = False

    async def one(i: int) -> None:
        nonlocal count
        j = i
        while time.monotonic() < stop_at:
            await call(items[j % len(items)])
            j += in_flight
            if measuring:
                count += 1

    stop_at = time.monotonic() + max(0.3, seconds / 10)
    await asyncio.gather(*(one(i) for i in range(in_flight)))  # warm-up: pool filled
    measuring = True
    cpu0, t0 = _cpu_s(), time.monotonic()
    stop_at = t0 + seconds
    await asyncio.gather(*(one(i) for i in range(in_flight)))
    return count, time.monotonic() - t0, _cpu_s() - cpu0


def handler_class(before: str | None = None) -> Any:
    """``HttpHandler`` of this tree, or of git revision ``before`` (its http_handler.py
    loaded as a module of its own, next to this tree's other modules)."""
    if not before:
        from retryd.handlers.http_handler import HttpHandler

        return HttpHandler
    import subprocess
    import types

    path = "retryd/handlers/http_handler.py"
    source = subprocess.run(
        ["git", "show", f"{before}:{path}"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    module = types.ModuleType("http_handler_before")
    sys.modules[module.__name__] = module  # dataclasses and typing look modules up by name
    exec(compile(source, f"{before}:{path}", "exec"), module.__dict__)
    return module.HttpHandler


def adapter_single(
    url: str, in_flight: int, seconds: float, before: str | None = None
) -> dict[str, float]:
    """``HttpHandler.acall`` (of revision ``before`` when given): calls/s, CPU µs per call."""
    HttpHandler = handler_class(before)

    async def main() -> tuple[int, float, float, int]:
        handler = HttpHandler(url, timeout_s=30, max_connections=in_flight)
        items = _messages(1000)
        failures = 0

        async def call(message: Any) -> None:
            nonlocal failures
            result = await handler.acall(message)
            if result.outcome.value != "success":
                failures += 1

        try:
            got = await _drive(call, items, in_flight, seconds)
        finally:
            await handler.aclose()
        return (*got, failures)

    calls, wall, cpu, failures = asyncio.run(main())
    return {
        "calls_per_s": round(calls / wall),
        "cpu_us_per_call": round(cpu / calls * 1e6, 1),
        "failures": failures,
    }


def adapter_bulk(url: str, in_flight: int, batch: int, seconds: float) -> dict[str, float]:
    """``HttpBulkHandler.acall_batch`` with ``batch`` records per request: records/s, CPU µs
    per record."""
    from retryd.handlers.http_bulk import HttpBulkHandler

    async def main() -> tuple[int, float, float, int]:
        handler = HttpBulkHandler(url, timeout_s=30, max_batch=batch, max_connections=in_flight)
        items = _messages(batch * 8)
        batches = [items[i : i + batch] for i in range(0, len(items), batch)]
        failures = 0

        async def call(messages: Any) -> None:
            nonlocal failures
            results = await handler.acall_batch(messages)
            failures += sum(r.outcome.value != "success" for r in results)

        try:
            got = await _drive(call, batches, in_flight, seconds)
        finally:
            await handler.aclose()
        return (*got, failures)

    calls, wall, cpu, failures = asyncio.run(main())
    records = calls * batch
    return {
        "records_per_s": round(records / wall),
        "requests_per_s": round(calls / wall),
        "cpu_us_per_record": round(cpu / records * 1e6, 2),
        "failures": failures,
    }


def adapter_rows(
    in_flights: list[int],
    delays: list[float],
    seconds: float,
    bulk: bool = True,
    before: str | None = None,
    unix: str | None = None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for delay in delays:
        with goservice.start(delay_ms=delay, unix=unix) as svc:
            for n in in_flights:
                got = adapter_single(svc.url, n, seconds)
                row: dict[str, Any] = {"mode": "adapter", "delay_ms": delay, "in_flight": n}
                row.update(got, unix=bool(unix))
                if before:
                    old = adapter_single(svc.url, n, seconds, before)
                    row["before"] = old
                    row["cpu_before_vs_now"] = round(
                        old["cpu_us_per_call"] / got["cpu_us_per_call"], 2
                    )
                if delay:
                    ideal = n / (delay / 1000)
                    row["ratio_to_ideal"] = round(got["calls_per_s"] / ideal, 3)
                    if before:
                        row["before_ratio_to_ideal"] = round(old["calls_per_s"] / ideal, 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
            if bulk:
                for n, batch in ((4, 500), (16, 100)):
                    try:
                        got = adapter_bulk(svc.bulk_url, n, batch, seconds)
                    except ImportError:
                        break
                    row = {
                        "mode": "adapter_bulk",
                        "delay_ms": delay,
                        "in_flight": n,
                        "batch": batch,
                        **got,
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


# ------------------------------------------------------------------ through the CLI
# Bulk rows: ``retryd worker`` with ``RETRYD_HANDLER_BATCH=<batch>`` (``--handler-batch``) runs
# an http handler as ``HttpBulkHandler`` against the service's /bulk, ``max_in_flight // batch``
# requests at a time (at least one). Rows: (batch, max_in_flight, compact answers); 16 is the
# default max_in_flight; compact: the service names only the records that did not succeed and
# answers "default_status": "SUCCESS" (docs/http-bulk.md).
BULK_ROWS = ((100, 16, False), (500, 16, False), (500, 2000, False), (500, 2000, True))
BULK_N = 200_000


def _bulk_supported() -> bool:
    from retryd.config.settings import Settings

    return "handler_batch" in Settings.model_fields


def _rows_n(delay_ms: float, in_flight: int, quick: bool) -> int:
    """Records per row: about 6 s at the ideal rate, at least 3,000, at most 60,000."""
    if quick:
        return 600
    ideal = 15_000.0 if delay_ms == 0 else in_flight / (delay_ms / 1000)
    return int(min(60_000, max(3_000, ideal * 6)))


def _baseline(bootstrap: str, topic: str, n: int, url: str, in_flight: int) -> dict:
    """The plain async client in a fresh process (``child`` below)."""
    import subprocess

    out = subprocess.run(
        [sys.executable, __file__, "child", bootstrap, topic, str(n), url, str(in_flight)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if out.returncode != 0:
        raise SystemExit(f"baseline failed:\n{out.stderr[-3000:]}")
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def _plain_client(bootstrap: str, topic: str, n: int, url: str, in_flight: int) -> dict:
    """confluent-kafka consumer + aiohttp: each record POSTed (value as the body, its
    coordinates as headers), at most ``in_flight`` at once, offset stored when answered. From
    the first record consumed to the n-th answered."""
    import aiohttp
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-plain-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.offset.store": False,
            "session.timeout.ms": 6000,
        }
    )
    c.subscribe([topic])
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=in_flight), auto_decompress=False
    )
    sem = asyncio.Semaphore(in_flight)
    done = 0
    failed = 0
    tasks: set[asyncio.Task[None]] = set()

    async def post(msg: Any) -> None:
        nonlocal done, failed
        try:
            headers = {
                "Content-Type": "application/octet-stream",
                "X-Retryd-Topic": msg.topic(),
                "X-Retryd-Partition": str(msg.partition()),
                "X-Retryd-Offset": str(msg.offset()),
            }
            async with session.post(url, data=msg.value(), headers=headers) as resp:
                await resp.read()
                failed += resp.status != 200
        finally:
            sem.release()
        c.store_offsets(message=msg)
        done += 1

    start = cpu0 = 0.0
    try:
        while done < n:
            batch = c.consume(500, 0 if start else 1.0)
            if not batch:
                await asyncio.sleep(0.002)
                continue
            if not start:
                start, cpu0 = time.monotonic(), _cpu_s()
            for msg in batch:
                if msg.error():
                    continue
                await sem.acquire()
                task = asyncio.create_task(post(msg))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        elapsed, cpu = time.monotonic() - start, _cpu_s() - cpu0
    finally:
        await session.close()
        c.close()
    return {
        "msgs_per_s": n / elapsed,
        "seconds": elapsed,
        "cpu_us_per_msg": cpu / n * 1e6,
        "failed": failed,
    }


def _retryd(
    bootstrap: str,
    topic: str,
    n: int,
    handler: str,
    tree: Path,
    scratch: Path,
    quick: bool,
    **env: str,
) -> dict:
    from bench import bench_worker as bw

    run_ = bw.Run(quick, scratch)
    cli = run_.cli(bootstrap, topic, handler, **env)
    cli.root = tree
    cli.topics_create()
    got: dict = bw._throughput(run_, cli, topic, "success", n)
    return got


def run(
    bootstrap: str,
    quick: bool,
    before: Path | None = None,
    kinds: tuple[str, ...] = ("single", "bulk"),
    delays: tuple[float, ...] = (0.0, 20.0),
) -> list[dict]:
    """Rows at 0 ms and 20 ms: single-record mode for max_in_flight 16/64/256, retryd through
    the CLI (and the tree ``before``, when given, in the same run) vs the plain async client;
    then bulk mode (``BULK_ROWS``)."""
    import tempfile

    from bench import harness as h

    rows: list[dict] = []
    in_flights = (16, 64) if quick else (16, 64, 256)
    bulk = "bulk" in kinds and _bulk_supported()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for delay in delays:
            n_max = max(_rows_n(delay, f, quick) for f in in_flights) if "single" in kinds else 0
            if bulk:
                n_max = max(n_max, 600 if quick else BULK_N)
            topic = f"bench-http-{uuid.uuid4().hex[:8]}"
            h.create_topics(bootstrap, [topic], PARTITIONS)
            h.produce(
                bootstrap,
                topic,
                n_max,
                value=lambda i: (b"%d" % i).ljust(VALUE_BYTES, b"x"),
                key=lambda i: b"key-%d" % (i % 50_000),
            )
            with goservice.start(delay_ms=delay) as svc:
                for in_flight in in_flights if "single" in kinds else ():
                    rows.append(
                        _single_row(bootstrap, topic, svc, delay, in_flight, quick, before, scratch)
                    )
                    print(json.dumps(rows[-1]), flush=True)
                for batch, in_flight, compact in BULK_ROWS if bulk else ():
                    n = 600 if quick else BULK_N
                    env = {
                        "RETRYD_HANDLER_BATCH": str(batch),
                        "RETRYD_MAX_IN_FLIGHT": str(in_flight),
                    }
                    url = svc.bulk_url + ("?compact=1" if compact else "")
                    got = _retryd(bootstrap, topic, n, url, ROOT, scratch, quick, **env)
                    row = {
                        "delay_ms": delay,
                        "bulk_batch": batch,
                        "in_flight": in_flight,
                        "requests_at_once": max(1, in_flight // batch),
                        "compact": compact,
                        "n": n,
                        "retryd": got,
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def _single_row(
    bootstrap: str,
    topic: str,
    svc: goservice.Service,
    delay: float,
    in_flight: int,
    quick: bool,
    before: Path | None,
    scratch: Path,
) -> dict[str, Any]:
    n = _rows_n(delay, in_flight, quick)
    env = {"RETRYD_MAX_IN_FLIGHT": str(in_flight)}
    row: dict[str, Any] = {"delay_ms": delay, "in_flight": in_flight, "n": n}
    row["plain"] = _baseline(bootstrap, topic, n, svc.url, in_flight)
    row["retryd"] = _retryd(bootstrap, topic, n, svc.url, ROOT, scratch, quick, **env)
    if before is not None:
        row["retryd_before"] = _retryd(bootstrap, topic, n, svc.url, before, scratch, quick, **env)
    row["vs_plain"] = row["retryd"]["msgs_per_s"] / row["plain"]["msgs_per_s"]
    if delay:
        ideal = in_flight / (delay / 1000)
        for k in ("retryd", "retryd_before", "plain"):
            if k in row:
                row[f"{k}_ratio_to_ideal"] = row[k]["msgs_per_s"] / ideal
    return row


def child(args: list[str]) -> None:
    bootstrap, topic, n, url, in_flight = args
    print(json.dumps(asyncio.run(_plain_client(bootstrap, topic, int(n), url, int(in_flight)))))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["adapter", "cli"])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--in-flight", default="16,64,256")
    parser.add_argument("--delay", default="0,20")
    parser.add_argument("--no-bulk", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--before", help="also measure this git revision (e.g. main) in the same run"
    )
    parser.add_argument("--rows", default="single,bulk", help="cli: single, bulk or both")
    parser.add_argument("--unix", help="adapter: the service on this Unix socket path")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    if args.what == "adapter":
        rows = adapter_rows(
            [int(x) for x in args.in_flight.split(",")],
            [float(x) for x in args.delay.split(",")],
            args.seconds,
            bulk=not args.no_bulk,
            before=args.before,
            unix=args.unix,
        )
    else:
        import tempfile

        from bench import bench_worker as bw
        from bench import harness as h

        with tempfile.TemporaryDirectory() as tmp, h.broker(args.quick) as bootstrap:
            before = bw._source_tree(args.before, Path(tmp) / "before") if args.before else None
            rows = run(
                bootstrap,
                args.quick,
                before,
                kinds=tuple(args.rows.split(",")),
                delays=tuple(float(x) for x in args.delay.split(",")),
            )
    _write(args.what, rows, args.out)


def _write(what: str, rows: list[dict], out: str | None) -> None:
    """Rows with what they were measured on, to ``out`` or bench/results/http-<what>-<ts>."""
    import platform
    from datetime import UTC, datetime

    from bench import harness as h

    now = datetime.now(UTC)
    doc = {
        "when": now.isoformat(timespec="seconds"),
        "broker": h.broker_info() if what == "cli" else None,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "rows": rows,
    }
    path = (
        Path(out) if out else ROOT / "bench" / "results" / f"http-{what}-{now:%Y%m%dT%H%M%SZ}.json"
    )
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
