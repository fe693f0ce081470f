"""A real HTTP business service in the test process, for the HTTP handler kind.

It answers by the same rules as the sync chaos handler (``handler.decide``): 200 for a success,
503 for a planned failure (retry), 404 for a non-retryable one (dead-letter), and logs every
call to the call log the same way. It decodes the Kafka headers retryd sent
(``decode_kafka_headers``) so the fuzz can check that user headers arrived intact.

aiohttp rather than ``http.server``: the fuzz sends header values of hundreds of KiB, and the
standard library's server refuses header lines over 64 KiB (a 431, which retryd would rightly
dead-letter as non-retryable, testing the server instead of retryd).
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from aiohttp import web

from retryd.handlers.http_handler import decode_kafka_headers
from tests.chaos.handler import DEAD, FAIL, call_entry, decide, header_digest, spec_of, write_line

LIMIT = 4 * 1024 * 1024
STATUS = {FAIL: 503, DEAD: 404}


class BusinessServer:
    def __init__(self, call_log: Path) -> None:
        self.call_log = call_log
        self.bad_requests = 0
        self._fd = os.open(call_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""

    def start(self) -> BusinessServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        app = web.Application(client_max_size=LIMIT)
        app.router.add_post("/handle", self._handle)
        self._runner = web.AppRunner(
            app,
            max_line_size=LIMIT,
            max_field_size=LIMIT,
            max_headers=4096,
            access_log=None,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/handle"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        spec = spec_of(body)
        try:
            retry_number = int(request.headers.get("X-Retryd-Retry-Number", "0"))
            digest = header_digest(decode_kafka_headers(request.headers), fold_case=True)
        except ValueError as exc:  # retryd sent something undecodable: a finding
            self.bad_requests += 1
            return web.Response(status=400, text=f"undecodable request: {exc}")
        outcome = decide(str(spec.get("kind", "ok")), int(spec.get("k", 0)), retry_number)
        write_line(self._fd, call_entry(spec, outcome, retry_number, "http", digest))
        return web.Response(status=STATUS.get(outcome, 200))

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        os.close(self._fd)
