"""Issue 31, fault 7: the share-lag reader thread outlives any answer a broker gives.

A FindCoordinator answer naming a host the IDNA codec rejects (a 64-character label) raised
``UnicodeError`` out of ``wire.Connection`` and out of the reader's loop: the thread died, the
lag gauge froze at its last value, and a stuck share worker no longer tripped the lag alert.
Here a scripted broker on loopback gives that answer to the real reader (real
``ShareOffsetsClient``, real sockets), then correct ones: the thread must still be alive,
``retryd_share_lag_reader_up`` must say 0 while the answers are bad, then 1 and
the lag reported once they are good again.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from prometheus_client import REGISTRY

from retryd.kafka.wire import WireError, Writer
from retryd.metrics.lag import ReaderHealth
from retryd.share.lag import ShareLagReader
from retryd.worker.events import NullSink
from tests.support import wait_for

BAD_HOST = "a" * 64 + ".example"  # one label over the 63 characters DNS allows
TOPIC_ID = bytes(range(16))


@dataclass
class Script:
    """What the fake broker answers FindCoordinator with, and what it has answered."""

    host: str = BAD_HOST
    port: int = 0
    answered: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, key: str) -> None:
        with self.lock:
            self.answered[key] = self.answered.get(key, 0) + 1

    def seen(self, key: str) -> int:
        with self.lock:
            return self.answered.get(key, 0)


def _api_versions() -> bytes:
    w = Writer().int16(0).int32(3)
    for key, low, high in ((18, 0, 3), (10, 0, 6), (90, 0, 1)):
        w.int16(key).int16(low).int16(high)
    return w.bytes()


def _find_coordinator(host: str, port: int) -> bytes:
    w = Writer().int32(0).compact_array_length(1).compact_string("g").int32(1)
    w.compact_string(host).int32(port).int16(0).compact_string(None).no_tags()
    return w.no_tags().bytes()


def _describe() -> bytes:
    """DescribeShareGroupOffsets v1: group g, topic t, partition 0 at offset 4, lag 6."""
    w = Writer().int32(0).compact_array_length(1).compact_string("g")
    w.compact_array_length(1).compact_string("t")
    w._parts.append(TOPIC_ID)
    w.compact_array_length(1).int32(0).int64(4).int32(0).int64(6).int16(0)
    w.compact_string(None).no_tags().no_tags()
    return w.int16(0).compact_string(None).no_tags().no_tags().bytes()


class FakeBroker(socketserver.BaseRequestHandler):
    """Answers ApiVersions v0, FindCoordinator v6 and DescribeShareGroupOffsets v1, one
    request at a time, until the client closes the connection."""

    script: Script

    def _read(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = self.request.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def handle(self) -> None:
        while True:
            size = self._read(4)
            payload = self._read(struct.unpack(">i", size)[0]) if size else None
            if payload is None:
                return
            api_key, _version, correlation = struct.unpack(">hhi", payload[:8])
            if api_key == 18:  # response header v0
                body, header = _api_versions(), struct.pack(">i", correlation)
            else:  # response header v1: an empty tagged-field section
                header = struct.pack(">ib", correlation, 0)
                if api_key == 10:
                    body = _find_coordinator(self.script.host, self.script.port)
                    self.script.count("bad" if self.script.host == BAD_HOST else "good")
                else:
                    body = _describe()
            self.request.sendall(struct.pack(">i", len(header) + len(body)) + header + body)


class Recorded(NullSink):
    def __init__(self) -> None:
        self.lags: list[dict[tuple[str, int], int]] = []

    def lag(self, lags: dict[tuple[str, int], int]) -> None:
        self.lags.append(dict(lags))


@pytest.fixture
def broker() -> Iterator[Script]:
    script = Script()
    handler = type("Handler", (FakeBroker,), {"script": script})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    script.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield script
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def reader_up() -> float | None:
    return REGISTRY.get_sample_value("retryd_share_lag_reader_up")


def test_a_bad_coordinator_host_leaves_the_reader_alive_and_stale_then_it_recovers(
    broker: Script, caplog: pytest.LogCaptureFixture
) -> None:
    events = Recorded()
    reader = ShareLagReader(
        {"bootstrap.servers": f"127.0.0.1:{broker.port}"},
        "g",
        ["t"],
        events,
        interval_s=0.02,
        timeout_s=5.0,
    )
    # Partitions without share state are counted through librdkafka's admin client, which
    # needs a real broker (tests/integration/test_share_lag.py); here every partition has.
    reader.unstarted = lambda offsets: {}  # type: ignore[method-assign]
    with caplog.at_level("INFO", logger="retryd.share.lag"):
        reader.start()
        try:
            thread = reader._thread
            assert thread is not None
            wait_for(
                lambda: broker.seen("bad") >= 3 or not thread.is_alive(),
                15,
                what="three bad FindCoordinator answers (or the reader's end)",
            )
            assert thread.is_alive(), "the share-lag reader died on a bad coordinator host"
            assert reader_up() == 0.0
            assert events.lags == []

            broker.host = "127.0.0.1"
            wait_for(lambda: events.lags, 15, what="a lag read after the broker recovered")
            assert thread.is_alive()
            assert events.lags[0] == {("t", 0): 6}
            wait_for(lambda: reader_up() == 1.0, 5, what="the reader's gauge back at 1")
        finally:
            reader.stop()
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    warnings = [m for level, m in messages if level == "WARNING"]
    assert len(warnings) == 1, messages  # the same cause, read after read: logged once
    assert "not a valid host name" in warnings[0] and BAD_HOST in warnings[0]
    assert any(level == "INFO" and "read again" in m for level, m in messages), messages


def test_reader_health_logs_each_new_cause_once_and_the_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    told: list[bool] = []
    health = ReaderHealth(
        "share group g: lag", logging.getLogger("retryd.share.lag"), report=told.append
    )
    with caplog.at_level("INFO", logger="retryd.share.lag"):
        for correlation in (7, 8, 9):  # numbers in a message do not make a new cause
            health.failed(WireError(f"correlation id {correlation}, expected 1"))
        health.failed(ValueError("something else"))
        health.failed(ValueError("something else"))
        health.ok()
        health.ok()
        health.failed(WireError("correlation id 3, expected 1"))  # a new outage: logged
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in logged] == ["WARNING", "WARNING", "INFO", "WARNING"], logged
    assert "WireError: correlation id 7" in logged[0][1]
    assert caplog.records[0].exc_info is None  # an error a reader expects: its message only
    assert "ValueError: something else" in logged[1][1]
    assert caplog.records[1].exc_info is not None  # anything else: its traceback too
    assert "read again after 5 failed reads" in logged[2][1]
    assert told == [False] * 5 + [True, True, False]
    assert not health.up and health.failures == 6


def test_nobody_listening_where_the_coordinator_is_said_to_be(broker: Script) -> None:
    """A connection that fails is a ``WireError`` too (the cause chained), so the reader's
    one ``except`` sees it like any other failed read."""
    from retryd.kafka.share_offsets import ShareOffsetsClient

    bootstrap = f"127.0.0.1:{broker.port}"
    lsock = socket.create_server(("127.0.0.1", 0))
    broker.host, broker.port = lsock.getsockname()[:2]
    lsock.close()  # the coordinator the broker names: nobody listens there now
    with pytest.raises(WireError, match="cannot connect"):
        ShareOffsetsClient({"bootstrap.servers": bootstrap}, "g", timeout_s=2).describe()
