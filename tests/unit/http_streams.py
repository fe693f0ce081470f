"""What a server might send on one keep-alive connection, for the framing oracle
(``test_http_framing_oracle.py``): a few calls' answers (interim 1xx answers, Content-Length,
chunked and close-delimited bodies, trailers, ``Connection: close``, oversized heads and
trailers, garbage), each cut into the pieces a socket might deliver.

Written from a tape of bytes hypothesis draws in one go (one draw per example, not hundreds:
thousands of examples run in seconds) and shrinks towards zeros; a zero always picks the
first, plainest choice, so a shrunk failure is the plainest answer that still fails.
"""

from __future__ import annotations

import itertools
from typing import Any

from retryd.handlers.http_framing import MAX_HEAD_BYTES

TOKEN = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# value bytes: mostly plain, some h11 lets through (controls, obs-text), some it refuses
VALUE_BYTES = b"abc XYZ019 ,;=/\t\x01\x1f\x7f\x80\xff\x00\r\n\x0b\x0c"
GARBAGE = b"\x00\r\n \t:;\x0b\x0c\x7f\xffHTP/0123456789abcdefg,-"
# what marks call N's answer (garbage changes at most two bytes: never one into another)
MARKERS = [b"call-one", b"call-two", b"call-three", b"call-four"]
FILLER_NAMES = [b"Date", b"Server", b"Vary", b"X-Request-Id", b"Link", b"Cache-Control"]
FILLER_VALUES = [b"Mon, 01 Jan 2024 00:00:00 GMT", b"go", b"", b" padded\t", b"a  b"]


