"""Fixtures for engine tests: a fresh retry deployment (topics, group, settings) per test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retryd.config import Settings, load_settings
from retryd.handlers.loader import load_handler
from retryd.runtime.paths import heartbeat_dir
from retryd.worker.assembly import build_worker
from retryd.worker.summary import RunSummary
from tests.integration import handlers
from tests.support import TEST_SESSION_TIMEOUT_MS, create_topics, produce, unique, wait_for

REPO = Path(__file__).resolve().parents[2]
HANDLER = "python:tests.integration.handlers:behave"


@dataclass
class Deployment:
    bootstrap: str
    settings: Settings
    main: str
    outputs: dict[int, Path] = field(default_factory=dict)  # pid -> its stderr+stdout file

    @property
    def failed(self) -> str:
        return self.settings.failed_topic

    def tier(self, delay: str) -> str:
        return self.settings.plan.tier_template.format(delay=delay, group=self.settings.group_id)

    def send(self, specs: Iterable[dict[str, Any]], headers: list | None = None) -> None:
        produce(
            self.bootstrap,
            self.main,
            [(str(s["id"]).encode(), json.dumps(s).encode(), headers or []) for s in specs],
        )

    def owned(self, pid: int) -> dict[str, set[int]]:
        """Partitions a worker process owns, per topic, from its heartbeat file (empty until
        its first heartbeat): what the group assigned, without asking the broker."""
        path = heartbeat_dir(self.settings.state_dir) / f"{pid}.json"
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        out: dict[str, set[int]] = {}
        for where in beat.get("positions", {}):
            topic, _, partition = where.rpartition("/")
            out.setdefault(topic, set()).add(int(partition))
        return out

    def run(self, **kwargs: Any) -> RunSummary:
        """Run one in-process worker until drained."""
        s = self.settings
        handler = load_handler(
            s.handler, timeout_s=s.handler_timeout_s, non_retryable=s.non_retryable
        )
        return build_worker(s, handler, drain_grace_s=kwargs.pop("drain_grace_s", 0.5)).run(
            until_drained=True
        )

    def env(self) -> dict[str, str]:
        s = self.settings
        return {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RETRYD_BOOTSTRAP_SERVERS": s.bootstrap_servers,
            "RETRYD_MAIN_TOPICS": ",".join(s.main_topics),
            "RETRYD_RETRY_SEQUENCE": s.retry_sequence,
            "RETRYD_TIER_TEMPLATE": s.tier_template,
            "RETRYD_FAILED_TOPIC": s.failed_topic,
            "RETRYD_GROUP_ID": s.group_id,
            "RETRYD_HANDLER": s.handler,
            "RETRYD_HANDLER_TIMEOUT_S": str(s.handler_timeout_s),
            "RETRYD_SESSION_TIMEOUT_MS": str(s.session_timeout_ms),
            "RETRYD_MAX_POLL_INTERVAL_MS": str(s.max_poll_interval_ms),
            "RETRYD_NON_RETRYABLE": ",".join(s.non_retryable),
            "RETRYD_STATE_DIR": str(s.state_dir),
            "RETRYD_MAX_IN_FLIGHT": str(s.max_in_flight),
            "RETRYD_ORDERING": s.ordering.value,
            "RETRYD_EXACTLY_ONCE": str(s.exactly_once).lower(),
            "RETRYD_GROUP_PROTOCOL": s.group_protocol.value,
            "RETRYD_CIRCUIT_BREAKER": str(s.circuit_breaker).lower(),
        }

    def spawn_worker(
        self, log_path: Path, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        env = {**self.env(), "RETRYD_TEST_LOG": str(log_path), **(env or {})}
        out = log_path.with_suffix(f".{len(list(log_path.parent.iterdir()))}.stderr")
        stderr = open(out, "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "retryd", "worker", *args],
            env=env,
            cwd=REPO,
            stdout=stderr,
            stderr=subprocess.STDOUT,
        )
        self.outputs[proc.pid] = out
        return proc

    def stopped_while_starting(self, log_path: Path, env: dict[str, str]) -> tuple[int, str]:
        """Spawn a worker whose handler import blocks (``slow_start_handler``), SIGTERM it in
        the middle of its start, then let the import finish: its exit status and output."""
        gate = log_path.parent / f"{log_path.stem}.gate"
        gate.mkdir()
        proc = self.spawn_worker(
            log_path,
            env={
                **env,
                "RETRYD_HANDLER": "python:tests.integration.slow_start_handler:handle",
                "RETRYD_TEST_START_GATE": str(gate),
            },
        )
        try:
            wait_for(lambda: (gate / "importing").exists(), 60, what="the handler import")
            proc.send_signal(signal.SIGTERM)
            (gate / "release").touch()
            code = proc.wait(60)
        finally:
            stop_process(proc)
        return code, self.outputs[proc.pid].read_text()

    def started(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether a spawned worker got past its start (subscribed: it logged its role line),
        or already exited."""
        if proc.poll() is not None:
            return True
        try:
            return b"worker role=" in self.outputs[proc.pid].read_bytes()
        except (KeyError, OSError):
            return False


def deployment(
    bootstrap: str,
    tmp_path: Path,
    *,
    sequence: str = "1s,1s,2s",
    partitions: int = 1,
    tier_partitions: int | None = None,
    **overrides: Any,
) -> Deployment:
    group = unique("g")
    main = unique("main")
    settings = load_settings(
        bootstrap_servers=bootstrap,
        main_topics=main,
        retry_sequence=sequence,
        tier_template="{group}.retry_{delay}",
        failed_topic=f"{group}.failed",
        group_id=group,
        handler=overrides.pop("handler", HANDLER),
        handler_timeout_s=overrides.pop("handler_timeout_s", 2.0),
        session_timeout_ms=TEST_SESSION_TIMEOUT_MS,
        max_poll_interval_ms=overrides.pop("max_poll_interval_ms", 30_000),
        state_dir=tmp_path / "state",
        poll_timeout_s=0.2,
        # engine tests fail records on purpose, from many keys: the outage circuit breaker
        # would hold them instead of routing them (its own tests turn it on)
        circuit_breaker=overrides.pop("circuit_breaker", False),
        **overrides,
    )
    create_topics(bootstrap, [main], partitions)
    create_topics(bootstrap, settings.plan.tier_topics, tier_partitions or partitions)
    create_topics(bootstrap, [settings.failed_topic], 1)
    handlers.CALLS.clear()
    return Deployment(bootstrap, settings, main)


def calls_for(ident: str) -> list[dict]:
    return [c for c in handlers.CALLS if c["id"] == ident]


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 20) -> int:
    """Stop a process the test started, by PID: SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode
