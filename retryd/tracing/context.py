"""W3C Trace Context in Kafka headers: strict parsing and the header rule, no OpenTelemetry.

A record's ``traceparent`` header is business data that anyone can write, so it is read
strictly (https://www.w3.org/TR/trace-context/): anything that is not exactly one well-formed
``traceparent`` is ignored (the call starts a new trace), never an error. Header names are
matched ignoring case; values are bytes or text of any size and are bounded before parsing.

A routed copy's trace headers are *replaced, never appended* (``replace_trace_headers``), like
retryd's own headers: every copy carries exactly one ``traceparent``, however many hops it
made.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# W3C: a vendor should propagate at least 512 characters of tracestate; retryd keeps at most
# that, so a hostile value cannot grow a copy.
TRACESTATE_MAX = 512
# A future version may append fields after the four of version 00: bounded all the same.
TRACEPARENT_MAX = 256

_VERSION_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_FUTURE = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S)
_TRACESTATE = re.compile(r"[\x20-\x7e]*")
# W3C tracestate list members: key=value, simple or multi-tenant keys, at most 32 members.
_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
TRACESTATE_MEMBERS = 32

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A parsed ``traceparent``: ids as integers, ``flags`` the trace-flags byte."""

    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 0x01)

    def header(self) -> str:
        return format_traceparent(self.trace_id, self.span_id, self.flags)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """The version-00 ``traceparent`` for these ids."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"


def _text(value: object, limit: int) -> str | None:
    """``value`` as text when it is short ASCII bytes or text; None otherwise."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if len(raw) > limit or not raw.isascii():
            return None
        return raw.decode("ascii")
    if isinstance(value, str):
        if len(value) > limit or not value.isascii():
            return None
        return value
    return None


def parse_traceparent(value: object) -> TraceParent | None:
    """A valid ``traceparent`` (bytes or text), or None for anything else: wrong length or
    case, all-zero ids, version ``ff``, a version-00 value with trailing data. Never raises."""
    text = _text(value, TRACEPARENT_MAX)
    if text is None:
        return None
    text = text.strip(" \t")
    match = _VERSION_00.fullmatch(text)
    if match is None:
        future = _FUTURE.fullmatch(text)
        if future is None or future.group(1) in ("00", "ff"):
            return None  # version 00 must be exact; ff is forbidden
        trace_hex, span_hex, flags_hex = future.group(2, 3, 4)
    else:
        trace_hex, span_hex, flags_hex = match.group(1, 2, 3)
    trace_id = int(trace_hex, 16)
    span_id = int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceParent(trace_id, span_id, int(flags_hex, 16))


def parse_tracestate(value: object) -> str | None:
    """A ``tracestate`` value kept as-is when it is a valid W3C list (``key=value`` members,
    at most 32, no key twice) of at most ``TRACESTATE_MAX`` printable ASCII characters; None
    otherwise (the whole value is dropped, as W3C asks)."""
    text = _text(value, TRACESTATE_MAX)
    if text is None or not _TRACESTATE.fullmatch(text):
        return None
    keys: set[str] = set()
    for raw in text.split(","):
        member = raw.strip(" \t")
        if not member:
            continue  # empty members are allowed
        if not _MEMBER.fullmatch(member):
            return None
        key = member.partition("=")[0]
        if key in keys:
            return None
        keys.add(key)
    if not keys or len(keys) > TRACESTATE_MEMBERS:
        return None
    return text.strip(" \t")


def _is(name: object, wanted: str) -> bool:
    return isinstance(name, str) and len(name) == len(wanted) and name.lower() == wanted


def trace_headers(
    headers: Iterable[tuple[Any, Any]] | None,
) -> tuple[TraceParent | None, str | None]:
    """The record's trace context: its ``traceparent`` when there is exactly one and it is
    valid (several are ambiguous: ignored, as W3C asks of HTTP), and its ``tracestate`` when
    there is exactly one, it is valid and the ``traceparent`` is. Never raises."""
    parents: list[object] = []
    states: list[object] = []
    try:
        for item in headers or ():
            name, value = item
            if _is(name, TRACEPARENT):
                parents.append(value)
            elif _is(name, TRACESTATE):
                states.append(value)
    except (TypeError, ValueError):
        return None, None
    if len(parents) != 1:
        return None, None
    parent = parse_traceparent(parents[0])
    if parent is None:
        return None, None
    state = parse_tracestate(states[0]) if len(states) == 1 else None
    return parent, state


def replace_trace_headers(
    headers: Headers, traceparent: bytes, tracestate: bytes | None
) -> Headers:
    """``headers`` without any ``traceparent``/``tracestate`` (any case), then the given ones:
    exactly one ``traceparent`` on the result, whatever ``headers`` held."""
    out: Headers = [
        (name, value)
        for name, value in headers
        if not (_is(name, TRACEPARENT) or _is(name, TRACESTATE))
    ]
    out.append((TRACEPARENT, traceparent))
    if tracestate:
        out.append((TRACESTATE, tracestate))
    return out


@dataclass(frozen=True, slots=True)
class AttemptTrace:
    """What a traced handler call leaves on its ``Message`` (``Message._trace``): its span
    (an OpenTelemetry span, opaque here) and the trace headers its routed copy and its HTTP
    request carry."""

    span: Any
    traceparent: str
    tracestate: str | None