class Tape:
    """Choices read off hypothesis' bytes (zeros once they run out)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        at = self.at
        self.at += 1
        return self.data[at] if at < len(self.data) else 0

    def int(self, top: int) -> int:
        """0 ..= top."""
        value = self.byte() | self.byte() << 8 if top > 255 else self.byte()
        return value % (top + 1)

    def pick(self, options: list[Any]) -> Any:
        return options[self.int(len(options) - 1)]

    def rare(self, odds: int = 8) -> bool:
        """True about once in ``odds`` draws (never on a zero)."""
        return self.byte() % odds == odds - 1

    def pieces(self, alphabet: bytes, most: int) -> bytes:
        return bytes(self.pick(list(alphabet)) for _ in range(self.int(most)))


def fields(t: Tape, extra: list[tuple[bytes, bytes]]) -> list[bytes]:
    """Header lines (without ends): ``extra`` among filler fields, in any order, maybe folded."""
    pairs = list(extra)
    for _ in range(t.int(3)):
        name = t.pieces(TOKEN, 6) if t.rare() else t.pick(FILLER_NAMES)
        if t.rare(32):
            name = t.pieces(GARBAGE, 3)
        value = t.pieces(VALUE_BYTES, 8) if t.rare(12) else t.pick(FILLER_VALUES)
        pairs.insert(t.int(len(pairs)), (name, value))
    lines = [n + b":" + t.pick([b" ", b"", b"\t"]) + v for n, v in pairs]
    if t.rare(10):  # obsolete line folding
        lines.insert(t.int(len(lines)), t.pick([b" folded", b"\tmore", b"  "]))
    return lines


def head(t: Tape, status: bytes, extra: list[tuple[bytes, bytes]]) -> bytes:
    version = t.pick([b"1.0", b"2.0", b"0.9", b"1"]) if t.rare(10) else b"1.1"
    reason = b" \x80\t\x7f" if t.rare() else t.pick([b" OK", b" Whatever", b""])
    lines = [b"HTTP/" + version + b" " + status + reason, *fields(t, extra)]
    end = t.pick([b"\n", b"\r\r\n"]) if t.rare(12) else b"\r\n"
    return b"".join(line + end for line in lines) + end


def chunked(t: Tape, body: bytes) -> bytes:
    out = []
    rest = body
    while rest:
        size = 1 + t.int(len(rest) - 1)
        piece, rest = rest[:size], rest[size:]
        digits = t.pick([b"%x", b"%X", b"%03x"]) % size
        ext = t.pick([b";a=1", b"; x", b" ", b";\x01"]) if t.rare() else b""
        after = t.pick([b"", b"\r", b"\n", b"xx", b"\r\r\n"]) if t.rare(12) else b"\r\n"
        out.append(digits + ext + b"\r\n" + piece + after)
    out.append(b"0" + (b";last" if t.rare() else b"") + b"\r\n")
    trailer = fields(t, []) if t.rare(3) else []
    if t.rare(4):
        pad = t.pick([40, 150, 300, MAX_HEAD_BYTES - 300, MAX_HEAD_BYTES])
        trailer.append(b"X-Pad: " + b"t" * pad)
    end = b"\n" if t.rare(12) else b"\r\n"
    out.append(b"".join(line + end for line in trailer) + end)
    return b"".join(out)


def reply(t: Tape, call: int) -> tuple[bytes, bool]:
    """What the server sends in answer to call number ``call``, and whether it then closes."""
    out = []
    for _ in range(1 + t.int(2) if t.rare(3) else 0):  # interim answers
        status = t.pick([b"101", b"199", b"099", b"102"]) if t.rare(5) else t.pick([b"100", b"103"])
        odd = [(b"Content-Length", b"x")], [(b"Transfer-Encoding", b"gzip")]
        out.append(head(t, status, t.pick([*odd, [(b"Connection", b"close")]]) if t.rare() else []))
    statuses = [b"200", b"500", b"201", b"204", b"304", b"302", b"404", b"299"]
    status = t.pick(statuses)
    marker = MARKERS[call]
    body = t.pieces(bytes(range(256)), 30) if t.rare() else t.pick([marker, b"", b'{"a":1}'])
    body = body if body == marker else body.replace(b"call-", b"call_")  # one call's marker only
    framing = t.pick(["length", "chunked", "close"])
    extra: list[tuple[bytes, bytes]] = []
    if t.byte() & 1:
        extra.append((b"X-Retryd-Error", marker))
    if t.byte() & 1:
        extra.append((t.pick([b"Content-Type", b"content-type"]), b"application/json"))
    if t.rare(3):
        connection = t.pick([b"close", b"keep-alive", b"Keep-Alive, CLOSE", b" upgrade "])
        extra.append((b"Connection", connection))
    encoded = body
    if framing == "length":
        size = b"%d" % len(body)
        odd_lengths = [[size, size], [size + b", " + size], [b"+" + size], [size + b"0"]]
        odd_lengths += [[b"1", size], [b""], [b"9" * 21]]
        lengths = t.pick(odd_lengths) if t.rare(10) else [size]
        extra.extend((b"Content-Length", v) for v in lengths)
    elif framing == "chunked":
        odd_codings = [[b"Chunked"], [b"gzip, chunked"], [b"chunked", b"chunked"], [b"identity"]]
        codings = t.pick(odd_codings) if t.rare(10) else [b"chunked"]
        extra.extend((b"Transfer-Encoding", v) for v in codings)
        if t.rare():
            extra.append((b"Content-Length", b"%d" % len(body)))
        encoded = chunked(t, body)
    if t.rare(8):
        pad = t.pick([60, 200, MAX_HEAD_BYTES - 200, MAX_HEAD_BYTES + 1])
        extra.append((b"X-Pad", b"p" * pad))
    out.append(head(t, status, extra) + encoded)
    data = b"".join(out)
    if t.rare(16):  # bytes before the answer (a CRLF after the last body, say)
        data = t.pick([b"\r\n", b"\n", b" ", b"\x00", b"\r"]) + data
    for _ in range(1 + t.int(1) if t.rare(6) else 0):  # garbage: a byte replaced or inserted
        at = t.int(len(data))
        data = data[:at] + bytes([t.pick(list(GARBAGE))]) + data[at + t.int(1) :]
    if t.rare(10):  # the server stops in the middle
        data = data[: t.int(len(data))]
    if t.rare(10):  # bytes after the answer, nobody asked for
        data += t.pick([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b"x", b"\r\n"])
    eof = t.rare(4) or (framing == "close" and t.byte() & 1 == 1)
    return data, eof


Calls = list[tuple[list[bytes], bool]]


def connection(tape: bytes) -> tuple[Calls, int, int]:
    """A few calls' answers on one connection, each cut into pieces, and the client's two
    bounds."""
    t = Tape(tape)
    max_body = t.pick([64 * 1024] * 5 + [1, 5, 40])
    max_head = t.pick([MAX_HEAD_BYTES] * 5 + [400, 120])
    calls = []
    for call in range(1 + t.int(len(MARKERS) - 1)):
        data, eof = reply(t, call)
        cuts = sorted({t.int(len(data)) for _ in range(t.int(6))})
        bounds = [0, *cuts, len(data)]
        pieces = [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]
        calls.append((pieces, eof))
    return calls, max_body, max_head
