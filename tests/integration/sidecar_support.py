"""Sidecar test helpers: seed failed_topic with spec headers, run `retryd sidecar` on a free
port as a subprocess (stopped by PID), talk to it over real HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from retryd.kafka.embedded import free_port
from retryd.policy.headers import Envelope, routed_headers
from tests.support import TEST_SESSION_TIMEOUT_MS, create_topics, produce, unique, wait_for

REPO = Path(__file__).resolve().parents[2]
# API tokens must be at least 32 bytes. TOKEN goes in RETRYD_API_TOKEN (replay scope).
TOKEN = "replay-token-s3cret-0123456789abcdef"


def failed_headers(
    original_topic: str,
    *,
    error_class: str = "RuntimeError",
    dead_reason: str = "exhausted",
    original_partition: int = 0,
    original_offset: int = 0,
    retry_number: int = 3,
    user: list[tuple[str, bytes | None]] | None = None,
) -> list[tuple[str, bytes | None]]:
    env = Envelope(
        original_topic=original_topic,
        original_partition=original_partition,
        original_offset=original_offset,
        original_timestamp=1_700_000_000_000,
        retry_number=retry_number,
        first_failure_timestamp=1_700_000_000_500,
        error_class=error_class,
        error_message=f"{error_class}: boom",
        dead_reason=dead_reason,
    )
    return routed_headers(user or [], env)


@dataclass
class Env:
    """One isolated deployment: fresh topic and group names, its own state dir."""

    bootstrap: str
    state_dir: Path
    main: str = field(default_factory=lambda: unique("main"))
    other: str = field(default_factory=lambda: unique("other"))
    group: str = field(default_factory=lambda: unique("g"))
    token: str | None = TOKEN
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> str:
        return f"{self.group}.failed"

    @property
    def ledger(self) -> str:
        return f"{self.group}.ledger"

    def create(self, failed_partitions: int = 2, main_partitions: int = 2) -> Env:
        create_topics(self.bootstrap, [self.main, self.other], main_partitions)
        create_topics(self.bootstrap, [self.failed], failed_partitions)
        return self

    def env(self, port: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RETRYD_", "PROMETHEUS_"))}
        env.update(
            PYTHONPATH=str(REPO),
            RETRYD_BOOTSTRAP_SERVERS=self.bootstrap,
            RETRYD_MAIN_TOPICS=f"{self.main},{self.other}",
            RETRYD_RETRY_SEQUENCE="1s,2s",
            RETRYD_TIER_TEMPLATE="{group}.retry_{delay}",
            RETRYD_FAILED_TOPIC=self.failed,
            RETRYD_LEDGER_TOPIC=self.ledger,
            RETRYD_GROUP_ID=self.group,
            RETRYD_STATE_DIR=str(self.state_dir),
            RETRYD_SIDECAR_HOST="127.0.0.1",
            RETRYD_SIDECAR_PORT=str(port),
            RETRYD_READINESS_TIMEOUT_S="1",
            RETRYD_SESSION_TIMEOUT_MS=str(TEST_SESSION_TIMEOUT_MS),
        )
        if self.other == self.main:
            env["RETRYD_MAIN_TOPICS"] = self.main
        env.update(self.extra)
        if self.token:
            env["RETRYD_API_TOKEN"] = self.token
        return env


class SidecarProcess:
    """``python -m retryd sidecar`` on a free port (HTTPS when ``verify`` names the CA file
    that signed the certificate configured in the deployment's environment)."""

    def __init__(
        self,
        deployment: Env,
        log_path: Path,
        port: int | None = None,
        verify: Path | None = None,
    ) -> None:
        self.deployment = deployment
        self.port = port or free_port()
        self.log_path = log_path
        self.verify: Any = ssl.create_default_context(cafile=str(verify)) if verify else True
        self.scheme = "https" if verify is not None else "http"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the process and return at once (``start`` also waits until it serves)."""
        out = open(self.log_path, "ab")  # noqa: SIM115 - closed by the child's lifetime
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "retryd", "sidecar"],
            env=self.deployment.env(self.port),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        return self.proc

    def serving(self) -> bool:
        """/healthz answers 200 (an exited process is an error: its output says why)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"sidecar exited: {self.log_path.read_text()[-3000:]}")
        try:
            resp = httpx.get(self.url + "/healthz", timeout=1, verify=self.verify)
            return resp.status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, timeout: float = 30) -> SidecarProcess:
        self.spawn()
        wait_for(self.serving, timeout, 0.1, "sidecar /healthz")
        return self

    def stop(self, timeout: float = 20) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, verify=self.verify)

    def __enter__(self) -> SidecarProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def sign_in(client: httpx.Client, token: str, next: str = "/ui/") -> httpx.Response:
    """Signs ``client`` (a browser: it keeps cookies, follows no redirect) in to the explorer
    as a person does: the sign-in form first (its hidden ``csrf`` field and the pre-session
    cookie that comes with it), then the form posted with the token. Returns the 303."""
    form = client.get("/ui/login")
    assert form.status_code == 200, form.text[-2000:]
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert found is not None, "the sign-in form has no csrf field"
    signed = client.post("/ui/login", data={"token": token, "next": next, "csrf": found[1]})
    assert signed.status_code == 303, signed.text[-2000:]
    return signed


def seed(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | None, bytes | None, list]],
    partition: int | None = None,
) -> list[tuple[int, int]]:
    return produce(bootstrap, topic, records, partition=partition)


def wait_job(client: httpx.Client, job_id: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = client.get(f"/v1/replays/{job_id}").json()
        return body if body["state"] in ("completed", "cancelled", "failed") else None

    return wait_for(done, timeout, 0.1, f"job {job_id} to finish")


def pretty(body: Any) -> str:
    return json.dumps(body, indent=1)[:3000]


def elapsed_since(t0: float) -> float:
    return time.monotonic() - t0


def replay_cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    """``retryd replay ...`` against ``env``'s deployment (its first settings), as a user runs
    it; the output is wide enough for its tables."""
    return subprocess.run(
        [sys.executable, "-m", "retryd", "replay", *args],
        env={**env.env(0), "COLUMNS": "160"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
