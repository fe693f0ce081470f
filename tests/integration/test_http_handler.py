"""HttpHandler, driven through the worker's event-loop pool, against a real HTTP server on a
free loopback port."""

from __future__ import annotations

import base64
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from retryd.handlers.base import Message
from retryd.handlers.http_handler import (
    HEADERS_B64,
    VALUE_NULL,
    HttpHandler,
    decode_kafka_headers,
)
from retryd.policy.classify import HandlerResult, Outcome
from tests.pool_support import Harness, work_of


class Caller:
    """An HttpHandler behind a real LoopPool (as the worker runs it)."""

    def __init__(self, url: str, timeout_s: float = 5.0, max_in_flight: int = 4) -> None:
        self.adapter = HttpHandler(url, timeout_s=timeout_s, max_connections=max_in_flight)
        self.harness = Harness(self.adapter, max_in_flight=max_in_flight, timeout_s=timeout_s)

    def __call__(self, message: Message) -> HandlerResult:
        return self.harness.call(message, timeout=30)

    def close(self) -> None:
        self.harness.close()


MakeHandler = Callable[..., Caller]


@dataclass
class Received:
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    client_port: int

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        assert len(values) <= 1, f"{name} sent {len(values)} times"
        return values[0] if values else None


class SidecarServer(ThreadingHTTPServer):
    """Scripted sidecar: the path says how to answer; every request is recorded.

    ``/status/<code>``          answer <code> with a text body
    ``/json/<code>/<WORD>``     answer <code> with ``{"status": WORD}``
    ``/hang``                   answer only once ``release`` is set
    ``/redirect``               302 to ``/status/200``
    ``/big``                    200 with a 1 MiB body
    ``/drip``                   200 whose body trickles in a byte every 50 ms (never idle long
                                enough for a read timeout)
    """

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[Received] = []
        self.release = threading.Event()
        self.hanging = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # clients that hang up are fine
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is observable
    disable_nagle_algorithm = True  # headers and body are separate writes
    server: SidecarServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        self.server.received.append(
            Received(self.path, list(self.headers.items()), body, self.client_address[1])
        )
        parts = self.path.strip("/").split("/")
        try:
            if parts[0] == "status":
                code = int(parts[1])
                body = b"" if code in (204, 304) else b"answer " + parts[1].encode()  # RFC 9110
                self._answer(code, body, "text/plain")
            elif parts[0] == "json":
                payload = json.dumps({"status": parts[2]}).encode()
                self._answer(int(parts[1]), payload, "application/json")
            elif parts[0] == "hang":
                self.server.hanging.set()
                self.server.release.wait(30)
                self._answer(200, b"late", "text/plain")
            elif parts[0] == "redirect":
                self._answer(302, b"", "text/plain", (("Location", "/status/200"),))
            elif parts[0] == "drip":
                self._drip(100)
            elif parts[0] == "big":
                self._answer(200, b"x" * (1 << 20), "text/plain")
            else:
                self._answer(599, b"unknown test path", "text/plain")
        except OSError:  # the client gave up (timeout tests)
            pass

    def _drip(self, length: int) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        for _ in range(length):
            if self.server.release.wait(0.05):  # pacing, ends at teardown
                return
            self.wfile.write(b"x")

    def _answer(
        self, code: int, body: bytes, content_type: str, extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[SidecarServer]:
    srv = SidecarServer()
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.release.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)


@pytest.fixture
def handler_for(server: SidecarServer) -> Iterator[MakeHandler]:
    made: list[Caller] = []

    def make(path: str, timeout_s: float = 5.0, max_in_flight: int = 4) -> Caller:
        handler = Caller(server.url + path, timeout_s=timeout_s, max_in_flight=max_in_flight)
        made.append(handler)
        return handler

    yield make
    for handler in made:
        handler.close()


MSG = Message(
    key=b"order-1",
    value=b'{"amount": 5}',
    topic="retry_5m",
    partition=1,
    offset=77,
    retry_number=2,
    original_topic="orders",
)


@pytest.mark.parametrize(
    ("path", "outcome", "error_class"),
    [
        ("/status/200", Outcome.SUCCESS, None),
        ("/status/204", Outcome.SUCCESS, None),
        ("/status/404", Outcome.DEAD, "http_404"),
        ("/status/400", Outcome.DEAD, "http_400"),
        ("/status/408", Outcome.RETRY, "http_408"),
        ("/status/429", Outcome.RETRY, "http_429"),
        ("/status/500", Outcome.RETRY, "http_500"),
        ("/status/503", Outcome.RETRY, "http_503"),
        ("/json/500/SUCCESS", Outcome.SUCCESS, None),
        ("/json/200/DEAD", Outcome.DEAD, "http_200"),
        ("/json/200/RETRY", Outcome.RETRY, "http_200"),
        ("/json/200/DROP", Outcome.DROP, None),
        ("/json/503/DROP", Outcome.DROP, None),
        ("/redirect", Outcome.RETRY, "http_302"),
        ("/big", Outcome.SUCCESS, None),
    ],
)
def test_response_classification(
    server: SidecarServer,
    handler_for: MakeHandler,
    path: str,
    outcome: Outcome,
    error_class: str | None,
) -> None:
    handler = handler_for(path)
    result = handler(MSG)
    assert (result.outcome, result.error_class) == (outcome, error_class)
    assert [r.path for r in server.received] == [path]  # redirect not followed


def test_error_message_carries_body(handler_for: MakeHandler) -> None:
    result = handler_for("/status/503")(MSG)
    assert result.error_message == "answer 503"


