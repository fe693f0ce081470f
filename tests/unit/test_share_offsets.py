"""The share-group offsets client's encodings, against byte fixtures written from Kafka 4.4's
message schemas (clients/src/main/resources/common/message/*.json), and hostile responses.

DescribeShareGroupOffsetsResponse v1 adds ``Lag`` (int64) between ``LeaderEpoch`` and
``ErrorCode``; every struct of a flexible version ends with a tagged-field section.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from retryd.kafka.share_offsets import (
    ShareOffsetsError,
    ShareOffsetsUnsupported,
    SharePartitionOffset,
    decode_api_versions,
    decode_describe,
    decode_find_coordinator,
    encode_describe,
    encode_find_coordinator,
    pick_version,
    ssl_context,
)
from retryd.kafka.wire import Connection, Reader, WireError, Writer, frame, request_header
from retryd.share.lag import lags_of

TOPIC_ID = bytes(range(16))

# DescribeShareGroupOffsetsResponse v1, group "g", topic "t": partition 0 at start offset 4
# with a lag of 6 and a tagged field (tag 5, 2 bytes) to skip; partition 1 without state.
DESCRIBE_V1 = (
    b"\x00\x00\x00\x00"  # ThrottleTimeMs
    b"\x02"  # Groups: 1
    b"\x02g"  # GroupId
    b"\x02"  # Topics: 1
    b"\x02t" + TOPIC_ID + b"\x03"  # TopicName, TopicId, Partitions: 2
    b"\x00\x00\x00\x00"  # PartitionIndex 0
    b"\x00\x00\x00\x00\x00\x00\x00\x04"  # StartOffset 4
    b"\x00\x00\x00\x03"  # LeaderEpoch 3
    b"\x00\x00\x00\x00\x00\x00\x00\x06"  # Lag 6
    b"\x00\x00"  # ErrorCode
    b"\x00"  # ErrorMessage null
    b"\x01\x05\x02xx"  # tagged fields: one, tag 5, 2 bytes
    b"\x00\x00\x00\x01"  # PartitionIndex 1
    b"\xff\xff\xff\xff\xff\xff\xff\xff"  # StartOffset -1
    b"\x00\x00\x00\x00"
    b"\xff\xff\xff\xff\xff\xff\xff\xff"  # Lag -1
    b"\x00\x00\x00\x00"  # ErrorCode, ErrorMessage, no tags
    b"\x00"  # topic's tags
    b"\x00\x00\x00\x00"  # group ErrorCode, ErrorMessage null, tags
    b"\x00"  # response tags
)


def encode_describe_response(version: int, groups: list[tuple[str, int, list]]) -> bytes:
    """The broker's side, for round trips: (group, error code, partitions)."""
    w = Writer().int32(0).compact_array_length(len(groups))
    for group, code, parts in groups:
        w.compact_string(group)
        topics = sorted({p.topic for p in parts})
        w.compact_array_length(len(topics))
        for topic in topics:
            mine = [p for p in parts if p.topic == topic]
            w.compact_string(topic)
            w._parts.append(TOPIC_ID)
            w.compact_array_length(len(mine))
            for p in mine:
                w.int32(p.partition).int64(p.start_offset).int32(p.leader_epoch)
                if version >= 1:
                    w.int64(p.lag)
                w.int16(p.error_code).compact_string(p.error_message).no_tags()
            w.no_tags()
        w.int16(code).compact_string(None).no_tags()
    return w.no_tags().bytes()


def test_requests_match_the_schema_bytes() -> None:
    # FindCoordinator v4+: KeyType int8, CoordinatorKeys compact array; v3: Key, KeyType
    assert encode_find_coordinator(6, "g") == b"\x00\x02\x02g\x00"
    assert encode_find_coordinator(3, "g") == b"\x02g\x00\x00"
    # DescribeShareGroupOffsets: Groups [GroupId, Topics null, tags], tags
    assert encode_describe(1, "g") == b"\x02\x02g\x00\x00\x00"
    # request header v2: key, version, correlation id, client id (int16 string), tags
    assert request_header(90, 1, 7, "c", flexible=True) == (
        b"\x00\x5a\x00\x01\x00\x00\x00\x07\x00\x01c\x00"
    )
    assert (
        request_header(18, 0, 1, "c", flexible=False)
        == b"\x00\x12\x00\x00\x00\x00\x00\x01\x00\x01c"
    )
    assert frame(b"ab", b"cd") == b"\x00\x00\x00\x04abcd"


