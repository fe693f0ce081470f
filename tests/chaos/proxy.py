"""A TCP forwarder the chaos suite controls: every client connection to the broker goes through
it (the broker advertises the proxy's address), so the suite can cut them all at once.

``cut()`` closes every open connection (both sides) and, until ``restore()``, resets each new
connection as soon as it is accepted: to a client that is a broker gone from the network, not a
broker that answers slowly. Threads, two per connection: a Kafka client keeps a handful of
long-lived connections, so simplicity wins over a selector loop.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

BUFFER = 256 * 1024
ACCEPT_POLL_S = 0.2  # how quickly the accept loop notices stop()
UPSTREAM_CONNECT_S = 5.0


def _reset_on_close(sock: socket.socket) -> None:
    """Make ``close()`` send RST instead of FIN (what a vanished peer looks like)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _Pair:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self._lock = threading.Lock()
        self._closed = False

    def close(self, *, reset: bool = False) -> None:
        """Close both sides once; ``shutdown`` first wakes a pump blocked in ``recv``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for sock in (self.client, self.upstream):
            if reset:
                _reset_on_close(sock)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


@dataclass
class ProxyStats:
    accepted: int = 0  # connections forwarded
    refused: int = 0  # connections reset on accept while cut
    cut: int = 0  # open connections closed by cut()
    cuts: int = 0  # cut() calls


class TcpProxy:
    """Listen on a loopback port and forward every connection to ``upstream_port``."""

    def __init__(self, upstream_port: int, listen_port: int = 0, host: str = "127.0.0.1") -> None:
        self.host = host
        self.upstream_port = upstream_port
        self._listener = socket.create_server((host, listen_port), reuse_port=False, backlog=128)
        self._listener.settimeout(ACCEPT_POLL_S)
        self.port: int = self._listener.getsockname()[1]
        self.stats = ProxyStats()
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def active(self) -> int:
        with self._lock:
            return len(self._pairs)

    # ------------------------------------------------------------------ control
    def start(self) -> TcpProxy:
        self._thread = threading.Thread(target=self._accept_loop, name="chaos-proxy", daemon=True)
        self._thread.start()
        return self

    def cut(self) -> int:
        """Close every open connection and refuse new ones; returns how many were closed."""
        self._cut.set()
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
            self.stats.cuts += 1
            self.stats.cut += len(pairs)
        for pair in pairs:
            pair.close(reset=True)
        log.info("proxy %s: cut %d connections", self.address, len(pairs))
        return len(pairs)

    def restore(self) -> None:
        """Accept and forward connections again."""
        self._cut.clear()
        log.info("proxy %s: restored", self.address)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for pair in pairs:
            pair.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ forwarding
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                raise
            if self._cut.is_set():
                self.stats.refused += 1
                _reset_on_close(client)
                client.close()
                continue
            try:
                upstream = socket.create_connection(
                    ("127.0.0.1", self.upstream_port), timeout=UPSTREAM_CONNECT_S
                )
            except OSError as exc:
                log.warning("proxy %s: upstream unreachable: %s", self.address, exc)
                _reset_on_close(client)
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, upstream)
            with self._lock:
                if self._cut.is_set():  # cut() ran while we connected upstream
                    pair.close(reset=True)
                    self.stats.refused += 1
                    continue
                self._pairs.add(pair)
                self.stats.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(pair, src, dst), name="chaos-proxy-pump", daemon=True
                ).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        """Copy bytes one way until EOF or an error, then close the whole pair (Kafka clients
        never half-close, so a one-sided end is the end of the connection)."""
        try:
            while True:
                data = src.recv(BUFFER)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._pairs.discard(pair)
            pair.close()
