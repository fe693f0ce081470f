"""How a dead letter's bytes are shown on a page (pure logic).

A value is shown as pretty-printed JSON when it is JSON, as text when it is UTF-8, and as a
hex dump otherwise, cut at a bound (the full size is always shown). Text that reaches a page
has its invisible and direction-changing characters (U+202E and friends, zero-width ones,
controls) replaced by visible ``\\u202e`` escapes, so a key or header cannot disguise itself
or reorder what is around it; HTML escaping is the templates' (autoescape) job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from retryd.policy import headers as h
from retryd.policy.fingerprint import fingerprint
from retryd.policy.timespec import format_instant
from retryd.replay.records import fingerprint_of

PAYLOAD_MAX = 64 * 1024  # bytes of a value shown on the record page
HEADER_MAX = 4096  # bytes of one header value shown
CELL_MAX = 200  # characters of a value in a table cell
JSON_PARSE_MAX = 1024 * 1024  # larger values are not parsed as JSON (shown as text)
HEX_WIDTH = 16

# Bidirectional controls, zero-width characters and the BOM: invisible, or able to reorder
# the text around them.
_INVISIBLE = frozenset(
    {0x061C, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0xFEFF}
    | set(range(0x202A, 0x202F))
    | set(range(0x2066, 0x206A))
)


def neutralise(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control, bidi or zero-width character written as ``\\uXXXX``
    (newlines and tabs kept when ``keep_newlines``), lone surrogates included."""
    out: list[str] = []
    for c in text:
        code = ord(c)
        if keep_newlines and c in "\n\t":
            out.append(c)
        elif code < 0x20 or 0x7F <= code < 0xA0 or code in _INVISIBLE or 0xD800 <= code < 0xE000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(c)
    return "".join(out)


@dataclass(frozen=True)
class Preview:
    """A value as a page shows it: ``kind`` is json, text, hex or none (no value)."""

    kind: str
    text: str
    size: int
    truncated: bool


def hex_dump(data: bytes) -> str:
    """``00000000  de ad be ef ...  |....|``: offset, bytes, printable ASCII."""
    lines = []
    for at in range(0, len(data), HEX_WIDTH):
        chunk = data[at : at + HEX_WIDTH]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        shown = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{at:08x}  {hexes:<{HEX_WIDTH * 3 - 1}}  |{shown}|")
    return "\n".join(lines)