def test_describe_v1_fixture_decodes() -> None:
    (group,) = decode_describe(Reader(DESCRIBE_V1, "fixture"), 1)
    assert group.group == "g" and group.error_code == 0
    assert group.partitions == [
        SharePartitionOffset("t", 0, 4, 3, 6),
        SharePartitionOffset("t", 1, -1, 0, -1),
    ]


@pytest.mark.parametrize("version", [0, 1])
def test_describe_round_trips(version: int) -> None:
    parts = [
        SharePartitionOffset("a", 0, 10, 1, 5 if version else -1),
        SharePartitionOffset("a", 2, 0, 0, 0 if version else -1),
        SharePartitionOffset("b", 1, -1, 0, -1, 3, "unknown partition"),
    ]
    raw = encode_describe_response(version, [("grp", 0, parts), ("other", 69, [])])
    got = decode_describe(Reader(raw, "round trip"), version)
    assert [(g.group, g.error_code) for g in got] == [("grp", 0), ("other", 69)]
    assert got[0].partitions == parts


def test_find_coordinator_responses() -> None:
    ok = (
        Writer().int32(0).compact_array_length(1).compact_string("g").int32(1)
        .compact_string("broker-1").int32(9093).int16(0).compact_string(None).no_tags()
        .no_tags().bytes()
    )  # fmt: skip
    assert decode_find_coordinator(Reader(ok, "fc"), 6, "g") == ("broker-1", 9093)
    v3 = Writer().int32(0).int16(0).compact_string(None).int32(1)
    v3.compact_string("h").int32(9092).no_tags()
    assert decode_find_coordinator(Reader(v3.bytes(), "fc"), 3, "g") == ("h", 9092)
    refused = (
        Writer().int32(0).compact_array_length(1).compact_string("g").int32(-1)
        .compact_string("").int32(-1).int16(15).compact_string("loading").no_tags()
        .no_tags().bytes()
    )  # fmt: skip
    with pytest.raises(ShareOffsetsError, match="COORDINATOR_NOT_AVAILABLE \\(loading\\)"):
        decode_find_coordinator(Reader(refused, "fc"), 6, "g")


def test_api_versions_and_version_choice() -> None:
    raw = Writer().int16(0).int32(2).int16(10).int16(0).int16(6)
    raw.int16(90).int16(0).int16(1)
    supported = decode_api_versions(Reader(raw.bytes(), "av"))
    assert supported == {10: (0, 6), 90: (0, 1)}
    assert pick_version(supported, 10, (3, 6), "FindCoordinator") == 6
    assert pick_version({90: (0, 0)}, 90, (0, 1), "Describe") == 0
    assert pick_version({90: (0, 5)}, 90, (0, 1), "Describe") == 1
    with pytest.raises(ShareOffsetsUnsupported, match=r"offers none.*Apache Kafka 4.2"):
        pick_version({10: (0, 6)}, 90, (0, 1), "DescribeShareGroupOffsets")
    with pytest.raises(ShareOffsetsUnsupported, match="offers v0-2"):
        pick_version({10: (0, 2)}, 10, (3, 6), "FindCoordinator")


@pytest.mark.parametrize("cut", range(len(DESCRIBE_V1)))
def test_every_truncation_is_a_clear_error(cut: int) -> None:
    with pytest.raises(WireError, match=r"truncated|malformed"):
        decode_describe(Reader(DESCRIBE_V1[:cut], "DescribeShareGroupOffsets"), 1)


def test_hostile_lengths_and_leftovers() -> None:
    huge = Writer().int32(0).uvarint(0x0FFFFFFF).bytes()
    with pytest.raises(WireError, match="cannot fit"):
        decode_describe(Reader(huge, "d"), 1)
    with pytest.raises(WireError, match="longer than 5 bytes"):
        Reader(b"\xff" * 6, "d").uvarint()
    with pytest.raises(WireError, match="2 bytes left over"):
        decode_describe(Reader(DESCRIBE_V1 + b"zz", "d"), 1)
    with pytest.raises(WireError, match=r"malformed|truncated"):  # v0 reads a v1 body
        decode_describe(Reader(DESCRIBE_V1, "d"), 0)
    with pytest.raises(WireError, match="not UTF-8"):
        Reader(b"\x03\xff\xfe", "d").compact_string()


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[socket.socket], None]], tuple[str, int]]]:
    """A real TCP server on loopback answering one connection with ``reply``."""
    listeners: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def start(reply: Callable[[socket.socket], None]) -> tuple[str, int]:
        lsock = socket.create_server(("127.0.0.1", 0))
        listeners.append(lsock)

        def serve() -> None:
            conn, _ = lsock.accept()
            with conn:
                conn.recv(4096)  # the request
                reply(conn)

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        threads.append(t)
        host, port = lsock.getsockname()[:2]
        return host, port

    yield start
    for lsock in listeners:
        lsock.close()
    for t in threads:
        t.join(5)


