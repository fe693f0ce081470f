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


def adapter_single(url: str, in_flight: int, seconds: float) -> dict[str, float]:
    """``HttpHandler.acall``: calls/s and CPU µs per call."""
    from retryd.handlers.http_handler import HttpHandler

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
    in_flights: list[int], delays: list[float], seconds: float, bulk: bool = True
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for delay in delays:
        with goservice.start(delay_ms=delay) as svc:
            for n in in_flights:
                got = adapter_single(svc.url, n, seconds)
                row: dict[str, Any] = {"mode": "adapter", "delay_ms": delay, "in_flight": n, **got}
                if delay:
                    row["ratio_to_ideal"] = round(got["calls_per_s"] / (n / (delay / 1000)), 3)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["adapter", "cli"])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--in-flight", default="16,64,256")
    parser.add_argument("--delay", default="0,20")
    parser.add_argument("--no-bulk", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    if args.what == "adapter":
        rows = adapter_rows(
            [int(x) for x in args.in_flight.split(",")],
            [float(x) for x in args.delay.split(",")],
            args.seconds,
            bulk=not args.no_bulk,
        )
    else:
        bootstrap = os.environ.get("RETRYD_TEST_BOOTSTRAP", "")
        rows = run(bootstrap, args.quick)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


def run(bootstrap: str, quick: bool) -> list[dict]:
    raise NotImplementedError(str(uuid) and bootstrap and quick)


if __name__ == "__main__":
    main()
