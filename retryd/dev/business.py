"""A small business service answering retryd's HTTP handler contract (docs/spec.md §3).

It stands in for the application container next to retryd: ``retryd dev --handler http``, the
compose stack and the Kubernetes example pod run it (``retryd demo business``). Standard
library only, so it runs from the retryd image with nothing else installed.

``POST /handle`` (any path but ``/healthz``) answers:

- a demo order of ``retryd dev`` (JSON with ``poison`` or ``fail_times``) as the order says:
  ``poison`` → 404 (dead-lettered as non_retryable), ``fail_times: n`` → 503 while
  ``X-Retryd-Retry-Number`` < n, then 200, so the demo's outcome is known in advance;
- anything else by chance: ``fail_share`` of requests get 503 (retried through the tiers),
  ``not_found_share`` get 404 (dead-lettered at once), the rest 200.

``GET /healthz`` answers 200 (the container's probes).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024


@dataclass(frozen=True)
class Behaviour:
    fail_share: float = 0.2
    not_found_share: float = 0.02
    latency_ms: float = 5.0


def decide(body: bytes, retry_number: int, behaviour: Behaviour, roll: float) -> int:
    """The status code for one request (pure: ``roll`` is a uniform draw in [0, 1))."""
    order: Any = None
    try:
        order = json.loads(body) if body[:1] == b"{" else None
    except ValueError:
        order = None
    if isinstance(order, dict) and ("poison" in order or "fail_times" in order):
        if order.get("poison"):
            return 404
        return 503 if retry_number < int(order.get("fail_times") or 0) else 200
    if roll < behaviour.not_found_share:
        return 404
    if roll < behaviour.not_found_share + behaviour.fail_share:
        return 503
    return 200


class _Handler(BaseHTTPRequestHandler):
    server: BusinessServer
    protocol_version = "HTTP/1.1"  # keep-alive: retryd pools its connections

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._answer(200, {"status": "ok"})
        else:
            self._answer(404, {"error": "not_found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._answer(413, {"error": "too_large"})
            self.close_connection = True
            return
        body = self.rfile.read(length)
        try:
            retry_number = int(self.headers.get("X-Retryd-Retry-Number") or 0)
        except ValueError:
            retry_number = 0
        server = self.server
        if server.behaviour.latency_ms > 0:
            time.sleep(server.behaviour.latency_ms / 1000)
        status = decide(body, retry_number, server.behaviour, server.roll())
        server.count(status)
        self._answer(status, {"status": status})


class BusinessServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, behaviour: Behaviour, seed: int | None = None):
        super().__init__((host, port), _Handler)
        self.behaviour = behaviour
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.answered: dict[int, int] = {}

    def roll(self) -> float:
        with self._lock:
            return self._random.random()

    def count(self, status: int) -> None:
        with self._lock:
            self.answered[status] = self.answered.get(status, 0) + 1


def serve(host: str, port: int, behaviour: Behaviour, seed: int | None = None) -> None:
    """Serve until SIGTERM/SIGINT (the caller turns them into KeyboardInterrupt or exit)."""
    server = BusinessServer(host, port, behaviour, seed)
    log.info(
        "business service on http://%s:%d/handle (503 for %.0f%%, 404 for %.0f%%, %gms)",
        host,
        server.server_address[1],
        behaviour.fail_share * 100,
        behaviour.not_found_share * 100,
        behaviour.latency_ms,
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        log.info("business service answered %s", dict(sorted(server.answered.items())))
