"""Real ``retryd worker`` processes for a scenario: started, SIGKILLed, SIGTERMed and finally
stopped by their PIDs (``Fleet.close`` runs in a ``finally``, so a failing scenario leaves
nothing behind)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from retryd.config import Settings
from retryd.policy.key_order import KeyOrder
from retryd.runtime.paths import heartbeat_dir
from tests.chaos.handler import LOG_ENV
from tests.integration.worker_support import REPO, Deployment

CHAOS_HANDLER = "python:tests.chaos.handler:handle"


def key_order_env(settings: Settings) -> dict[str, str]:
    """What a worker process (or ``retryd topics create``) needs of ``key_order = strict``,
    which ``Deployment.env`` leaves out; nothing for ``key_order = none``."""
    if settings.key_order is not KeyOrder.STRICT:
        return {}
    env = {"RETRYD_KEY_ORDER": "strict", "RETRYD_KEY_STATE_TOPIC": settings.key_state_topic}
    if settings.key_order_topics:
        env["RETRYD_KEY_ORDER_TOPICS"] = ",".join(settings.key_order_topics)
    return env


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Fleet:
    def __init__(
        self, dep: Deployment, directory: Path, call_log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.dep = dep
        self.directory = directory
        self.call_log = call_log
        self.env = env or {}
        self.procs: list[Proc] = []
        directory.mkdir(parents=True, exist_ok=True)

    def worker(self, name: str, *args: str, env: dict[str, str] | None = None) -> Proc:
        """Start ``python -m retryd worker ARGS`` with the deployment's settings."""
        log = self.directory / f"{name}.{len(self.procs)}.log"
        full_env = {
            **self.dep.env(),
            **key_order_env(self.dep.settings),
            LOG_ENV: str(self.call_log),
            "RETRYD_LOG_LEVEL": "INFO",
            **self.env,
            **(env or {}),
        }
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "retryd", "worker", *args],
                env=full_env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def warnings(self, lines: int = 12) -> str:
        """The last ``lines`` WARNING/ERROR/CRITICAL lines (and tracebacks' last lines) of
        each process's log, as one text for an assertion message."""
        out = []
        for proc in self.procs:
            picked = [
                line
                for line in proc.output().splitlines()
                if any(w in line for w in ("WARNING", "ERROR", "CRITICAL", "Error:", "Exception"))
            ]
            status = "running" if proc.alive() else f"exit {proc.popen.returncode}"
            out.append(f"--- {proc.name} pid={proc.pid} ({status}) {proc.log.name}")
            out += [line[:300] for line in picked[-lines:]]
        return "\n" + "\n".join(out)

    def kill(self, proc: Proc, timeout_s: float = 30) -> int:
        """SIGKILL by PID and reap."""
        if proc.alive():
            proc.popen.send_signal(signal.SIGKILL)
        return proc.popen.wait(timeout_s)

    def terminate(self, proc: Proc, timeout_s: float = 60) -> int:
        """SIGTERM by PID and wait for the exit status (SIGKILL only past the timeout)."""
        if proc.alive():
            proc.popen.send_signal(signal.SIGTERM)
        try:
            return proc.popen.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            proc.popen.kill()
            proc.popen.wait(30)
            raise AssertionError(
                f"{proc.name} pid={proc.pid} ignored SIGTERM for {timeout_s}s"
            ) from exc

    def group_settled(self, procs: list[Proc], partitions: int) -> bool:
        """Every one of ``procs`` is alive and owns partitions, and together they own all
        ``partitions`` (read from the workers' own heartbeat files, rewritten every second).

        Why the SIGTERM scenario waits for this before each stop: a rolling restart waits for
        the new instance to be ready before it stops the next one, so each stop hits a group
        that has settled, as in a real deployment.
        """
        owned = 0
        for proc in procs:
            path = heartbeat_dir(self.dep.settings.state_dir) / f"{proc.pid}.json"
            try:
                beat = json.loads(path.read_text())
            except (OSError, ValueError):
                return False
            if not proc.alive() or beat.get("assigned_partitions", 0) <= 0:
                return False
            owned += beat["assigned_partitions"]
        return owned == partitions

    def close(self) -> None:
        """Stop every process still running, by PID: SIGTERM, then SIGKILL."""
        for proc in self.procs:
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.popen.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.kill()
                proc.popen.wait(30)
