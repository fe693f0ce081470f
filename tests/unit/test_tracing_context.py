"""W3C traceparent parsing and the trace-header rule (retryd.tracing.context), and which
environments switch tracing on (retryd.tracing.setup.tracing_wanted). Pure: no SDK."""

from __future__ import annotations

from typing import Any

import pytest

from retryd.tracing import NO_TRACING, tracing_from_env
from retryd.tracing.context import (
    TRACESTATE_MAX,
    TraceParent,
    format_traceparent,
    parse_traceparent,
    parse_tracestate,
    replace_trace_headers,
    trace_headers,
)
from retryd.tracing.setup import tracing_wanted

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN = 0x00F067AA0BA902B7


def test_a_valid_traceparent_parses_from_bytes_or_text() -> None:
    want = TraceParent(TRACE, SPAN, 1)
    assert parse_traceparent(VALID) == want
    assert parse_traceparent(VALID.encode()) == want
    assert parse_traceparent(f" {VALID}\t") == want  # optional whitespace around it
    assert want.sampled and want.header() == VALID
    assert format_traceparent(TRACE, SPAN, 0) == VALID[:-2] + "00"


def test_a_future_version_keeps_its_first_four_fields() -> None:
    assert parse_traceparent("cc-" + VALID[3:] + "-what-ever") == TraceParent(TRACE, SPAN, 1)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        b"",
        "garbage",
        VALID.upper(),  # W3C: lowercase hex only
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        VALID + "-extra",  # version 00 has exactly four fields
        VALID[:-1],  # short
        VALID.replace("-", "_"),
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",  # not hex
        VALID.encode("utf-16"),
        b"\xff\xfe" + VALID.encode(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
        "\u0660\u0660-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # Unicode digits
        "cc-" + VALID[3:] + "-" + "x" * 10_000,  # bounded
        b"0" * 1_000_000,
        12345,
        ["00", "..."],
    ],
)
def test_hostile_or_garbled_traceparents_are_ignored(value: Any) -> None:
    assert parse_traceparent(value) is None


def test_tracestate_is_kept_only_when_a_short_valid_w3c_list() -> None:
    assert parse_tracestate(b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7") == (
        "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    )
    assert parse_tracestate("t@vendor=x , ,b=2") == "t@vendor=x , ,b=2"  # empty members: fine
    many = ",".join(f"k{i}=v" for i in range(33))
    for bad in (
        "a=" + "b" * TRACESTATE_MAX,  # too long
        "a=1\nb=2",
        "é=1",
        "A=1",  # keys are lowercase
        "a=1,a=2",  # a key twice
        "a=",  # no value
        "a=1,junk",
        "a=x=y,b==",
        many,  # over 32 members
        "  ",
        None,
        b"\xff=1",
    ):
        assert parse_tracestate(bad) is None, bad


def test_exactly_one_valid_traceparent_is_the_records_context() -> None:
    one = [("k", b"v"), ("traceparent", VALID.encode()), ("tracestate", b"a=1")]
    assert trace_headers(one) == (TraceParent(TRACE, SPAN, 1), "a=1")
    assert trace_headers([("TraceParent", VALID.encode())])[0] is not None  # any case
    # two (even two equal ones) are ambiguous; a broken one is no context; tracestate alone
    # or without a valid traceparent is nothing
    two = [("traceparent", VALID.encode()), ("Traceparent", VALID.encode())]
    assert trace_headers(two) == (None, None)
    assert trace_headers([("traceparent", b"junk"), ("tracestate", b"a=1")]) == (None, None)
    assert trace_headers([("traceparent", None)]) == (None, None)
    assert trace_headers([("tracestate", b"a=1")]) == (None, None)
    assert trace_headers(None) == (None, None)
    # two tracestates: the traceparent holds, the state is dropped
    states = [("traceparent", VALID.encode()), ("tracestate", b"a=1"), ("tracestate", b"b=2")]
    assert trace_headers(states) == (TraceParent(TRACE, SPAN, 1), None)


@pytest.mark.parametrize(
    "headers",
    [
        [("x", b"1"), ("y",)],  # not a pair
        [object()],
        [(None, b"v"), (b"traceparent", VALID.encode())],  # names that are not text
        "not headers",
        42,
    ],
)
def test_headers_of_any_shape_never_raise(headers: Any) -> None:
    assert trace_headers(headers) == (None, None)


def test_replacing_leaves_exactly_one_traceparent_and_keeps_the_rest_in_order() -> None:
    headers: list[tuple[str, bytes | None]] = [
        ("a", b"1"),
        ("traceparent", b"old"),
        ("TRACEPARENT", b"older"),
        ("b", None),
        ("tracestate", b"x=1"),
        ("traceparentx", b"not one"),
    ]
    out = replace_trace_headers(headers, VALID.encode(), b"s=2")
    assert out == [
        ("a", b"1"),
        ("b", None),
        ("traceparentx", b"not one"),
        ("traceparent", VALID.encode()),
        ("tracestate", b"s=2"),
    ]
    assert replace_trace_headers(out, VALID.encode(), None)[-1] == ("traceparent", VALID.encode())
    assert len(replace_trace_headers(out, VALID.encode(), None)) == 4


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, ["console", "otlp"]),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, []),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, []),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, []),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, []),
    ],
)
def test_which_environments_switch_tracing_on(env: dict[str, str], wanted: list[str]) -> None:
    assert tracing_wanted(env) == wanted


def test_tracing_off_is_the_no_op_collaborator() -> None:
    tracing = tracing_from_env({})
    assert tracing is NO_TRACING and not tracing.enabled
    headers: list[tuple[str, bytes | None]] = [("traceparent", b"x"), ("traceparent", b"y")]
    assert tracing.replay_headers(headers, "orders") is headers
    handler = object()
    assert tracing.wrap(handler, "g") is handler  # type: ignore[arg-type]
    tracing.shutdown()


def test_tracing_on_from_the_environment_names_the_service() -> None:
    tracing = tracing_from_env({"OTEL_TRACES_EXPORTER": "console"}, install_global=False)
    try:
        assert tracing.enabled
        resource = tracing._provider.resource  # type: ignore[attr-defined]
        assert resource.attributes["service.name"] == "retryd"
    finally:
        tracing.shutdown()
