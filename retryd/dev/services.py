"""The processes ``retryd dev`` runs beside the workers: the sidecar (with a random API token for
the run) and, for ``--handler http``, the demo business service. Each is a ``python -m retryd``
child with its log in the run's state dir, waited for by probing its health URL (with a
deadline), and stopped by PID."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from retryd.errors import RetrydError


class Services:
    """The sidecar and the business service of one ``retryd dev`` run, stopped by PID."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.procs: list[subprocess.Popen[bytes]] = []
        self.token = secrets.token_hex(32)

    def _spawn(self, args: list[str], env: dict[str, str], log_name: str) -> None:
        with open(self.state / log_name, "wb") as log_file:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "retryd", *args],
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
            )

    def _wait(self, url: str, what: str, timeout_s: float = 60) -> None:
        from retryd.runtime.health import http_check

        deadline = time.monotonic() + timeout_s
        while not http_check(url, what, timeout_s=1).ok:
            if any(p.poll() is not None for p in self.procs) or time.monotonic() > deadline:
                log = (self.state / f"{what}.log").read_text(errors="replace")[-2000:]
                raise DevError(f"the {what} did not start:\n{log}")
            time.sleep(0.1)

    def start_business(self) -> str:
        from retryd.kafka.embedded import free_port

        port = free_port()
        args = ["demo", "business", "--host", "127.0.0.1", "--port", str(port)]
        # the demo orders say how they fail: no failures by chance on top
        args += ["--fail-share", "0", "--not-found-share", "0", "--latency-ms", "0"]
        self._spawn(args, dict(os.environ), "business.log")
        url = f"http://127.0.0.1:{port}"
        self._wait(url + "/healthz", "business")
        return url

    def start_sidecar(self, env: dict[str, str]) -> str:
        from retryd.kafka.embedded import free_port

        port = free_port()
        env = {
            **env,
            "RETRYD_SIDECAR_HOST": "127.0.0.1",
            "RETRYD_SIDECAR_PORT": str(port),
            "RETRYD_API_TOKEN": self.token,
        }
        self._spawn(["sidecar"], env, "sidecar.log")
        url = f"http://127.0.0.1:{port}"
        self._wait(url + "/healthz", "sidecar")
        return url

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


class DevError(RetrydError):
    """A service of the demo could not start."""
