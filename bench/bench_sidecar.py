"""Sidecar liveness under broker-bound load, and /metrics growth under hostile requests.

    python bench/bench_sidecar.py [--seconds 6]

Scenarios, each against a fresh ``retryd sidecar`` whose broker hangs (a port that accepts
connections and never answers, so every Kafka request waits for its timeout):
- ``idle``: /healthz probed every 25 ms, nothing else;
- ``polite``: the same while 200 broker-bound requests are kept in flight (100 /readyz, 100
  /v1/failed; a 503 with Retry-After is retried after it), the load of the issue's acceptance;
- ``flood``: the same, Retry-After ignored: every answer is followed at once by the next
  request (thousands per second).
Then 300 requests with invented methods on invented paths, and the size of /metrics after.
Results go to bench/results/sidecar.json (p50/p99/max in ms).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.load_client import probe_latencies  # noqa: E402
from tests.integration.sidecar_support import TOKEN, Env, SidecarProcess  # noqa: E402


def quantiles(latencies: list[float]) -> dict[str, float]:
    n = len(latencies)
    return {
        "n": n,
        "p50_ms": round(latencies[n // 2] * 1000, 1),
        "p99_ms": round(latencies[min(n - 1, int(n * 0.99))] * 1000, 1),
        "max_ms": round(latencies[-1] * 1000, 1),
    }


def run(scenario: str, seconds: float, work: Path) -> dict[str, object]:
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(1024)
        env = Env(f"127.0.0.1:{hung.getsockname()[1]}", work / scenario / "state")
        with SidecarProcess(env, work / f"{scenario}.log") as sidecar:
            load = None
            if scenario != "idle":
                extra = ["--ignore-retry-after"] if scenario == "flood" else []
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
    args = parser.parse_args()
    results: dict[str, object] = {"seconds": args.seconds}
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in ("idle", "polite", "flood"):
            results[scenario] = run(scenario, args.seconds, Path(tmp))
            print(scenario, json.dumps(results[scenario]))
        results["metrics_after_300_invented_methods"] = metrics_growth(Path(tmp))
        print("metrics", json.dumps(results["metrics_after_300_invented_methods"]))
    out = ROOT / "bench" / "results" / "sidecar.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
