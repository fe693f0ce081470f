"""Worker throughput and memory, as ratios against a raw confluent-kafka loop in the same run.

    python bench/bench_worker.py [--messages 200000] [--fail-share 0.1]

Scenarios (each in its own process, so peak RSS is per scenario):
- ``raw``: a bare consumer (same group settings, batch consume, store_offsets per message):
  the floor of what any Python worker on this client can do.
- ``raw_route``: the bare consumer that also produces ``fail_share`` of the messages to another
  topic (acks=all, idempotent) and stores offsets after delivery: the floor for routing.
- ``retryd``: ``Worker`` with a no-op Python handler (success path).
- ``retryd_fail``: ``Worker`` whose handler fails ``fail_share`` of the messages (routed to a tier).
Uses the embedded broker unless RETRYD_TEST_BOOTSTRAP is set. Results go to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def produce(bootstrap: str, topic: str, n: int, fail_share: float) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    every = int(1 / fail_share) if fail_share > 0 else 0
    for i in range(n):
        fail = every and i % every == 0
        value = (b"F" if fail else b"O") + b"x" * 99
        while True:
            try:
                p.produce(topic, key=str(i).encode(), value=value)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(60)


# Read once: the handler module is imported by load_handler after run_retryd set it.
_FAIL = os.environ.get("BENCH_FAIL") == "1"


def bench_handler(message: object) -> None:
    """No-op handler that fails messages whose value starts with F (only in retryd_fail)."""
    value = getattr(message, "value", b"") or b""
    if _FAIL and value[:1] == b"F":
        raise RuntimeError("bench failure")


def run_raw(bootstrap: str, topic: str, n: int, route_to: str | None) -> float:
    from confluent_kafka import Consumer, Producer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.offset.store": False,
            "session.timeout.ms": 6000,
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )
    p = (
        Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )
        if route_to
        else None
    )
    c.subscribe([topic])
    seen = 0
    start = None
    while seen < n:
        batch = c.consume(500, 1.0)
        if batch and start is None:
            start = time.perf_counter()
        for msg in batch:
            if msg.error():
                continue
            seen += 1
            value = msg.value() or b""
            if p is not None and value[:1] == b"F":

                def done(err, out, m=msg):  # type: ignore[no-untyped-def]
                    c.store_offsets(message=m)

                p.produce(
                    route_to,
                    key=msg.key(),
                    value=value,
                    headers=[("retry_number", b"1")],
                    on_delivery=done,
                )
            else:
                c.store_offsets(message=msg)
        if p is not None:
            p.poll(0)
    if p is not None:
        p.flush(30)
    elapsed = time.perf_counter() - (start or time.perf_counter())
    c.close()
    return elapsed


def run_retryd(bootstrap: str, topic: str, n: int, fail: bool) -> float:
    from retryd.config import load_settings
    from retryd.handlers.loader import load_handler
    from retryd.worker.engine import Worker

    os.environ["BENCH_FAIL"] = "1" if fail else "0"
    group = f"bench-{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        bootstrap_servers=bootstrap,
        main_topics=topic,
        group_id=group,
        retry_sequence="1h",
        tier_template=f"{topic}.retry_{{delay}}",
        failed_topic=f"{topic}.failed",
        handler="python:bench.bench_worker:bench_handler",
        session_timeout_ms=6000,
        state_dir=Path(f"/tmp/retryd-bench-{group}"),
        role="main",
    )
    handler = load_handler(settings.handler, timeout_s=30)
    worker = Worker(settings, handler, drain_grace_s=0.2)
    summary = worker.run(until_drained=True)
    done = summary.total("success") + summary.total("retried")
    assert done == n, f"retryd processed {done} of {n}"
    return summary.busy_seconds  # first message to last, like the raw loop


def child(args: argparse.Namespace) -> None:
    if args.scenario in ("raw", "raw_route"):
        route = f"{args.topic}.retry_1h" if args.scenario == "raw_route" else None
        elapsed = run_raw(args.bootstrap, args.topic, args.messages, route)
    else:
        elapsed = run_retryd(
            args.bootstrap, args.topic, args.messages, args.scenario == "retryd_fail"
        )
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"elapsed_s": elapsed, "rss_mb": rss_mb}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--fail-share", type=float, default=0.1)
    ap.add_argument("--scenario")
    ap.add_argument("--bootstrap")
    ap.add_argument("--topic")
    args = ap.parse_args()
    if args.scenario:
        child(args)
        return

    from retryd.kafka.embedded import EmbeddedBroker
    from tests.support import create_topics

    broker = None
    bootstrap = os.environ.get("RETRYD_TEST_BOOTSTRAP")
    if not bootstrap:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap
    try:
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, [topic, f"{topic}.retry_1h"], 4)
        create_topics(bootstrap, [f"{topic}.failed"], 1)
        t0 = time.perf_counter()
        produce(bootstrap, topic, args.messages, args.fail_share)
        print(
            f"produced {args.messages} messages in {time.perf_counter() - t0:.1f}s", file=sys.stderr
        )
        results: dict[str, dict[str, float]] = {}
        for scenario in ("raw", "retryd", "raw_route", "retryd_fail"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--scenario",
                    scenario,
                    "--bootstrap",
                    bootstrap,
                    "--topic",
                    topic,
                    "--messages",
                    str(args.messages),
                ],
                check=False,
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            if out.returncode != 0:
                raise SystemExit(f"scenario {scenario} failed:\n{out.stderr[-3000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            res["msgs_per_s"] = args.messages / res["elapsed_s"]
            results[scenario] = res
            print(
                f"{scenario:12s} {res['msgs_per_s']:>10.0f} msg/s  peak RSS {res['rss_mb']:.0f} MB",
                file=sys.stderr,
            )
        ratios = {
            "success_path_vs_raw": results["retryd"]["msgs_per_s"] / results["raw"]["msgs_per_s"],
            "failure_path_vs_raw_route": results["retryd_fail"]["msgs_per_s"]
            / results["raw_route"]["msgs_per_s"],
            "rss_vs_raw": results["retryd"]["rss_mb"] / results["raw"]["rss_mb"],
        }
        for k, v in ratios.items():
            print(f"{k:28s} {v:.2f}", file=sys.stderr)
        out_dir = ROOT / "bench" / "results"
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "worker.json").write_text(
            json.dumps(
                {
                    "messages": args.messages,
                    "fail_share": args.fail_share,
                    "results": results,
                    "ratios": ratios,
                    "broker": "external" if broker is None else "embedded tansu",
                },
                indent=2,
            )
        )
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
