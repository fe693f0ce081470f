"""Bulk mode's wire format: the request's JSON and reading the answer (no I/O)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retryd.handlers.base import Message
from retryd.handlers.http_bulk import (
    BAD_ANSWER_CLASS,
    BAD_STATUS_CLASS,
    MISSING_CLASS,
    HttpBulkHandler,
    request_body,
    results_from_answer,
)
from retryd.handlers.http_handler import decode_kafka_headers
from retryd.policy.classify import Outcome


def test_request_round_trip() -> None:
    headers: list[tuple[str, bytes | None]] = [
        ("traceparent", b"00-abc-01"),
        ("binary", b"\x00\xff"),
        ("nothing", None),
        ("dup", b"a"),
        ("dup", b"b"),
    ]
    messages = [
        Message(
            key=b"\x00\xffkey",
            value='grüße "quoted"\n'.encode(),
            headers=headers,
            topic="retry_5m",
            partition=4,
            offset=123456789012,
            retry_number=3,
            original_topic="tópico",
        ),
        Message(key=None, value=b"\xff\xfe binary", topic="orders"),
        Message(key=b"", value=None, topic="orders", offset=9),
        Message(key=b"k", value=b"", topic="orders"),
    ]
    body = request_body(messages)
    assert body.isascii()
    records = json.loads(body)["records"]
    assert [r["id"] for r in records] == [0, 1, 2, 3]
    first = records[0]
    assert (first["topic"], first["partition"], first["offset"]) == ("retry_5m", 4, 123456789012)
    assert (first["retry_number"], first["original_topic"]) == (3, "tópico")
    assert base64.b64decode(first["key"]) == b"\x00\xffkey"
    assert first["value"].encode() == messages[0].value
    assert sorted(decode_kafka_headers(first["headers"]), key=repr) == sorted(headers, key=repr)
    assert records[1]["key"] is None and "value" not in records[1]
    assert base64.b64decode(records[1]["value_b64"]) == b"\xff\xfe binary"
    assert (records[2]["key"], records[2]["value"]) == ("", None)
    assert records[2]["original_topic"] == "orders"
    assert records[3]["value"] == "" and "headers" not in records[3]


def _answer(*entries: object) -> bytes:
    return json.dumps({"results": list(entries)}).encode()


def test_answer_statuses_and_ids() -> None:
    body = _answer(
        {"id": 0, "status": "SUCCESS"},
        {"id": "1", "status": "dead", "error": "bad order", "error_name": "OrderInvalid"},
        {"id": 2, "status": "DROP"},
        {"id": 3, "status": "RETRY"},
        {"id": 4, "status": "LATER"},
        {"id": 0, "status": "DEAD"},  # repeated: the first one counts
        {"id": 99, "status": "DEAD"},  # never sent
        {"id": True, "status": "DEAD"},  # not an id
        "not an object",
    )
    got = results_from_answer(6, 200, body, None)
    assert [r.outcome for r in got] == [
        Outcome.SUCCESS,
        Outcome.DEAD,
        Outcome.DROP,
        Outcome.RETRY,
        Outcome.RETRY,
        Outcome.RETRY,
    ]
    assert (got[1].error_class, got[1].error_message, got[1].error_name) == (
        "http_200",
        "bad order",
        "OrderInvalid",
    )
    assert got[3].error_message == "handler answered status=RETRY"
    assert got[4].error_class == BAD_STATUS_CLASS
    assert got[5].error_class == MISSING_CLASS


@pytest.mark.parametrize(
    "body", [b"", b"not json", b"[]", b'{"results": {}}', b'{"other": []}', b"\xff\xfe"]
)
def test_malformed_answers_retry_every_record(body: bytes) -> None:
    got = results_from_answer(3, 200, body, None)
    assert [(r.outcome, r.error_class) for r in got] == [(Outcome.RETRY, BAD_ANSWER_CLASS)] * 3


@pytest.mark.parametrize("status", [400, 404, 413, 429, 500, 503, 302])
def test_non_2xx_retries_every_record(status: int) -> None:
    got = results_from_answer(2, status, b"went wrong", "Overloaded")
    assert [(r.outcome, r.error_class) for r in got] == [(Outcome.RETRY, f"http_{status}")] * 2
    assert (got[0].error_message, got[0].error_name) == ("went wrong", "Overloaded")


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/bulk",
        "http://user:pw@127.0.0.1:1/bulk",
        "unix:///x",
        "http:///x",
        "http+unix:///x",
    ],
)
def test_only_plain_http_urls(url: str) -> None:
    with pytest.raises(ValueError):
        HttpBulkHandler(url, timeout_s=1, max_batch=10, max_connections=1)


def test_default_status_covers_the_records_not_named() -> None:
    body = json.dumps(
        {"results": [{"id": 1, "status": "DEAD", "error": "bad"}], "default_status": "SUCCESS"}
    ).encode()
    got = results_from_answer(3, 200, body, None)
    assert [r.outcome for r in got] == [Outcome.SUCCESS, Outcome.DEAD, Outcome.SUCCESS]
    everything = results_from_answer(2, 200, b'{"results": [], "default_status": "retry"}', None)
    assert [(r.outcome, r.error_class) for r in everything] == [(Outcome.RETRY, "http_200")] * 2


@pytest.mark.parametrize("default", ["LATER", 5, ["SUCCESS"]])
def test_unknown_default_status_retries_the_records_not_named(default: object) -> None:
    body = json.dumps(
        {"results": [{"id": 0, "status": "SUCCESS"}], "default_status": default}
    ).encode()
    got = results_from_answer(2, 200, body, None)
    assert [(r.outcome, r.error_class) for r in got] == [
        (Outcome.SUCCESS, None),
        (Outcome.RETRY, BAD_ANSWER_CLASS),
    ]


def test_a_single_record_answer_is_not_every_records_success() -> None:
    # A single-record service pointed at bulk mode by mistake: no "results", so a bad answer.
    got = results_from_answer(2, 200, b'{"status": "SUCCESS"}', None)
    assert [(r.outcome, r.error_class) for r in got] == [(Outcome.RETRY, BAD_ANSWER_CLASS)] * 2


# -- answers that once made the adapter raise (issue 31): each is a result, never an exception


@pytest.mark.parametrize("ident", ["²", "\u0661", "\uff11", "9" * 5000, "-1", " 1", "1.0", ""])
def test_an_id_that_is_not_ascii_digits_is_an_unknown_id(ident: str) -> None:
    body = _answer({"id": ident, "status": "SUCCESS"}, {"id": "1", "status": "DEAD"})
    got = results_from_answer(2, 200, body, None)
    assert [(r.outcome, r.error_class) for r in got] == [
        (Outcome.RETRY, MISSING_CLASS),
        (Outcome.DEAD, "http_200"),
    ]


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"results": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"results": [], "default_status": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
)
def test_a_deeply_nested_answer_is_a_bad_answer(body: bytes) -> None:
    got = results_from_answer(2, 200, body, None)
    assert [(r.outcome, r.error_class) for r in got] == [(Outcome.RETRY, BAD_ANSWER_CLASS)] * 2


def test_nested_status_words_are_named_without_their_contents() -> None:
    deep: object = "SUCCESS"
    for _ in range(900):  # parses; a repr of it recurses about as deep as the parse did
        deep = [deep]
    body = json.dumps({"results": [{"id": 0, "status": deep}], "default_status": deep})
    got = results_from_answer(2, 200, body.encode(), None)
    assert [(r.outcome, r.error_class) for r in got] == [
        (Outcome.RETRY, BAD_STATUS_CLASS),
        (Outcome.RETRY, BAD_ANSWER_CLASS),
    ]
    assert got[0].error_message == "unknown status <a JSON array> for this record"


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_entries = st.fixed_dictionaries(
    {},
    optional={
        "id": st.integers(-2, 4) | st.text(max_size=4) | _json_values,
        "status": st.sampled_from(["SUCCESS", "dead", "Drop", "RETRY", "x"]) | _json_values,
        "error": _json_values,
        "error_name": _json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(
    doc=st.fixed_dictionaries(
        {"results": st.lists(_entries | _json_values, max_size=6)},
        optional={"default_status": _json_values | st.just("SUCCESS")},
    )
    | _json_values,
    status=st.sampled_from([200, 204, 299, 400, 503]),
)
def test_no_answer_makes_the_reader_raise(doc: object, status: int) -> None:
    got = results_from_answer(3, status, json.dumps(doc).encode(), None)
    assert len(got) == 3 and all(isinstance(r.outcome, Outcome) for r in got)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=64))
def test_no_bytes_make_the_reader_raise(body: bytes) -> None:
    assert len(results_from_answer(2, 200, body, None)) == 2