def test_an_oversize_response_is_refused_before_it_is_read(server) -> None:  # type: ignore[no-untyped-def]
    host, port = server(lambda c: c.sendall(b"\x40\x00\x00\x00"))  # 1 GiB announced
    with (
        Connection(host, port, None, 5.0, max_response_bytes=1 << 20) as conn,
        pytest.raises(WireError, match="1073741824-byte response \\(limit 1048576\\)"),
    ):
        conn.request(18, 0, b"", flexible=False, what="ApiVersions")


def test_a_connection_closed_mid_response_is_a_clear_error(server) -> None:  # type: ignore[no-untyped-def]
    host, port = server(lambda c: c.sendall(b"\x00\x00\x00\x10\x00\x00"))
    with (
        Connection(host, port, None, 5.0) as conn,
        pytest.raises(WireError, match="closed the connection after 2 of 16 bytes"),
    ):
        conn.request(18, 0, b"", flexible=False, what="ApiVersions")


def test_a_silent_broker_times_out(server) -> None:  # type: ignore[no-untyped-def]
    done = threading.Event()
    host, port = server(lambda c: done.wait(10))
    try:
        with (
            Connection(host, port, None, 0.5) as conn,
            pytest.raises(WireError, match=r"no response within 0\.5s"),
        ):
            conn.request(18, 0, b"", flexible=False, what="ApiVersions")
    finally:
        done.set()


def test_a_wrong_correlation_id_is_refused(server) -> None:  # type: ignore[no-untyped-def]
    host, port = server(lambda c: c.sendall(b"\x00\x00\x00\x04\x7f\xff\xff\xff"))
    with (
        Connection(host, port, None, 5.0) as conn,
        pytest.raises(WireError, match="correlation id 2147483647"),
    ):
        conn.request(18, 0, b"", flexible=False, what="ApiVersions")


def test_nobody_listening_is_a_clear_error() -> None:
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    lsock.close()
    with pytest.raises(WireError, match=f"cannot connect to 127.0.0.1:{port}"):
        Connection("127.0.0.1", port, None, 2.0)


def test_security_sasl_names_the_fallback() -> None:
    for protocol in ("SASL_SSL", "sasl_plaintext"):
        with pytest.raises(ShareOffsetsUnsupported) as info:
            ssl_context({"security.protocol": protocol, "sasl.mechanism": "PLAIN"}, "g.share")
        assert "kafka-share-groups.sh --describe --group g.share" in str(info.value)
    with pytest.raises(ShareOffsetsUnsupported, match=r"ssl\.keystore\.location"):
        ssl_context({"security.protocol": "ssl", "ssl.keystore.location": "k.p12"}, "g")
    with pytest.raises(ShareOffsetsUnsupported, match="cannot set up TLS"):
        ssl_context({"security.protocol": "ssl", "ssl.ca.location": "/nonexistent/ca.pem"}, "g")
    assert ssl_context({"bootstrap.servers": "x:9092"}, "g") is None
    ctx = ssl_context({"security.protocol": "SSL"}, "g")
    assert ctx is not None and ctx.check_hostname
    loose = ssl_context(
        {"security.protocol": "ssl", "enable.ssl.certificate.verification": "false"}, "g"
    )
    assert loose is not None and not loose.check_hostname


def test_lag_prefers_the_brokers_figure() -> None:
    offsets = [
        SharePartitionOffset("t", 0, 4, 0, 6),  # the broker's lag
        SharePartitionOffset("t", 1, 4, 0, -1),  # none: high watermark - start offset
        SharePartitionOffset("t", 2, -1, 0, -1),  # no state: unknown, like the Kafka script
        SharePartitionOffset("t", 3, 7, 0, -1, 3, "gone"),  # an error: unknown
        SharePartitionOffset("t", 4, 9, 0, -1),  # start past a stale high watermark: 0
    ]
    high = {("t", 0): 100, ("t", 1): 10, ("t", 2): 5, ("t", 3): 9, ("t", 4): 8}
    assert lags_of(offsets, high) == {("t", 0): 6, ("t", 1): 6, ("t", 4): 0}
