"""Liveness checks a container runtime can run: ``retryd health``.

A worker process proves it is alive by rewriting its heartbeat file (``state_dir/heartbeats``)
about once a second, from its poll loop, even while handler calls run or a tier waits; the
sidecar by answering ``/healthz``. These checks need no shared PID namespace: they read files
and a local port, which is what a Kubernetes exec probe or a Docker HEALTHCHECK can see.
"""

from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from retryd.runtime.heartbeat import read_heartbeats


@dataclass(frozen=True)
class Check:
    ok: bool
    what: str
    detail: str

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAIL'} {self.what}: {self.detail}"


def worker_check(state_dir: Path, stale_s: float, now: float | None = None) -> Check:
    """At least one worker heartbeat, and every one written within ``stale_s`` seconds."""
    now = time.time() if now is None else now
    beats = read_heartbeats(state_dir)
    if not beats:
        return Check(False, "worker", f"no heartbeat in {state_dir}/heartbeats")
    stale = [hb for hb in beats if now - hb.ts > stale_s]
    if stale:
        oldest = max(now - hb.ts for hb in stale)
        return Check(
            False,
            "worker",
            f"{len(stale)} of {len(beats)} heartbeats older than {stale_s:g}s "
            f"(oldest {oldest:.0f}s)",
        )
    return Check(True, "worker", f"{len(beats)} worker process(es), heartbeats fresh")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def sidecar_check(port: int, tls: bool = False, timeout_s: float = 3.0) -> Check:
    """``GET /healthz`` on the local sidecar answers 200."""
    scheme = "https" if tls else "http"
    return http_check(f"{scheme}://127.0.0.1:{port}/healthz", "sidecar", timeout_s)


def http_check(url: str, what: str = "http", timeout_s: float = 3.0) -> Check:
    """``GET url`` answers 200 (a loopback HTTPS probe does not verify the certificate)."""
    tls = url.startswith("https:")
    context = None
    if tls:  # a loopback probe of our own certificate, which names the service, not 127.0.0.1
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, urllib.error.URLError) as exc:
        return Check(False, what, f"{url}: {exc}")
    return Check(status == 200, what, f"{url} answered {status}")
