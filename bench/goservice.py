"""The Go business service (``bench/peers/goservice``) as a child process, for the HTTP
benchmarks and tests: a service that costs little CPU next to the worker, so a measurement is
retryd's HTTP path and not the peer's.

    from bench import goservice
    with goservice.start(delay_ms=20) as svc:
        svc.url        # http://127.0.0.1:PORT/handle
        svc.bulk_url   # http://127.0.0.1:PORT/bulk
        svc.stats()    # {"requests": n, "records": n}

The binary is built once per source version (``go build`` into ``~/.cache/retryd/goservice``,
or ``RETRYD_GOSERVICE_CACHE``) and reused. ``stop()`` ends the process by its PID.
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

SOURCE = Path(__file__).resolve().parent / "peers" / "goservice"
READY_TIMEOUT_S = 30.0


def _cache_dir() -> Path:
    base = os.environ.get("RETRYD_GOSERVICE_CACHE")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "retryd" / "goservice"


def binary() -> Path:
    """The built service for the current source, building it the first time (a build
    interrupted halfway leaves only a temporary file, never a broken binary)."""
    digest = hashlib.sha256()
    for name in ("go.mod", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    out = _cache_dir() / digest.hexdigest()[:16] / "goservice"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"goservice.{os.getpid()}.tmp")
    env = {**os.environ, "CGO_ENABLED": "0"}
    subprocess.run(
        ["go", "build", "-o", str(partial), "."],
        cwd=SOURCE,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    partial.replace(out)
    return out


class Service:
    """One running service: ``url`` (/handle), ``bulk_url`` (/bulk), ``pid``, ``stop()``.
    On a Unix socket the URLs are ``http+unix://<percent-encoded path>/...``."""

    def __init__(self, proc: subprocess.Popen[bytes], address: str, unix: bool = False) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.address = address
        self.unix = unix
        self.base = f"http+unix://{quote(address, safe='')}" if unix else f"http://{address}"
        self.url = f"{self.base}/handle"
        self.bulk_url = f"{self.base}/bulk"

    def stats(self) -> dict[str, int]:
        if not self.unix:
            with urllib.request.urlopen(f"{self.base}/stats", timeout=5) as resp:
                data: dict[str, int] = json.loads(resp.read())
            return data
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(self.address)
            sock.sendall(b"GET /stats HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        data = json.loads(raw.partition(b"\r\n\r\n")[2])
        return data

    def stop(self, timeout_s: float = 10.0) -> int:
        proc = self.proc
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    def __enter__(self) -> Service:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start(
    delay_ms: float = 0,
    *,
    fail_match: str = "",
    addr: str = "127.0.0.1:0",
    unix: str | None = None,
    cpus: int = 0,
) -> Service:
    """Start the service and return once it accepts connections (``READY_TIMEOUT_S``).
    ``unix``: listen on that Unix socket path instead of ``addr``. ``cpus`` > 0 sets
    GOMAXPROCS (on a small machine, so the peer leaves cores to retryd)."""
    cmd = [str(binary()), "-addr", addr, "-delay-ms", str(delay_ms)]
    if unix:
        cmd += ["-unix", unix]
    if fail_match:
        cmd += ["-fail-match", fail_match]
    env = dict(os.environ)
    if cpus > 0:
        env["GOMAXPROCS"] = str(cpus)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    try:
        address = _wait_listening(proc)
    except BaseException:
        Service(proc, "").stop()
        raise
    return Service(proc, address, unix=bool(unix))


def _wait_listening(proc: subprocess.Popen[bytes]) -> str:
    """The address from the service's first line ("listening host:port"), within the deadline."""
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    line = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise RuntimeError(f"goservice not ready (exit code {proc.poll()})")
            if sel.select(left):
                chunk = os.read(proc.stdout.fileno(), 256)
                if not chunk:
                    raise RuntimeError(f"goservice exited (code {proc.wait(5)})")
                line += chunk
    word, _, address = line.decode().strip().partition(" ")
    if word != "listening":
        raise RuntimeError(f"goservice said {line!r}")
    return address
