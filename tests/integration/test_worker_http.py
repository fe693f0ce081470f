"""Sidecar mode end to end: the worker calls a real HTTP endpoint and routes by its answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from retryd.policy import headers as h
from tests.integration.worker_support import deployment
from tests.support import http_service, produce, read_topic


class _Business(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str]] = []  # (body, retry number header, original topic header)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        retry = self.headers.get("X-Retryd-Retry-Number", "")
        self.seen.append((body, retry, self.headers.get("X-Retryd-Original-Topic", "")))
        status, payload = 200, b""
        if body == "fail-once" and retry == "0":
            status = 503
        elif body.startswith("blip-") and sum(1 for b, _, _ in self.seen if b == body) <= 2:
            status = 503  # a blip: the first two calls of this body fail
        elif body == "missing":
            status, payload = 404, b"no such order"
        elif body == "json-dead":
            payload = json.dumps({"status": "DEAD"}).encode()
        elif body == "drop":
            payload = json.dumps({"status": "DROP"}).encode()
        self.send_response(status)
        self.send_header(
            "Content-Type", "application/json" if payload.startswith(b"{") else "text/plain"
        )
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def business() -> Iterator[str]:
    _Business.seen = []
    with http_service(_Business) as url:
        yield url


def test_worker_routes_by_http_answers(bootstrap: str, tmp_path: Path, business: str) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s", handler=business)
    produce(
        bootstrap,
        dep.main,
        [(k.encode(), k.encode()) for k in ("ok", "fail-once", "missing", "json-dead", "drop")],
    )

    summary = dep.run()

    calls = [(body, retry) for body, retry, _ in _Business.seen]
    assert sorted(calls) == sorted(
        [
            ("ok", "0"),
            ("fail-once", "0"),
            ("fail-once", "1"),
            ("missing", "0"),
            ("json-dead", "0"),
            ("drop", "0"),
        ]
    )
    assert {orig for _, _, orig in _Business.seen} == {dep.main}
    dead = {r.key: r for r in read_topic(bootstrap, dep.failed, expect=2)}
    assert set(dead) == {b"missing", b"json-dead"}
    assert dead[b"missing"].header(h.ERROR_CLASS) == b"http_404"
    assert dead[b"missing"].header(h.ERROR_MESSAGE) == b"no such order"
    assert dead[b"json-dead"].header(h.DEAD_REASON) == b"non_retryable"
    hop = read_topic(bootstrap, dep.tier("1s"), expect=1)
    assert hop[0].key == b"fail-once" and hop[0].header(h.ERROR_CLASS) == b"http_503"
    assert summary.total("dropped") == 1 and summary.total("success") == 2


def test_quick_retries_ride_out_a_blip_of_the_business_service(
    bootstrap: str, tmp_path: Path, business: str
) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s, quick=2@100ms", handler=business)
    produce(bootstrap, dep.main, [(b"k%d" % i, b"blip-%d" % i) for i in range(10)])

    summary = dep.run()

    calls = [(body, retry) for body, retry, _ in _Business.seen]
    assert sorted(calls) == sorted((f"blip-{i}", "0") for i in range(10) for _ in range(3))
    assert read_topic(bootstrap, dep.tier("1s")) == [] and read_topic(bootstrap, dep.failed) == []
    assert summary.total("success") == 10 and summary.total("retried") == 0


def test_odd_header_values_never_stop_an_http_worker(
    bootstrap: str, tmp_path: Path, business: str
) -> None:
    """A tier record whose ``retryd_original_topic`` is UTF-8 but not ASCII used to crash every
    HTTP-mode worker (UnicodeEncodeError in the HTTP client) on every restart. It is now
    dead-lettered as malformed; odd *user* headers reach the handler intact."""
    from retryd.hosting.process import EXIT_OK

    dep = deployment(bootstrap, tmp_path, sequence="1s", handler=business)
    good = [
        (h.RETRY_NUMBER, b"1"),
        (h.RETRY_TIMESTAMP, b"0"),
        (h.ORIGINAL_PARTITION, b"0"),
        (h.ORIGINAL_OFFSET, b"0"),
    ]
    odd_topics = [
        "tópico".encode(),
        "日本語".encode(),
        b"line\r\nX-Injected: 1",
        b"\xff\xfe",
        b"a" * 300,
    ]
    records = [
        (b"odd%d" % i, b"ok", [*good, (h.ORIGINAL_TOPIC, topic)])
        for i, topic in enumerate(odd_topics)
    ]
    records.append(
        (
            b"user-headers",
            b"ok",
            [
                *good,
                (h.ORIGINAL_TOPIC, dep.main.encode()),
                ("grüße", "héllo".encode()),
                ("bin", b"\x00\xff"),
                ("crlf", b"a\r\nb"),
                ("nul", None),
            ],
        )
    )
    produce(bootstrap, dep.tier("1s"), records)
    log = tmp_path / "http.log"
    proc = dep.spawn_worker(log, "--until-drained")
    try:
        code = proc.wait(120)
    finally:
        from tests.integration.worker_support import stop_process

        stop_process(proc)
    assert code == EXIT_OK
    dead = read_topic(bootstrap, dep.failed, expect=len(odd_topics))
    assert sorted(r.key for r in dead) == sorted(b"odd%d" % i for i in range(len(odd_topics)))
    assert {r.header(h.DEAD_REASON) for r in dead} == {b"malformed"}
    assert [body for body, _, _ in _Business.seen] == ["ok"]  # the well-formed one only
