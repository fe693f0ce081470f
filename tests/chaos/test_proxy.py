"""The chaos proxy itself: it forwards, a cut closes every connection and refuses new ones,
a restore forwards again. Without these facts the broker-cut scenario would prove nothing."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.chaos.proxy import TcpProxy
from tests.support import wait_for


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A loopback echo server (one thread per connection)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


def _roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def _connection_dead(sock: socket.socket) -> bool:
    """True once the connection is closed or reset (reads give EOF or an error)."""
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b""
    except OSError:
        return True


def _refused(port: int) -> bool:
    """A new connection is reset: at once (connect fails) or on first use."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return True
    with sock:
        return _connection_dead(sock)


def test_forwards_cuts_refuses_and_restores(echo_port: int) -> None:
    with TcpProxy(echo_port) as proxy:
        big = bytes(range(256)) * 4096  # 1 MiB: forwarding is byte-exact, in both directions
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as before:
            assert _roundtrip(before, big) == big
            wait_for(lambda: proxy.active() == 1, 5, what="one open connection")

            assert proxy.cut() == 1
            assert _connection_dead(before)
        assert _refused(proxy.port), "a connection made during the cut was forwarded"
        assert proxy.stats.refused >= 1 and proxy.active() == 0

        proxy.restore()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as after:
            assert _roundtrip(after, b"hello again") == b"hello again"
        assert proxy.stats.accepted == 2 and proxy.stats.cut == 1 and proxy.stats.cuts == 1
