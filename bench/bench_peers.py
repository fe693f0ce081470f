"""Peers: retryd side by side with the raw confluent-kafka loop, quix-streams, FastStream,
Spring Kafka and Confluent's Parallel Consumer, on one broker, as issue 24 measured them.

    python bench/bench_peers.py                   # every shape, every system available, 3 runs
    python bench/bench_peers.py --quick           # tiny sizes: seconds, checks the harness
    python bench/bench_peers.py --shapes success --systems raw,retryd,quix-streams --repeat 5

Shapes (records produced before the consumer starts; a fresh topic and group per system per
run; timed from the first record handled to the N-th; CPU of the system's whole process over
that span):

- ``success``: N x 200 B on 6 partitions, a no-op handler. CPU s per million records is the
  headline, wall msg/s beside it; Spring also warm (the second half of the run, JIT warmed).
- ``keyed``: 10,000 records on 50 keys, a handler sleeping a random 0-5 ms, key order kept,
  16 and 64 in flight: retryd (``max_in_flight``) vs Parallel Consumer (``KEY``).
- ``retry``: 1,000 records failing once, retried after 1 s: lateness of the retried call
  after the copy's due time (p50/p99/max; an early call is a failure), drain time.
- ``http``: ``bench/bench_http.py``'s ``run(bootstrap, quick)`` when that module exists.

Python peers run in environments of their own (``bench/peers_py/envs.py``, made on first use;
quix-streams pins confluent-kafka and pydantic below retryd's), each in a child process; the
Java peers through ``bench/peers/java.py`` (Maven builds), left out with a note when it is
absent or cannot build. ``--repeat`` runs (default 3) in an order that turns each run; medians.
Results: ``bench/results/peers-<broker>.json`` (``--quick``: ``peers-<broker>-quick.json``),
and on full runs the Peers section of BENCHMARKS.md. The broker: ``bench/harness.broker()``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness as h  # noqa: E402
from bench.bench_worker import PARTITIONS, Run, _value, machine  # noqa: E402
from bench.peers_py import report, systems  # noqa: E402
from bench.peers_py.envs import PeerUnavailable  # noqa: E402

SHAPES = ("success", "keyed", "retry", "http")
SIZES = {
    False: {"success": 300_000, "per_message": 20_000, "keyed": 10_000, "retry": 1_000},
    True: {"success": 20_000, "per_message": 300, "keyed": 1_000, "retry": 100},
}
KEYED_KEYS = 50
HANDLER_MS_MAX = 5
RETRY_DELAY_MS = 1_000
IN_FLIGHT = (16, 64)
PY_PEERS = tuple(systems.PY_PEERS)
JAVA = {"spring": "spring", "parallel-consumer": "parallel-consumer"}
# concurrency outside the keyed shape: the listener container's default (one consumer thread)
# for Spring, and the 16 (KEY ordering) for Parallel Consumer
JAVA_CONCURRENCY = {"spring": 1, "parallel-consumer": 16}


def shape_systems(shape: str) -> list[str]:
    """The systems of a shape, in their first run's order (``@n``: in flight)."""
    if shape == "success":
        return ["raw", "retryd", *PY_PEERS, "spring", "parallel-consumer"]
    if shape == "keyed":
        return [f"{s}@{k}" for k in IN_FLIGHT for s in ("retryd", "parallel-consumer")]
    if shape == "retry":
        return ["retryd", "spring"]
    return []