def _pretty_json(text: str) -> str | None:
    stripped = text.lstrip()
    if not stripped or stripped[0] not in "{[":
        return None  # a bare string or number reads the same as text
    try:
        parsed: Any = json.loads(text)
    except (ValueError, RecursionError):
        return None
    try:
        return json.dumps(parsed, indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return None


def preview(data: bytes | None, limit: int = PAYLOAD_MAX) -> Preview:
    """The page's view of ``data``: at most ``limit`` bytes of hex, or ``limit`` characters
    of text or pretty JSON (neutralised, newlines kept)."""
    if data is None:
        return Preview("none", "", 0, False)
    size = len(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Preview("hex", hex_dump(data[:limit]), size, size > limit)
    kind = "text"
    if size <= JSON_PARSE_MAX:
        pretty = _pretty_json(text)
        if pretty is not None:
            kind, text = "json", pretty
    cut = len(text) > limit
    return Preview(kind, neutralise(text[:limit], keep_newlines=True), size, cut)


def cell(data: bytes | None, limit: int = CELL_MAX) -> str:
    """A short one-line view of a key or value for a table cell (hex when not UTF-8)."""
    if data is None:
        return "(null)"
    head = data[: limit * 4]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(head) - 3 and len(data) > len(head):
            text = head[: exc.start].decode("utf-8")  # cut inside a character: fine
        else:
            return hex_cell(data, limit)
    shown = neutralise(text[:limit])
    return shown + ("…" if len(text) > limit or len(data) > len(head) else "")


def hex_cell(data: bytes, limit: int = CELL_MAX, *, more: bool = False) -> str:
    """Bytes as ``0x`` hex for a table cell: ``limit // 2`` bytes shown, ``…`` when there is
    more (``more``: more than ``data`` holds)."""
    shown = limit // 2
    return "0x" + data[:shown].hex() + ("…" if more or len(data) > shown else "")


def short(text: str | None, limit: int = CELL_MAX) -> str:
    """A neutralised, cut piece of text for a table cell."""
    if text is None:
        return ""
    return neutralise(text[:limit]) + ("…" if len(text) > limit else "")


@dataclass(frozen=True)
class HeaderRow:
    name: str
    value: str
    kind: str  # text, hex or none
    size: int
    truncated: bool


def header_rows(headers: list[tuple[str, bytes | None]]) -> list[HeaderRow]:
    """Every header as sent, in order: text when UTF-8, else hex; cut at ``HEADER_MAX``."""
    rows = []
    for name, value in h.clean_headers(headers):
        if value is None:
            rows.append(HeaderRow(short(name, 256), "(null)", "none", 0, False))
            continue
        try:
            text = value.decode("utf-8")
            rows.append(
                HeaderRow(
                    short(name, 256),
                    neutralise(text[:HEADER_MAX]),
                    "text",
                    len(value),
                    len(text) > HEADER_MAX,
                )
            )
        except UnicodeDecodeError:
            rows.append(
                HeaderRow(
                    short(name, 256),
                    value[:HEADER_MAX].hex(" "),
                    "hex",
                    len(value),
                    len(value) > HEADER_MAX,
                )
            )
    return rows


def instant(epoch_ms: object) -> str:
    """An epoch-ms header as ISO-8601 UTC (with the number), or '' when absent or absurd."""
    if not isinstance(epoch_ms, int) or isinstance(epoch_ms, bool):
        return ""
    try:
        return f"{format_instant(epoch_ms)} ({epoch_ms})"
    except (ValueError, OverflowError, OSError):
        return str(epoch_ms)


def record_fingerprint(envelope: dict[str, str | int | None]) -> tuple[str, str]:
    """``(id, template)`` of a dead letter's error: what the overview groups by (the id is
    the one ``RecordFilter.fingerprint`` matches)."""
    msg = envelope.get(h.ERROR_MESSAGE)
    return fingerprint_of(envelope), fingerprint(msg if isinstance(msg, str) else None)


def decoded(envelope: dict[str, str | int | None]) -> list[tuple[str, str]]:
    """retryd's headers in words: ``(label, value)`` for the record page."""

    def text(name: str) -> str:
        value = envelope.get(name)
        return short(value, 1024) if isinstance(value, str) else ""

    def number(name: str) -> str:
        value = envelope.get(name)
        return str(value) if isinstance(value, int) else ""

    coords = ""
    if envelope.get(h.ORIGINAL_TOPIC) is not None:
        coords = (
            f"{text(h.ORIGINAL_TOPIC)} / partition {number(h.ORIGINAL_PARTITION) or '?'} / "
            f"offset {number(h.ORIGINAL_OFFSET) or '?'}"
        )
    fp_id, template = record_fingerprint(envelope)
    has_error = envelope.get(h.ERROR_CLASS) is not None or envelope.get(h.ERROR_MESSAGE) is not None
    rows = [
        ("Dead reason", text(h.DEAD_REASON)),
        ("Retry number", number(h.RETRY_NUMBER)),
        ("Due time", instant(envelope.get(h.RETRY_TIMESTAMP))),
        ("Original coordinates", coords),
        ("Original timestamp", instant(envelope.get(h.ORIGINAL_TIMESTAMP))),
        ("First failure", instant(envelope.get(h.FIRST_FAILURE_TIMESTAMP))),
        ("Error class", text(h.ERROR_CLASS)),
        ("Error message", text(h.ERROR_MESSAGE)),
        ("Error fingerprint", f"{fp_id} {short(template, 300)}" if has_error else ""),
        ("Error route", text(h.ROUTE)),
        ("Group", text(h.GROUP)),
    ]
    return [(label, value) for label, value in rows if value]
