"""The throughput cost of ``key_order = strict`` against ``key_order = none``.

One in-process worker (library API, default settings but the retry sequence), on a fresh broker
per run (Apache Kafka, one KRaft node; ``RETRYD_TEST_BOOTSTRAP`` for an existing cluster):
N records over K keys on 6 partitions, a handler that fails a given share of its calls, timed
from the first handler call to the moment every record has succeeded, and the process CPU the
run took. ``--runs`` alternate none and strict; the medians and the strict/none ratio are
printed per failure rate, one JSON line each.

With failures strict order has a floor no engine can beat: a key's later records wait for a
failed one until its retry, one tier delay later, so the run lasts at least as long as the key
whose records failed most often needs (failed calls of its records x the tier delay). The
report gives that floor (``strict_floor_s``, from the calls of the strict run) beside the time.

    python -m bench.bench_key_order [--records 20000] [--keys 200] [--fail 0,0.1] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from collections import Counter
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
DELAY_S = 0.5  # the retry sequence's delay (14 tiers of it: failures never run out)


def run(bootstrap: str, mode: str, n: int, keys: int, fail: float, tag: str) -> dict[str, Any]:
    lock = threading.Lock()
    done: set[int] = set()
    first: list[float] = []
    last = [0.0]
    rng = random.Random(7)
    failed_calls: Counter[bytes | None] = Counter()  # per key

    def handler(m: Message) -> None:
        now = time.monotonic()
        with lock:
            if not first:
                first.append(now)
            if rng.random() < fail:
                failed_calls[m.key] += 1
                raise RuntimeError("transient")
            done.add(int(m.value or b"0"))
            last[0] = now

    with TemporaryDirectory() as state:
        settings = load_settings(
            bootstrap_servers=bootstrap,
            main_topics=f"main-{tag}",
            retry_sequence=",".join([f"{int(DELAY_S * 1000)}ms"] * 14),
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
        cpu0 = time.process_time()
        t.start()
        deadline = time.monotonic() + 600
        while len(done) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu = time.process_time() - cpu0
        worker.stop()
        t.join(60)
        summary = worker.summary
    seconds = last[0] - first[0] if first else float("nan")
    worst = max(failed_calls.values(), default=0)
    return {
        "mode": mode,
        "fail": fail,
        "records": n,
        "keys": keys,
        "succeeded": len(done),
        "seconds": round(seconds, 2),
        "msg_per_s": round(n / seconds) if seconds > 0 else None,
        "cpu_s_per_million": round(cpu / n * 1e6, 1),
        "parked": summary.key_order_events.get("parked", 0),
        "waited": summary.key_order_events.get("waited", 0),
        # the floor strict order sets: the key that failed most, one tier delay per failure
        "most_failed_calls_of_one_key": worst,
        "strict_floor_s": round(worst * DELAY_S, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--fail", default="0,0.1")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(json.dumps({"broker": broker_info()["label"]}))
    for fail in (float(x) for x in args.fail.split(",")):
        rows: dict[str, list[dict[str, Any]]] = {"none": [], "strict": []}
        for i in range(args.runs):
            order = ("none", "strict") if i % 2 == 0 else ("strict", "none")
            for mode in order:
                with broker() as bootstrap:
                    tag = f"ko{time.time_ns() % 10**9}"
                    row = run(bootstrap, mode, args.records, args.keys, fail, tag)
                print(json.dumps(row), flush=True)
                rows[mode].append(row)
        med = {
            mode: {
                k: statistics.median(r[k] for r in rs)
                for k in ("seconds", "cpu_s_per_million", "strict_floor_s")
            }
            for mode, rs in rows.items()
        }
        print(
            json.dumps(
                {
                    "fail": fail,
                    "runs": args.runs,
                    "median_seconds": {m: v["seconds"] for m, v in med.items()},
                    "median_cpu_s_per_million": {m: v["cpu_s_per_million"] for m, v in med.items()},
                    "strict_vs_none": round(med["none"]["seconds"] / med["strict"]["seconds"], 3),
                    "strict_floor_s": med["strict"]["strict_floor_s"],
                    "strict_vs_floor": round(
                        med["strict"]["strict_floor_s"] / med["strict"]["seconds"], 3
                    )
                    if fail
                    else None,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