def test_timeout(server: SidecarServer, handler_for: MakeHandler) -> None:
    handler = handler_for("/hang", timeout_s=0.3)
    start = time.monotonic()
    result = handler(MSG)
    elapsed = time.monotonic() - start
    assert (result.outcome, result.error_class) == (Outcome.RETRY, "timeout")
    assert server.hanging.is_set()
    assert 0.25 <= elapsed < 5.0
    # the handler is still usable afterwards
    server.release.set()
    assert handler_for("/status/200")(MSG).outcome is Outcome.SUCCESS


def test_slow_body_hits_the_overall_deadline(handler_for: MakeHandler) -> None:
    handler = handler_for("/drip", timeout_s=0.4)
    start = time.monotonic()
    result = handler(MSG)
    elapsed = time.monotonic() - start
    assert (result.outcome, result.error_class) == (Outcome.RETRY, "timeout")
    assert 0.35 <= elapsed < 5.0  # the whole body would take 5 s


def test_connection_refused() -> None:
    # Bound but not listening: connecting is refused, and no one else can take the port.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        handler = Caller(f"http://127.0.0.1:{port}/hook", timeout_s=2)
        try:
            result = handler(MSG)
        finally:
            handler.close()
    assert (result.outcome, result.error_class) == (Outcome.RETRY, "connection_error")
    assert result.error_message is not None and "Connect" in result.error_message


def test_request_carries_message(server: SidecarServer, handler_for: MakeHandler) -> None:
    headers: list[tuple[str, bytes | None]] = [
        ("traceparent", b"00-4bf92f-00f067-01"),
        ("binary", b"\x00\xff\xfe\x01"),
        ("utf8", "grüße".encode()),
        ("latin1", "caf\xe9".encode("latin-1")),
        ("nothing", None),
        ("retry_number", b"2"),
        ("dup", b"a"),
        ("dup", b"b"),
    ]
    value = bytes(range(256)) * 4
    key = b"\x00\xffkey"
    message = Message(
        key=key,
        value=value,
        headers=headers,
        topic="retry_5m",
        partition=4,
        offset=123456789012,
        retry_number=3,
        original_topic="orders",
    )
    assert handler_for("/status/200")(message).outcome is Outcome.SUCCESS
    got = server.received[-1]
    assert got.body == value
    assert got.header("Content-Length") == str(len(value))
    assert got.header("X-Retryd-Topic") == "retry_5m"
    assert got.header("X-Retryd-Partition") == "4"
    assert got.header("X-Retryd-Offset") == "123456789012"
    assert got.header("X-Retryd-Retry-Number") == "3"
    assert got.header("X-Retryd-Original-Topic") == "orders"
    assert base64.b64decode(got.header("X-Retryd-Key") or "") == key
    assert got.header("X-Kafka-traceparent") == "00-4bf92f-00f067-01"
    packed = json.loads(got.header(HEADERS_B64) or "{}")
    assert packed == {
        "binary": base64.b64encode(b"\x00\xff\xfe\x01").decode(),
        "utf8": base64.b64encode("grüße".encode()).decode(),
        "latin1": base64.b64encode(b"caf\xe9").decode(),
        "nothing": None,
        "retry_number": base64.b64encode(b"2").decode(),
        "dup": [base64.b64encode(b"a").decode(), base64.b64encode(b"b").decode()],
    }
    assert sorted(decode_kafka_headers(dict(got.headers)), key=repr) == sorted(headers, key=repr)


@pytest.mark.parametrize("value", [None, b""])
def test_empty_and_null_value(
    server: SidecarServer, handler_for: MakeHandler, value: bytes | None
) -> None:
    message = Message(key=None, value=value, topic="orders", partition=0, offset=1)
    assert handler_for("/status/200")(message).outcome is Outcome.SUCCESS
    got = server.received[-1]
    assert got.body == b""
    assert got.header("Content-Length") == "0"
    assert got.header("X-Retryd-Key") is None
    assert got.header("X-Retryd-Original-Topic") == "orders"
    # a tombstone and an empty value are told apart
    assert got.header(VALUE_NULL) == ("true" if value is None else None)
    assert got.header(HEADERS_B64) is None
    assert not [k for k, _ in got.headers if k.lower().startswith("x-kafka-")]


def test_connection_is_reused(server: SidecarServer, handler_for: MakeHandler) -> None:
    handler = handler_for("/status/200")
    for _ in range(5):
        assert handler(MSG).outcome is Outcome.SUCCESS
    assert len({r.client_port for r in server.received}) == 1


def test_concurrent_calls_share_a_bounded_keep_alive_pool(
    server: SidecarServer, handler_for: MakeHandler
) -> None:
    handler = handler_for("/status/200", max_in_flight=4)
    works = [work_of(MSG) for _ in range(40)]
    handler.harness.submit([(None, [w]) for w in works])
    done = handler.harness.collect(40, timeout=30)
    assert [w.result.outcome for w in done if w.result] == [Outcome.SUCCESS] * 40
    assert len(server.received) == 40
    # never more connections than calls in flight, and they are reused
    assert 1 <= len({r.client_port for r in server.received}) <= 4


@pytest.mark.parametrize(
    "original_topic",
    ["tópico", "日本語", "line\r\nX-Injected: 1", "\x00\x7f", "a" * 300],
)
def test_odd_header_values_never_break_the_request(
    server: SidecarServer, handler_for: MakeHandler, original_topic: str
) -> None:
    # Whatever a record carries, every HTTP header retryd sends is printable ASCII.
    message = Message(
        key=b"k", value=b"v", topic="retry_5m", retry_number=1, original_topic=original_topic
    )
    assert handler_for("/status/200")(message).outcome is Outcome.SUCCESS
    got = server.received[-1]
    sent = got.header("X-Retryd-Original-Topic") or ""
    assert sent.isascii() and sent.isprintable()
    assert got.header("X-Injected") is None
    from urllib.parse import unquote

    assert unquote(sent) == original_topic