class Bench:
    """One benchmark run: the broker, the sizes, the Java peers that built, the notes."""

    def __init__(self, bootstrap: str, quick: bool, scratch: Path) -> None:
        self.bootstrap = bootstrap
        self.quick = quick
        self.sizes = SIZES[quick]
        self.run = Run(quick, scratch)
        self.notes: list[str] = []
        self.errors: list[dict[str, Any]] = []
        self.java: Any = None
        self.java_built: set[str] = set()

    def load_java(self, wanted: set[str]) -> None:
        """Build the Java peers this run needs, once; each that fails is left out."""
        if not wanted:
            return
        try:
            from bench.peers import java
        except ImportError as exc:
            self.notes.append(f"Java peers ({', '.join(sorted(wanted))}) skipped: {exc}")
            return
        self.java = java
        for name in sorted(wanted):
            t0 = time.monotonic()
            try:
                java.build(name)
            except Exception as exc:
                self.notes.append(f"{name} skipped: its build failed: {exc}")
                continue
            print(f"  built {name} in {time.monotonic() - t0:.0f}s", file=sys.stderr)
            self.java_built.add(name)

    def available(self, system: str) -> bool:
        base = system.split("@")[0]
        if base in JAVA:
            return base in self.java_built
        return True

    def topic(self, n: int, keys: int) -> str:
        topic = f"bench-peers-{uuid.uuid4().hex[:8]}"
        h.create_topics(self.bootstrap, [topic], PARTITIONS)
        h.produce(self.bootstrap, topic, n, value=_value, key=lambda i: str(i % keys).encode())
        return topic

    def one(self, shape: str, system: str) -> dict[str, Any]:
        """Run ``system`` once on a fresh topic: its figure, with the derived rates."""
        base, _, in_flight = system.partition("@")
        if shape == "success":
            n = (
                self.sizes["per_message"]
                if system == "faststream-message"
                else self.sizes["success"]
            )
            keys = 50_000
        elif shape == "keyed":
            n, keys = self.sizes["keyed"], KEYED_KEYS
        else:
            n, keys = self.sizes["retry"], 1_000_000
        topic = self.topic(n, keys)
        b = self.bootstrap
        if base == "raw":
            got = systems.raw(b, topic, n)
        elif base in PY_PEERS:
            got = systems.python_peer(base, b, topic, n)
        elif base == "retryd" and shape == "success":
            got = systems.retryd_success(self.run, b, topic, n)
        elif base == "retryd" and shape == "keyed":
            got = systems.retryd_keyed(self.run, b, topic, n, int(in_flight))
        elif base == "retryd":
            got = systems.retryd_retry(self.run, b, topic, n)
        else:
            got = self.java_run(base, shape, topic, n, int(in_flight or JAVA_CONCURRENCY[base]))
        return derive({**got, "system": system, "records": n})

    def java_run(self, name: str, shape: str, topic: str, n: int, concurrency: int) -> dict:
        got: dict[str, Any] = self.java.run(
            JAVA[name],
            self.bootstrap,
            topic,
            f"bench-{name}-{uuid.uuid4().hex[:8]}",
            n,
            shape,
            concurrency=concurrency,
            handler_ms_max=HANDLER_MS_MAX,
            retry_delay_ms=RETRY_DELAY_MS,
            warm_from=n // 2,
        )
        got = dict(got)
        got.pop("system", None)
        got["config"] = config_text(got.get("config"))
        got["version"] = f"{JAVA_LABEL[name]} {got.get('version', 'unknown')}"
        if shape == "retry":
            got["span_s"] = got["wall_s"]  # the peer times first retried call to the N-th
            got["early"] = None  # not counted by the peer: its lateness min shows an early call
        if got.get("warm_wall_s") and got.get("warm_cpu_s") is not None:
            got["warm_records"] = n - n // 2
        return got


JAVA_LABEL = {"spring": "Spring Kafka", "parallel-consumer": "Parallel Consumer"}
# Settings every run has, or that change per run: left out of the configuration shown
_PLUMBING = ("bootstrap.servers", "group.id", "serializer", "deserializer")


def config_text(config: Any) -> str:
    """A Java peer's configuration (nested maps) as one line, without the plumbing."""
    if not isinstance(config, dict):
        return str(config or "-")
    parts = []
    for key, value in config.items():
        if isinstance(value, dict):
            kept = {k: v for k, v in value.items() if not str(k).endswith(_PLUMBING)}
            if kept:
                parts.append(f"{key}: " + ", ".join(f"{k}={v}" for k, v in kept.items()))
        else:
            parts.append(f"{key}={value}")
    return "; ".join(parts) or "-"


