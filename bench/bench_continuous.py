"""Latency of ``retryd spark archive --continuous``: from a dead letter's acknowledgement by the
broker to the commit of the archive batch that holds it.

Starts the real CLI (its own Spark, ``local[2]``) on a fresh topic, waits for the query to run,
then produces one dead letter at a time at intervals that do not line up with the trigger and
reads each one's commit from the archive's state (``_retryd_archive/commits/N.json``:
``started_ms``, ``committed_ms``). Prints per record: picked up after (start of the
micro-batch that archived it) and archived after; then medians and maxima.

    python bench/bench_continuous.py [--trigger 2s] [--records 10]

The broker is the benchmarks' default: Apache Kafka, one KRaft node (``RETRYD_BENCH_BROKER=tansu``
for the embedded Tansu, ``--bootstrap`` / ``RETRYD_TEST_BOOTSTRAP`` for an existing cluster).
Results go to ``bench/results/continuous-<broker>-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness as h  # noqa: E402
from retryd.policy.headers import Envelope, routed_headers  # noqa: E402
from retryd.policy.timespec import parse_duration  # noqa: E402


def commits(out: Path) -> list[dict]:
    folder = out / "_retryd_archive" / "commits"
    found = [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.exists() else []
    return sorted(found, key=lambda c: c["batch"])


def wait(cond, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trigger", default="2s")
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--bootstrap", default=os.environ.get("RETRYD_TEST_BOOTSTRAP"))
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    if args.bootstrap:
        os.environ["RETRYD_TEST_BOOTSTRAP"] = args.bootstrap
    with h.broker() as bootstrap:
        return measure(args, bootstrap)


def measure(args: argparse.Namespace, bootstrap: str) -> int:
    trigger_s = parse_duration(args.trigger) / 1000
    work = Path(tempfile.mkdtemp(prefix="retryd-continuous-"))
    out, log = work / "archive", (work / "cli.log").open("wb")
    topic = f"bench-cont-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    headers = routed_headers(
        [], Envelope("orders", 0, 1, 1_700_000_000_000, 6, None, 1_700_000_000_001,
                     "TimeoutError", "timed out after 30s", "exhausted")
    )  # fmt: skip

    def send(i: int) -> tuple[float, int, int]:
        """Produce one record; (ack time in epoch ms, partition, offset)."""
        acked: list[tuple[float, int, int]] = []
        producer.produce(
            topic, value=b"value-%d" % i, headers=headers,
            on_delivery=lambda err, msg: acked.append((time.time(), msg.partition(), msg.offset())),
        )  # fmt: skip
        producer.flush(30)
        when, part, offset = acked[0]
        return when * 1000, part, offset

    def holding(part: int, offset: int) -> list[dict]:
        """Commits whose checkpoint is past the record (the first one archived it)."""
        return [c for c in commits(out) if int(c["offsets"].get(str(part), 0)) > offset]

    cmd = [
        str(Path(sys.executable).parent / "retryd"), "spark", "archive", "--continuous",
        "--out", str(out), "--checkpoint", str(work / "checkpoint"), "--trigger", args.trigger,
        "--topic", topic, "--bootstrap-servers", bootstrap, "--master", "local[2]",
        "--spark-conf", "spark.ui.enabled=false",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYD_")}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # fmt: skip
    picked: list[float] = []
    archived: list[float] = []
    try:
        send(0)
        wait(lambda: commits(out), 300, "the query's first batch")
        for i in range(1, args.records + 1):
            time.sleep(trigger_s * 0.37 * (1 + i % 3))  # never in step with the trigger
            acked_ms, part, offset = send(i)
            found = wait(lambda p=part, o=offset: holding(p, o), 120, f"record {i} archived")
            batch = found[0]
            picked.append((batch["started_ms"] - acked_ms) / 1000)
            archived.append((batch["committed_ms"] - acked_ms) / 1000)
            print(f"record {i}: picked up after {picked[-1]:.2f}s, archived after "
                  f"{archived[-1]:.2f}s (batch {batch['batch']})", flush=True)  # fmt: skip
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
        log.close()
    print(
        f"\ntrigger {trigger_s:g}s, {len(archived)} records: picked up after median "
        f"{statistics.median(picked):.2f}s (max {max(picked):.2f}s), archived after median "
        f"{statistics.median(archived):.2f}s (max {max(archived):.2f}s)"
    )
    broker = h.broker_info()
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "broker": broker,
        "trigger_s": trigger_s,
        "records": len(archived),
        "picked_up_s": [round(x, 3) for x in picked],
        "archived_s": [round(x, 3) for x in archived],
        "picked_up_median_s": round(statistics.median(picked), 3),
        "picked_up_max_s": round(max(picked), 3),
        "archived_median_s": round(statistics.median(archived), 3),
        "archived_max_s": round(max(archived), 3),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    if not args.no_write:
        folder = ROOT / "bench" / "results"
        out = folder / f"continuous-{broker['kind']}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
