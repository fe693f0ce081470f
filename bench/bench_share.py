"""Share mode's benchmarks (issue 26), on an existing cluster (``RETRYD_TEST_BOOTSTRAP``):

    python bench/bench_share.py [--records 1500] [--procs 1,4]          # parallelism
    python bench/bench_share.py --scenario lateness [--records 1000] [--runs 3] [--quick]

``lateness``: every record fails once and is retried after 1 s, retryd against the broker
alone (a share consumer's RELEASE; ``bench/share_lateness.py``). Writes
``bench/results/share-lateness.json`` (``--quick``: 50 records, one run, no file unless
``--out``).

``parallelism``: one main-topic partition, a 20 ms handler, one call at a time per process
(``max_in_flight = 1``), ``retryd worker --processes N`` through the CLI.

A consumer group hands the partition to one member, so more processes change nothing; a share
group (``consumer_mode = share``) hands its records to every member. Each call appends its
end time to a file (one ``os.write``); the rate is taken over the calls between the 10th and
the 90th percentile of those times, so the joins at the start and the last stragglers do not
count. Twice: records produced one per producer batch, and in batches of up to 1000 (a burst
from a batching producer): a share consumer acquires whole producer batches, so batches are
what is spread over the workers. Writes ``bench/results/share-parallelism.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

HANDLER = "python:bench.handlers:sleep20_logged"
RESULTS = ROOT / "bench" / "results" / "share-parallelism.json"
LATENESS_RESULTS = ROOT / "bench" / "results" / "share-lateness.json"


def _topics(admin: AdminClient, group: str) -> str:
    main = f"{group}.main"
    names = {main: 1, f"{group}.retry_1s": 1, f"{group}.failed": 1}
    for future in admin.create_topics([NewTopic(n, p, 1) for n, p in names.items()]).values():
        future.result(30)
    return main


def _share_group(admin: AdminClient, group: str) -> None:
    resource = ConfigResource(
        ResourceType.GROUP,
        f"{group}.share",
        incremental_configs=[
            ConfigEntry(
                "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _produce(bootstrap: str, topic: str, n: int, batch: int) -> None:
    """``n`` records in producer batches of up to ``batch`` records (a share consumer acquires
    whole batches: what one worker takes at once)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": batch}
    )
    for i in range(n):
        producer.produce(topic, b"x" * 100, str(i).encode(), partition=0)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(60)


def _ends(path: Path) -> list[float]:
    if not path.exists():
        return []
    return sorted(float(x) for x in path.read_text().split())