def derive(got: dict[str, Any]) -> dict[str, Any]:
    """msg/s and CPU s per million records from handled, wall_s and cpu_s (and warm ones)."""
    handled = got.get("handled") or got["records"]
    got["msgs_per_s"] = handled / max(got["wall_s"], 1e-9)
    got["cpu_s_per_million"] = got["cpu_s"] / handled * 1e6
    warm = got.get("warm_records")
    if warm:
        got["warm_msgs_per_s"] = warm / max(got["warm_wall_s"], 1e-9)
        got["warm_cpu_s_per_million"] = got["warm_cpu_s"] / warm * 1e6
    return got


def turn(items: list[str], i: int) -> list[str]:
    """The order of run ``i``: rotated by ``i``, so no system always runs first."""
    if not items:
        return items
    k = i % len(items)
    return items[k:] + items[:k]


def http_shape(bench: Bench) -> list[dict[str, Any]] | None:
    """The http shape, from ``bench/bench_http.py`` when it is there."""
    try:
        from bench import bench_http  # type: ignore[attr-defined]
    except ImportError:
        bench.notes.append("http shape skipped: bench/bench_http.py is not in this tree")
        return None
    rows: list[dict[str, Any]] = bench_http.run(bench.bootstrap, bench.quick)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the harness")
    ap.add_argument("--repeat", type=int, default=None, help="runs per system (default 3; quick 1)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--systems", default="", help="only these (e.g. raw,retryd,quix-streams)")
    ap.add_argument("--out", type=Path, help="the JSON result file (default bench/results/…)")
    ap.add_argument("--no-markdown", action="store_true", help="leave BENCHMARKS.md alone")
    args = ap.parse_args()
    quick = args.quick
    repeat = args.repeat or (1 if quick else 3)
    shapes = [s for s in args.shapes.split(",") if s]
    if set(shapes) - set(SHAPES):
        raise SystemExit(f"unknown shapes: {sorted(set(shapes) - set(SHAPES))}")
    only = {s for s in args.systems.split(",") if s}
    load_start = os.getloadavg()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="retryd-peers-") as scratch, h.broker(quick) as b:
        bench = Bench(b, quick, Path(scratch))
        plan = {
            s: [x for x in shape_systems(s) if not only or x.split("@")[0] in only] for s in shapes
        }
        bench.load_java({x.split("@")[0] for xs in plan.values() for x in xs} & set(JAVA))
        for shape in [s for s in shapes if s != "http"]:
            wanted = [x for x in plan[shape] if bench.available(x)]
            for i in range(repeat):
                for system in turn(wanted, i):
                    print(f"[{i + 1}/{repeat}] {shape} {system}", file=sys.stderr)
                    try:
                        got = bench.one(shape, system)
                    except PeerUnavailable as exc:
                        bench.notes.append(f"{system} skipped: {exc}")
                        wanted = [x for x in wanted if x != system]
                        continue
                    except Exception as exc:
                        if system.split("@")[0] in ("raw", "retryd"):
                            raise
                        print(traceback.format_exc(), file=sys.stderr)
                        bench.errors.append({"shape": shape, "system": system, "error": str(exc)})
                        continue
                    print(f"  {json.dumps(got)}", file=sys.stderr)
                    results.setdefault(shape, {}).setdefault(system, []).append(got)
        http_rows = http_shape(bench) if "http" in shapes else None
    summary = report.summarize(results)
    targets = report.targets(summary)
    info = machine(quick)
    info["load_average_at_start"] = [round(x, 2) for x in load_start]
    info["minutes"] = round((time.monotonic() - started) / 60, 1)
    out = {
        "quick": quick,
        "repeat": repeat,
        "sizes": bench.sizes,
        "machine": info,
        "summary": summary,
        "targets": targets,
        "http": http_rows,
        "notes": bench.notes,
        "errors": bench.errors,
        "results": results,
    }
    for line in report.text(summary, targets, bench.notes, bench.errors):
        print(line)
    kind = info["broker"]["kind"]
    path = args.out or ROOT / "bench" / "results" / f"peers-{kind}{'-quick' if quick else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    if not quick and not args.no_markdown:
        report.write_markdown(ROOT / "BENCHMARKS.md", out)
    print(
        json.dumps(
            {
                "summary": summary,
                "targets": targets,
                "notes": bench.notes,
                "errors": bench.errors,
                "http": http_rows,
            }
        )
    )


if __name__ == "__main__":
    main()
