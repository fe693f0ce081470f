"""Property: whatever bytes a peer sends, the wire decoders raise ``WireError`` and nothing else.

The share-lag reader (issue 31 fault 7) died on an exception type its loop did not expect;
its loop now survives anything, but the client it calls promises one type for every
malformed answer, so a caller (``retryd share-lag``) needs one ``except``. Random bytes find
little past the first length; mutations of valid responses (bytes flipped, cut, inserted,
deleted) reach every field. ``ShareOffsetsError`` is the one other outcome allowed: a
well-formed answer carrying a broker error code, which is not a decoding failure.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retryd.kafka.share_offsets import (
    ShareOffsetsError,
    SharePartitionOffset,
    decode_api_versions,
    decode_describe,
    decode_find_coordinator,
)
from retryd.kafka.wire import (
    Connection,
    Reader,
    WireError,
    Writer,
    check_address,
    response_body,
)
from tests.unit.test_share_offsets import DESCRIBE_V1, encode_describe_response

FUZZ = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _find_coordinator_v6(host: str, port: int, code: int = 0) -> bytes:
    w = Writer().int32(0).compact_array_length(1).compact_string("g").int32(1)
    w.compact_string(host).int32(port).int16(code).compact_string(None).no_tags()
    return w.no_tags().bytes()


def _find_coordinator_v3(host: str, port: int) -> bytes:
    w = Writer().int32(0).int16(0).compact_string(None).int32(1)
    return w.compact_string(host).int32(port).no_tags().bytes()


def _api_versions() -> bytes:
    w = Writer().int16(0).int32(3)
    for key, low, high in ((18, 0, 3), (10, 0, 6), (90, 0, 1)):
        w.int16(key).int16(low).int16(high)
    return w.bytes()


PARTS = [
    SharePartitionOffset("orders", 0, 10, 1, 5),
    SharePartitionOffset("orders", 3, -1, 0, -1, 3, "unknown partition"),
]
# (decoder, a valid response it reads)
VALID: list[tuple[str, Callable[[Reader], object], bytes]] = [
    ("fc6", lambda r: decode_find_coordinator(r, 6, "g"), _find_coordinator_v6("b-1", 9092)),
    ("fc3", lambda r: decode_find_coordinator(r, 3, "g"), _find_coordinator_v3("b-1", 9092)),
    ("d1", lambda r: decode_describe(r, 1), DESCRIBE_V1),
    ("d1rt", lambda r: decode_describe(r, 1), encode_describe_response(1, [("g", 0, PARTS)])),
    (
        "d0",
        lambda r: decode_describe(r, 0),
        encode_describe_response(0, [("g", 0, [p for p in PARTS if p.lag < 0])]),
    ),
    ("av", decode_api_versions, _api_versions()),
]
DECODERS = [decode for _, decode, _ in VALID]


@st.composite
def mutated(draw: st.DrawFn, base: bytes) -> bytes:
    """``base`` with a few random edits: a byte replaced, bytes inserted or deleted, a cut,
    or a length-shaped value (0x7f, 0x80, 0xff, a big-endian -2) planted."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["set", "insert", "delete", "cut", "plant"]))
        if op == "set" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif op == "cut":
            del data[at:]
        elif op == "plant":
            value = draw(st.sampled_from([b"\x7f", b"\x80", b"\xff", b"\xff\xfe", b"\xff" * 5]))
            data[at : at + len(value)] = value
    return bytes(data)


def a_broker_error(exc: ShareOffsetsError) -> bool:
    """A broker's error code, in an answer that decoded: not a decoding failure."""
    return type(exc) is ShareOffsetsError and (
        "refused" in str(exc) or "no coordinator" in str(exc)
    )


def only_wire_errors(decode: Callable[[Reader], object], data: bytes) -> None:
    try:
        decode(Reader(data, "fuzzed response"))
    except WireError:
        pass
    except ShareOffsetsError as exc:
        assert a_broker_error(exc), exc


@FUZZ
@given(data=st.binary(max_size=256), which=st.integers(0, len(DECODERS) - 1))
def test_random_bytes_raise_only_wire_error(data: bytes, which: int) -> None:
    only_wire_errors(DECODERS[which], data)


@FUZZ
@given(case=st.sampled_from(VALID).flatmap(lambda c: st.tuples(st.just(c[1]), mutated(c[2]))))
def test_mutated_responses_raise_only_wire_error(
    case: tuple[Callable[[Reader], object], bytes],
) -> None:
    decode, data = case
    only_wire_errors(decode, data)


@pytest.mark.parametrize(("name", "decode", "valid"), VALID, ids=[v[0] for v in VALID])
def test_the_valid_fixtures_decode(
    name: str, decode: Callable[[Reader], object], valid: bytes
) -> None:
    decode(Reader(valid, name))  # the base of the mutations is valid: they start from sense