def scenario(
    bootstrap: str, mode: str, procs: int, records: int, batch: int, tmp: Path
) -> dict[str, Any]:
    group = f"bshare-{mode}-{procs}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    main = _topics(admin, group)
    if mode == "share":
        _share_group(admin, group)
    _produce(bootstrap, main, records, batch)
    calls = tmp / f"{group}.calls"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BENCH_CALLS_FILE": str(calls),
        "RETRYD_BOOTSTRAP_SERVERS": bootstrap,
        "RETRYD_MAIN_TOPICS": main,
        "RETRYD_GROUP_ID": group,
        "RETRYD_TIER_TEMPLATE": "{group}.retry_{delay}",
        "RETRYD_FAILED_TOPIC": f"{group}.failed",
        "RETRYD_RETRY_SEQUENCE": "1s",
        "RETRYD_HANDLER": HANDLER,
        "RETRYD_HANDLER_TIMEOUT_S": "5",
        "RETRYD_MAX_IN_FLIGHT": "1",
        "RETRYD_ORDERING": "none",
        "RETRYD_CONSUMER_MODE": mode,
        "RETRYD_PROCESSES": str(procs),
        "RETRYD_STATE_DIR": str(tmp / group),
        "RETRYD_CIRCUIT_BREAKER": "false",
        "RETRYD_LOG_LEVEL": "WARNING",
    }
    log = open(tmp / f"{group}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "retryd", "worker"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    started = time.monotonic()
    try:
        while len(_ends(calls)) < records:
            if proc.poll() is not None:
                raise SystemExit(f"{mode} x{procs}: the worker exited {proc.returncode}")
            if time.monotonic() - started > 600:
                raise SystemExit(f"{mode} x{procs}: not done after 600 s")
            time.sleep(0.5)  # a benchmark's progress check, not a worker's synchronisation
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    ends = _ends(calls)
    lo, hi = ends[len(ends) // 10], ends[len(ends) * 9 // 10]
    middle = [t for t in ends if lo <= t <= hi]
    rate = (len(middle) - 1) / (hi - lo) if hi > lo else float("nan")
    return {
        "mode": mode,
        "processes": procs,
        "records": records,
        "producer_batch": batch,
        "calls": len(ends),
        "records_per_s": round(rate, 1),
        "whole_run_s": round(ends[-1] - ends[0], 2),
    }


def _out(name: str | None, default: Path) -> Path:
    """``--out``: a path, or a bare file name in bench/results."""
    if not name:
        return default
    path = Path(name)
    return path if path.is_absolute() or path.parent != Path(".") else default.parent / path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("parallelism", "lateness"), default="parallelism")
    parser.add_argument("--records", type=int, default=None, help="1500; lateness: 1000")
    parser.add_argument("--procs", default="1,4")
    parser.add_argument("--batches", default="1,1000", help="records per producer batch")
    parser.add_argument("--modes", default="group,share")
    parser.add_argument("--runs", type=int, default=None, help="lateness: rounds (3; quick 1)")
    parser.add_argument("--quick", action="store_true", help="lateness: 50 records, one run")
    parser.add_argument("--out", default=None, help="a file name in bench/results, or a path")
    args = parser.parse_args()
    bootstrap = os.environ.get("RETRYD_TEST_BOOTSTRAP")
    if not bootstrap:
        raise SystemExit("set RETRYD_TEST_BOOTSTRAP to a Kafka >= 4.2 cluster")
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-share-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    if args.scenario == "lateness":
        lateness(args, bootstrap, tmp)
        return
    records = args.records or 1500
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for mode in args.modes.split(","):
            for procs in (int(p) for p in args.procs.split(",")):
                row = scenario(bootstrap, mode, procs, records, batch, tmp)
                print(json.dumps(row), flush=True)
                rows.append(row)
    for r in rows:
        base = next(
            b for b in rows if (b["mode"], b["producer_batch"]) == (r["mode"], r["producer_batch"])
        )
        r["vs_one_process"] = round(r["records_per_s"] / base["records_per_s"], 2)
    _out(args.out, RESULTS).write_text(
        json.dumps(
            {
                "what": "1 partition, 20 ms sync handler, max_in_flight=1 per process",
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    for r in rows:
        print(
            f"batches of {r['producer_batch']:5}: {r['mode']:5} x{r['processes']}: "
            f"{r['records_per_s']:7.1f} records/s ({r['vs_one_process']}x one process)"
        )


def lateness(args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
    """The lateness scenario (``bench/share_lateness.py``), its file and its table."""
    from bench import share_lateness

    records = args.records or (50 if args.quick else 1000)
    runs = args.runs or (1 if args.quick else 3)
    load = os.getloadavg()
    got = share_lateness.run(bootstrap, records, runs, tmp)
    report = {
        "what": "every record fails once, retried after 1 s; lateness = second call - "
        "(failure + 1 s); share groups on one partition",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "broker": bootstrap,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in load],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "records_per_run": records,
        **got,
    }
    if args.out or not args.quick:
        _out(args.out, LATENESS_RESULTS).write_text(json.dumps(report, indent=1) + "\n")
    for system, m in got["summary"].items():
        print(
            f"{system:7}: lateness p50 {m['lateness_p50_ms']:7.1f} ms, p99 "
            f"{m['lateness_p99_ms']:7.1f} ms (worst run {m['lateness_p99_ms_worst_run']:.1f}), "
            f"min/max {m['lateness_min_ms']:.1f}/{m['lateness_max_ms']:.1f} ms, early "
            f"{m['early']}/{m['records']}, drain {m['drain_s']:.2f} s, CPU "
            f"{m['cpu_ms_per_record']:.3f} ms/record ({m['runs']} runs: medians, min/max and "
            "counts over all)"
        )
    print(json.dumps(got["summary"]))


if __name__ == "__main__":
    main()
