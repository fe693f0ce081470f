"""Sidecar liveness under broker-bound load, and /metrics growth under hostile requests.

    python bench/bench_sidecar.py [--seconds 6]

Scenarios, each against a fresh ``retryd sidecar``, in two settings:

- **live broker** (``live-*``): a real broker, the benchmarks' default (Apache Kafka, one KRaft
  node; ``RETRYD_BENCH_BROKER=tansu`` for the embedded Tansu, ``RETRYD_TEST_BOOTSTRAP`` for an
  existing cluster), with 1,000 dead letters in ``failed_topic``: /readyz and /v1/failed are
  answered by the broker;
- **hung broker** (``hung-*``): a port that accepts connections and never answers, so every
  Kafka request waits for its timeout (no broker involved; the load of the issue's acceptance).

The live deployment also runs a ``retryd worker`` on the same state dir (its heartbeat makes
/readyz answer 200), and first measures one client's sequential /v1/failed?limit=1 and /readyz.
In each setting: ``idle``: /healthz probed every 25 ms, nothing else; ``polite``: the same while 200
broker-bound requests are kept in flight (100 /readyz, 100 /v1/failed?limit=1; a 503 with
Retry-After is retried after it); ``flood``: the same, Retry-After ignored: every answer is
followed at once by the next request. Then 300 requests with invented methods on invented
paths, and the size of /metrics after. Results go to bench/results/sidecar-<broker>.json
(p50/p99/max in ms, responses counted by path, status and error).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness as h  # noqa: E402
from tests.integration.load_client import probe_latencies  # noqa: E402
from tests.integration.sidecar_support import (  # noqa: E402
    TOKEN,
    Env,
    SidecarProcess,
    failed_headers,
)

DEAD_LETTERS = 1_000
MODES = ("idle", "polite", "flood")
# Live broker: the product's default session timeout (the test helper's 2 s is below the 6 s
# minimum a broker keeps by default). The hung-broker runs keep the settings they had.
SIDECAR_ENV = {"RETRYD_SESSION_TIMEOUT_MS": "45000"}


def quantiles(latencies: list[float]) -> dict[str, float]:
    n = len(latencies)
    return {
        "n": n,
        "p50_ms": round(latencies[n // 2] * 1000, 1),
        "p99_ms": round(latencies[min(n - 1, int(n * 0.99))] * 1000, 1),
        "max_ms": round(latencies[-1] * 1000, 1),
    }


@contextlib.contextmanager
def hung_broker() -> Iterator[str]:
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(1024)
        yield f"127.0.0.1:{hung.getsockname()[1]}"


def live_env(bootstrap: str, state: Path) -> Env:
    """A deployment on a real broker with DEAD_LETTERS records in its failed_topic."""
    env = Env(bootstrap, state, extra=dict(SIDECAR_ENV)).create()
    h.produce(
        bootstrap,
        env.failed,
        DEAD_LETTERS,
        value=lambda i: b"payload-%d" % i,
        key=lambda i: b"key-%d" % i,
        headers=lambda i: failed_headers(env.main, original_offset=i),
    )
    return env


@contextlib.contextmanager
def live_worker(env: Env, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``retryd worker`` (no-op handler) sharing the sidecar's state dir, as in a pod: its
    heartbeat is what makes /readyz answer 200. Stopped by PID."""
    from retryd.runtime.heartbeat import read_heartbeats

    child_env = {**env.env(0), "RETRYD_HANDLER": "python:bench.handlers:noop"}
    subprocess.run(
        [sys.executable, "-m", "retryd", "topics", "create"],
        env=child_env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "retryd", "worker"],
            env=child_env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while not any(hb.assigned_partitions for hb in read_heartbeats(env.state_dir)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker never got its partitions (see {log})")
            time.sleep(0.1)
        yield proc
    finally:
        h.stop(proc)


def browse_latency(env: Env, log: Path, requests: int = 30) -> dict[str, float]:
    """One client, one request at a time: GET /v1/failed?limit=1 (a browse of the first page)
    and GET /readyz, each ``requests`` times on an otherwise idle sidecar."""

    out: dict[str, float] = {}
    with SidecarProcess(env, log) as sidecar, sidecar.client() as client:
        for path in ("/v1/failed?limit=1", "/readyz"):
            took = []
            for _ in range(requests):
                started = time.perf_counter()
                resp = client.get(path)
                took.append(time.perf_counter() - started)
                if resp.status_code != 200:
                    raise SystemExit(f"{path}: {resp.status_code} {resp.text[:300]}")
            key = path.split("?")[0].strip("/").replace("/", "_")
            out.update({f"{key}_{k}": v for k, v in quantiles(sorted(took)).items()})
    return out


def run(mode: str, env: Env, seconds: float, log: Path) -> dict[str, object]:
    with SidecarProcess(env, log) as sidecar:
        load = None
        if mode != "idle":
            extra = ["--ignore-retry-after"] if mode == "flood" else []
            load = subprocess.Popen(
                [
                    *(sys.executable, "-m", "tests.integration.load_client"),
                    *(str(sidecar.port), TOKEN, "--seconds", str(seconds + 3), *extra),
                ],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.PIPE,
                text=True,
            )
            time.sleep(1.5)  # benchmark warm-up, not synchronisation
        latencies = asyncio.run(probe_latencies(sidecar.port, seconds))
        out: dict[str, object] = {"healthz": quantiles(latencies)}
        if load is not None:
            stdout, _ = load.communicate(timeout=120)
            out["load"] = json.loads(stdout)
        return out


def metrics_growth(work: Path) -> dict[str, int]:
    import httpx

    env = Env("127.0.0.1:9", work / "metrics" / "state")
    with SidecarProcess(env, work / "metrics.log") as sidecar:
        before = len(httpx.get(sidecar.url + "/metrics").text)
        with httpx.Client(base_url=sidecar.url, timeout=10) as client:
            for i in range(300):
                with contextlib.suppress(httpx.HTTPError):
                    client.request(f"INVENTED{i}", "/healthz" if i % 2 else f"/x{i}")
        text = httpx.get(sidecar.url + "/metrics").text
    series = [line for line in text.splitlines() if line.startswith("retryd_http_requests_total")]
    return {"bytes_before": before, "bytes_after": len(text), "request_series": len(series)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    broker = h.broker_info()
    results: dict[str, object] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": args.seconds,
        "broker": broker,
        "dead_letters": DEAD_LETTERS,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with h.broker() as bootstrap:
            env = live_env(bootstrap, work / "live" / "state")
            with live_worker(env, work / "worker.log"):
                results["live-sequential"] = browse_latency(env, work / "live-seq.log")
                print("live-sequential", json.dumps(results["live-sequential"]), flush=True)
                for mode in MODES:
                    log = work / f"live-{mode}.log"
                    results[f"live-{mode}"] = run(mode, env, args.seconds, log)
                    print(f"live-{mode}", json.dumps(results[f"live-{mode}"]), flush=True)
        for mode in MODES:
            with hung_broker() as bootstrap:
                env = Env(bootstrap, work / f"hung-{mode}" / "state")
                results[f"hung-{mode}"] = run(mode, env, args.seconds, work / f"hung-{mode}.log")
            print(f"hung-{mode}", json.dumps(results[f"hung-{mode}"]), flush=True)
        results["metrics_after_300_invented_methods"] = metrics_growth(work)
        print("metrics", json.dumps(results["metrics_after_300_invented_methods"]))
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.no_write:
        return
    out = ROOT / "bench" / "results" / f"sidecar-{broker['kind']}.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
