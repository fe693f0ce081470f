"""The throughput cost of ``key_order = strict`` against ``key_order = none``.

One in-process worker (library API, default settings but the retry sequence), on a fresh broker
per run (Apache Kafka, one KRaft node; ``RETRYD_TEST_BOOTSTRAP`` for an existing cluster):
N records over K keys on 6 partitions, a handler that fails a given share of its calls, timed
from the first handler call to the moment every record has succeeded. Prints one JSON line per
run and the strict/none ratio per failure rate.

    python bench/bench_key_order.py [--records 20000] [--keys 200] [--fail 0,0.1]
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from bench.harness import broker, broker_info, create_topics, produce
from retryd.config import load_settings
from retryd.handlers.base import Message
from retryd.handlers.python_handler import PythonHandler
from retryd.kafka.topics import create_topics as provision
from retryd.kafka.topics import make_admin
from retryd.worker.assembly import build_worker

PARTITIONS = 6


def run(bootstrap: str, mode: str, n: int, keys: int, fail: float, tag: str) -> dict[str, Any]:
    lock = threading.Lock()
    done: set[int] = set()
    first: list[float] = []
    last = [0.0]
    rng = random.Random(7)

    def handler(m: Message) -> None:
        now = time.monotonic()
        with lock:
            if not first:
                first.append(now)
            if rng.random() < fail:
                raise RuntimeError("transient")
            done.add(int(m.value or b"0"))
            last[0] = now

    with TemporaryDirectory() as state:
        settings = load_settings(
            bootstrap_servers=bootstrap,
            main_topics=f"main-{tag}",
            retry_sequence=",".join(["500ms"] * 14),
            tier_template=f"{tag}.retry_{{delay}}",
            failed_topic=f"{tag}.failed",
            group_id=f"g-{tag}",
            key_order=mode,
            key_state_topic=f"{tag}.key_state",
            state_dir=Path(state),
            circuit_breaker=False,
        )
        create_topics(bootstrap, [f"main-{tag}"], PARTITIONS)
        provision(settings, make_admin(settings))
        produce(
            bootstrap,
            f"main-{tag}",
            n,
            value=lambda i: b"%d" % i,
            key=lambda i: b"k%d" % (i % keys),
        )
        worker = build_worker(settings, PythonHandler(handler, timeout_s=30.0))
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        deadline = time.monotonic() + 600
        while len(done) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.stop()
        t.join(60)
        summary = worker.summary
    seconds = last[0] - first[0] if first else float("nan")
    return {
        "mode": mode,
        "fail": fail,
        "records": n,
        "keys": keys,
        "succeeded": len(done),
        "seconds": round(seconds, 2),
        "msg_per_s": round(n / seconds) if seconds > 0 else None,
        "parked": summary.key_order_events.get("parked", 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--fail", default="0,0.1")
    args = ap.parse_args()
    print(json.dumps({"broker": broker_info()["label"]}))
    for fail in (float(x) for x in args.fail.split(",")):
        rates = {}
        for mode in ("none", "strict"):
            with broker() as bootstrap:
                tag = f"ko{time.time_ns() % 10**9}"
                row = run(bootstrap, mode, args.records, args.keys, fail, tag)
            print(json.dumps(row), flush=True)
            rates[mode] = row["msg_per_s"]
        if rates["none"] and rates["strict"]:
            print(
                json.dumps(
                    {"fail": fail, "strict_vs_none": round(rates["strict"] / rates["none"], 3)}
                )
            )


if __name__ == "__main__":
    main()