@FUZZ
@given(host=st.text(max_size=300), port=st.integers(-(2**31), 2**31 - 1))
def test_a_coordinator_address_is_checked_before_any_connection(host: str, port: int) -> None:
    """What ``getaddrinfo`` would refuse with ``UnicodeError`` (issue 31 fault 7) or an
    ``OverflowError`` is refused as ``WireError`` by the decoder itself."""
    try:
        decode_find_coordinator(Reader(_find_coordinator_v6(host, port), "fc"), 6, "g")
    except WireError:
        return
    host.encode("idna")  # whatever passed, the resolver's codec takes
    assert host and 0 < port <= 0xFFFF


@settings(max_examples=60, deadline=None)
@given(host=st.text(min_size=1, max_size=120))
def test_connecting_to_a_host_the_codec_refuses_is_a_wire_error(host: str) -> None:
    try:
        host.encode("idna")
    except UnicodeError:
        pass
    else:
        return  # a host the codec takes would be looked up: not this test's business
    with pytest.raises(WireError, match="cannot connect"):
        Connection(host, 9092, None, 0.5)


@FUZZ
@given(
    payload=st.binary(max_size=64),
    correlation=st.integers(0, 2**31 - 1),
    flexible=st.booleans(),
)
def test_response_headers_raise_only_wire_error(
    payload: bytes, correlation: int, flexible: bool
) -> None:
    with contextlib.suppress(WireError):
        response_body(payload, correlation, flexible=flexible, what="fuzzed")


@pytest.fixture
def replier() -> Iterator[Callable[[Callable[[int], bytes]], tuple[str, int]]]:
    """A loopback server answering each connection's first request with ``reply(correlation
    id of the request)``, then closing it."""
    lsock = socket.create_server(("127.0.0.1", 0))
    state: dict[str, Callable[[int], bytes]] = {}

    def serve() -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return  # the listener closed: the test is over
            with conn:
                size = b""
                while len(size) < 4 and (chunk := conn.recv(4 - len(size))):
                    size += chunk
                request = b""
                while len(size) == 4 and len(request) < struct.unpack(">i", size)[0]:
                    if not (chunk := conn.recv(65536)):
                        break
                    request += chunk
                correlation = struct.unpack(">i", request[4:8])[0] if len(request) >= 8 else 0
                conn.sendall(state["reply"](correlation))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def set_reply(reply: Callable[[int], bytes]) -> tuple[str, int]:
        state["reply"] = reply
        host, port = lsock.getsockname()[:2]
        return host, port

    yield set_reply
    lsock.close()
    thread.join(5)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    case=st.sampled_from(VALID).flatmap(
        lambda c: st.tuples(st.just(c[1]), st.just(c[0]), mutated(c[2]))
    ),
    size_delta=st.sampled_from([0, 0, 0, -3, 5, 1 << 30]),
    right_id=st.booleans(),
)
def test_a_fuzzed_response_over_a_real_socket_raises_only_wire_error(
    replier: Callable[[Callable[[int], bytes]], tuple[str, int]],
    case: tuple[Callable[[Reader], object], str, bytes],
    size_delta: int,
    right_id: bool,
) -> None:
    """The whole path a reader takes: framing (sizes too small, too large, absurd), the
    correlation id, the response header, then the decoder."""
    decode, name, body = case
    flexible = name != "av"

    def reply(correlation: int) -> bytes:
        header = struct.pack(">i", correlation if right_id else correlation ^ 0x5A5A)
        if flexible:
            header += b"\x00"
        size = (len(header) + len(body) + size_delta) & 0xFFFFFFFF
        return struct.pack(">I", size) + header + body

    host, port = replier(reply)
    try:
        with Connection(host, port, None, 2.0, max_response_bytes=1 << 20) as conn:
            api_key = 18 if name == "av" else 10 if name.startswith("fc") else 90
            decode(conn.request(api_key, 0, b"", flexible=flexible, what=name))
    except WireError:
        pass
    except ShareOffsetsError as exc:
        assert a_broker_error(exc), exc


def test_check_address_names_the_bad_host_and_cuts_it() -> None:
    with pytest.raises(WireError, match=r"'a{64}\.b' is not a valid host name"):
        check_address("a" * 64 + ".b", 9092, "FindCoordinator response")
    with pytest.raises(WireError, match=r"'a{100}\.\.\.' is not a valid host name"):
        check_address("a" * 5000, 9092, "FindCoordinator response")
    with pytest.raises(WireError, match="port 70000"):
        check_address("broker", 70000, "FindCoordinator response")
    with pytest.raises(WireError, match="no host"):
        check_address(None, 9092, "FindCoordinator response")
    assert check_address("broker-1.example", 9093, "fc") == ("broker-1.example", 9093)
