"""Batch handlers' cost: CPU per record of a no-op ``handle_batch`` against the per-record no-op
handler and the raw confluent-kafka loop, all on one topic in one run.

    python bench/bench_batch.py                      # 300k x 200 B, 6 partitions, 3 repeats
    python bench/bench_batch.py --n 20000 --repeat 1 # seconds: checks the harness

Measured the way ``bench_worker.py`` measures the success path: ``retryd worker`` through the
CLI at default settings (``RETRYD_HANDLER_BATCH`` set for the batch rows), throughput and the
worker's CPU (user + system, every thread) from the first record its metrics count to the
n-th. The raw loop (``harness.raw_loop``: consume(500), store_offsets per message) runs in a
child process measuring its own CPU from its first record to the n-th. Medians of
``--repeat`` runs; each retryd run has its own group. The broker: as ``harness.broker``
(``RETRYD_TEST_BOOTSTRAP`` for an existing cluster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness as h  # noqa: E402
from bench.bench_worker import Run, _main_topic, _throughput  # noqa: E402


def noop_batch(records: list[Any]) -> None:
    """A batch handler that does nothing: every record succeeded."""


async def async_noop_batch(records: list[Any]) -> None:
    """The same, ``async def``."""


VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "per_record": ("python:bench.handlers:noop", {}),
    "batch_100": ("python:bench.bench_batch:noop_batch", {"RETRYD_HANDLER_BATCH": "100"}),
    "batch_500": ("python:bench.bench_batch:noop_batch", {"RETRYD_HANDLER_BATCH": "500"}),
    "async_batch_500": (
        "python:bench.bench_batch:async_noop_batch",
        {"RETRYD_HANDLER_BATCH": "500"},
    ),
}


def raw_child(bootstrap: str, topic: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", bootstrap, topic, str(n)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"raw loop failed:\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def child(bootstrap: str, topic: str, n: int) -> None:
    """The raw loop, with its CPU from its first record to the n-th."""
    from confluent_kafka import Consumer

    cpu: list[float] = []
    real_consume = Consumer.consume

    class Timed(Consumer):  # type: ignore[misc]
        def consume(self, *args: Any, **kwargs: Any) -> Any:
            batch = real_consume(self, *args, **kwargs)
            if batch and not cpu:
                cpu.append(time.process_time())
            return batch

    import confluent_kafka

    confluent_kafka.Consumer = Timed  # raw_loop imports it by name when called
    elapsed = h.raw_loop(bootstrap, topic, n, None)
    cpu.append(time.process_time())
    print(
        json.dumps(
            {
                "seconds": elapsed,
                "msgs_per_s": n / elapsed,
                "cpu_us_per_msg": (cpu[-1] - cpu[0]) / n * 1e6,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=",".join(VARIANTS), help="comma list of variants")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    variants = [v for v in args.only.split(",") if v]
    runs: dict[str, list[dict[str, Any]]] = {"raw": [], **{v: [] for v in variants}}
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as scratch:
        run = Run(False, Path(scratch))
        with h.broker() as b:
            topic = _main_topic(b, args.n, 50_000)
            for turn in range(args.repeat):
                runs["raw"].append(raw_child(b, topic, args.n))
                order = variants[turn % len(variants) :] + variants[: turn % len(variants)]
                for v in order:
                    handler, env = VARIANTS[v]
                    cli = run.cli(b, topic, handler, **env)
                    if turn == 0 and v == order[0]:
                        cli.topics_create()
                    runs[v].append(_throughput(run, cli, topic, "success", args.n))
                    print(f"  {turn} {v}: {runs[v][-1]}", file=sys.stderr)
                print(f"  {turn} raw: {runs['raw'][-1]}", file=sys.stderr)
    med = {
        k: {
            "msgs_per_s": statistics.median(r["msgs_per_s"] for r in rs),
            "cpu_us_per_msg": statistics.median(r["cpu_us_per_msg"] for r in rs),
        }
        for k, rs in runs.items()
    }
    raw_cpu = med["raw"]["cpu_us_per_msg"]
    print(f"{'variant':<18}{'msgs/s':>10}{'CPU µs/rec':>12}{'CPU vs raw':>12}")
    for k, m in med.items():
        print(
            f"{k:<18}{m['msgs_per_s']:>10.0f}{m['cpu_us_per_msg']:>12.2f}"
            f"{m['cpu_us_per_msg'] / raw_cpu:>12.2f}"
        )
    print(json.dumps({"n": args.n, "repeat": args.repeat, "medians": med, "runs": runs}))


if __name__ == "__main__":
    main()
