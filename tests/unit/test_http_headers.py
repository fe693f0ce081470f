"""Kafka-header to HTTP-header encoding of the sidecar handler (pure logic)."""

from __future__ import annotations

import base64
import json

import pytest

from retryd.handlers.base import Message
from retryd.handlers.http_handler import (
    HEADERS_B64,
    decode_kafka_headers,
    encode_kafka_headers,
    redact_url,
    request_headers,
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def packed(encoded: list[tuple[str, str]]) -> dict[str, object]:
    values = [v for k, v in encoded if k == HEADERS_B64]
    assert len(values) <= 1
    return json.loads(values[0]) if values else {}


def test_plain_headers_pass_as_is() -> None:
    encoded = encode_kafka_headers(
        [("traceparent", b"00-abc-def-01"), ("Content-Type", b"application/json"), ("e", b"")]
    )
    assert encoded == [
        ("X-Kafka-traceparent", "00-abc-def-01"),
        ("X-Kafka-Content-Type", "application/json"),
        ("X-Kafka-e", ""),
    ]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("bin", b"\x00\xff\x01"),
        ("utf8", "héllo".encode()),
        ("latin1", "caf\xe9".encode("latin-1")),
        ("ctrl", b"a\r\nInjected: yes"),
        ("tab", b"a\tb"),
        ("spaces", b" padded "),
        ("under_score", b"x"),  # dropped by proxies / folded by WSGI
        ("has space", b"x"),
        ("colon:name", b"x"),
        ("-leading", b"x"),
        ("nämé", b"x"),
        ("", b"x"),
        ("nil", None),
    ],
)
def test_unsafe_headers_go_base64(name: str, value: bytes | None) -> None:
    encoded = encode_kafka_headers([(name, value)])
    assert [k for k, _ in encoded] == [HEADERS_B64]
    assert packed(encoded) == {name: None if value is None else b64(value)}
    # the header value itself is plain ASCII
    encoded[0][1].encode("ascii")


def test_repeated_and_case_colliding_names_are_packed() -> None:
    headers: list[tuple[str, bytes | None]] = [
        ("dup", b"a"),
        ("ok", b"1"),
        ("dup", None),
        ("dup", b"c"),
        ("Case", b"1"),
        ("case", b"2"),
    ]
    encoded = encode_kafka_headers(headers)
    assert ("X-Kafka-ok", "1") in encoded
    assert packed(encoded) == {
        "dup": [b64(b"a"), None, b64(b"c")],
        "Case": b64(b"1"),
        "case": b64(b"2"),
    }


def test_round_trip() -> None:
    headers: list[tuple[str, bytes | None]] = [
        ("plain", b"hello world"),
        ("bin", bytes(range(256))),
        ("nil", None),
        ("dup", b"x"),
        ("dup", b"y"),
        ("empty", b""),
        ("k_v", b"z"),
    ]
    decoded = decode_kafka_headers(dict(encode_kafka_headers(headers)))
    assert sorted(decoded, key=repr) == sorted(headers, key=repr)


def test_no_headers_no_http_headers() -> None:
    assert encode_kafka_headers([]) == []
    assert decode_kafka_headers({"Content-Type": "x"}) == []


@pytest.mark.parametrize("raw", ["not json", "[1]", '{"a": "***"}', '{"a": 5}'])
def test_decode_rejects_malformed_packed_header(raw: str) -> None:
    with pytest.raises(ValueError, match=HEADERS_B64):
        decode_kafka_headers({HEADERS_B64: raw})


def test_request_headers() -> None:
    message = Message(
        key=b"\x00key",
        value=b"v",
        headers=[("h", b"1")],
        topic="retry_5m",
        partition=3,
        offset=99,
        retry_number=2,
        original_topic="orders",
    )
    headers = dict(request_headers(message))
    assert headers == {
        "Content-Type": "application/octet-stream",
        "X-Retryd-Topic": "retry_5m",
        "X-Retryd-Partition": "3",
        "X-Retryd-Offset": "99",
        "X-Retryd-Retry-Number": "2",
        "X-Retryd-Original-Topic": "orders",
        "X-Retryd-Key": b64(b"\x00key"),
        "X-Kafka-h": "1",
    }


def test_request_headers_main_topic_and_null_key() -> None:
    headers = dict(request_headers(Message(key=None, value=None, topic="orders")))
    assert "X-Retryd-Key" not in headers
    assert headers["X-Retryd-Original-Topic"] == "orders"
    assert headers["X-Retryd-Retry-Number"] == "0"
    assert dict(request_headers(Message(key=b"", value=None, topic="t")))["X-Retryd-Key"] == ""


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://host:8080/hook", "http://host:8080/hook"),
        ("https://user:pw@host/hook", "https://***@host/hook"),
        ("http://host/hook?token=abc", "http://host/hook?***"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
