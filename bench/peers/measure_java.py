"""Measures the Java peers on their own, on one broker: the figures the peer benchmark sets
beside retryd's. Each scenario produces a fresh topic (6 partitions) and runs the peers on it
with a fresh group; results are printed and written as JSON.

    RETRYD_TEST_BOOTSTRAP=host:port python -m bench.peers.measure_java success keyed retry

Scenarios: ``success`` 2 x 300,000 records of 200 B (the second half measured after JIT
warm-up: ``warm_*``) through a no-op handler, both peers; ``keyed`` 2 x 10,000 records on 50
keys, handler 0-5 ms, Parallel Consumer at 16 and 64 in flight; ``retry`` 1,000 records that
fail once, retried after 1 s, Spring (with its defaults, and with ``--spring-fetch-wait-ms``
also with that consumer ``fetch.max.wait.ms``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.peers import java

PARTITIONS = 6
VALUE = bytes(200)


def topic_with(bootstrap: str, n: int, keys: int) -> str:
    topic = f"peer-java-{uuid.uuid4().hex[:8]}"
    h.create_topics(bootstrap, [topic], PARTITIONS)
    t0 = time.monotonic()
    h.produce(bootstrap, topic, n, value=lambda i: VALUE, key=lambda i: str(i % keys).encode())
    print(f"  produced {n} records to {topic} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return topic


def one(name: str, bootstrap: str, topic: str, n: int, shape: str, **options: Any) -> dict:
    t0 = time.monotonic()
    result = java.run(name, bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}", n, shape, **options)
    result["process_s"] = round(time.monotonic() - t0, 2)
    print(f"  {name} {shape} {options}: {summary(result)}", file=sys.stderr)
    return result


def summary(r: dict[str, Any]) -> str:
    parts = [f"wall {r['wall_s']:.2f} s", f"cpu {r['cpu_s']:.2f} s"]
    if "warm_wall_s" in r:
        n = r["handled"] - r["warm_from"]
        parts.append(
            f"warm {n / r['warm_wall_s']:,.0f} rec/s, {r['warm_cpu_s'] / n * 1e6:.1f} us CPU/rec"
        )
    if "lateness_ms" in r:
        late = r["lateness_ms"]
        quantiles = ("min", "p50", "p99", "max")
        parts.append("lateness ms " + " ".join(f"{k} {late[k]:.1f}" for k in quantiles))
    return ", ".join(parts)


def success(bootstrap: str, n: int) -> list[dict]:
    topic = topic_with(bootstrap, 2 * n, 50_000)
    return [
        one(name, bootstrap, topic, 2 * n, "success", warm_from=n, timeout_s=900)
        for name in ("spring", "parallel-consumer")
    ]


def keyed(bootstrap: str, n: int) -> list[dict]:
    topic = topic_with(bootstrap, 2 * n, 50)
    return [
        one("parallel-consumer", bootstrap, topic, 2 * n, "keyed", concurrency=k, warm_from=n)
        for k in (16, 64)
    ]


def retry(bootstrap: str, n: int, fetch_wait_ms: int | None) -> list[dict]:
    results = [one("spring", bootstrap, topic_with(bootstrap, n, n), n, "retry", timeout_s=1800)]
    if fetch_wait_ms is not None:
        props = {"peer.consumer.fetch.max.wait.ms": str(fetch_wait_ms)}
        topic = topic_with(bootstrap, n, n)
        results.append(one("spring", bootstrap, topic, n, "retry", jvm_props=props))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="+", choices=("success", "keyed", "retry"))
    ap.add_argument("--success-records", type=int, default=300_000)
    ap.add_argument("--keyed-records", type=int, default=10_000)
    ap.add_argument("--retry-records", type=int, default=1_000)
    ap.add_argument("--spring-fetch-wait-ms", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    bootstrap = os.environ.get("RETRYD_TEST_BOOTSTRAP")
    if not bootstrap:
        raise SystemExit("set RETRYD_TEST_BOOTSTRAP to the broker to measure on")
    results: dict[str, list[dict]] = {}
    for scenario in args.scenarios:
        print(f"{scenario}:", file=sys.stderr)
        if scenario == "success":
            results[scenario] = success(bootstrap, args.success_records)
        elif scenario == "keyed":
            results[scenario] = keyed(bootstrap, args.keyed_records)
        else:
            results[scenario] = retry(bootstrap, args.retry_records, args.spring_fetch_wait_ms)
    doc = {"java": java.java_version(), "partitions": PARTITIONS, "results": results}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
