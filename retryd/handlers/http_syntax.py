"""HTTP/1.1 answer syntax as h11 (0.16) reads it, restated for the lean client's framing
(``retryd.handlers.http_framing``): the regexes of h11/_abnf.py, its header-line decoding
(obsolete line folding joined) and its Content-Length and Transfer-Encoding rules. Kept apart
from the framing state machine so that each stays readable; the oracle test
(``tests/unit/test_http_framing_oracle.py``) holds the two to h11 on generated streams.
"""

from __future__ import annotations

import re

from retryd.errors import RetrydError

__all__ = [
    "BLANK_RE",
    "CHUNK_LINE_RE",
    "FAST_HEAD_RE",
    "FRAMING_FIELDS_RE",
    "STATUS_RE",
    "HttpFramingError",
    "check_fields",
    "content_length",
    "framing_fields",
    "header_fields",
    "split_lines",
]


class HttpFramingError(RetrydError):
    """The bytes a server sent are not an HTTP/1.1 answer this client can trust (malformed,
    too large, or cut short): the call fails, retryably, and its connection is closed."""


# A field value (h11: ``OWS [field-content] OWS``, where field-content's characters are any byte
# but NUL and whitespace, with spaces and tabs between them) is, as a language, any run of
# bytes but NUL, CR, LF, VT and FF; the same for a reason phrase. Surrounding spaces and tabs
# are not part of the value.
_TEXT = rb"[^\x00\n\r\x0b\x0c]*+"
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]++"
_STATUS = rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: " + _TEXT + rb")?+"
STATUS_RE = re.compile(_STATUS)
FIELD_RE = re.compile(_TOKEN + rb":" + _TEXT)
# The common head in one pass: CRLF line ends, no folding. Anything else takes the line-by-line
# path, which reads such a head the same way (the fast match is an optimisation only).
FAST_HEAD_RE = re.compile(_STATUS + rb"\r\n((?:" + _TOKEN + rb":" + _TEXT + rb"\r\n)*+)\r\n")
# In a head of lines ``name:value`` each after a LF (as FAST_HEAD_RE checked, or as
# ``framing_fields`` joins them): the fields framing and the handler read, (name, value with
# the spaces around it); names in any letter case, as h11 folds them.
FRAMING_FIELDS_RE = re.compile(
    rb"\n(content-type|content-length|transfer-encoding|connection|x-retryd-error):([^\r\n]*)",
    re.IGNORECASE,
)
FOLD_RE = re.compile(rb"[ \t]+")
BLANK_RE = re.compile(rb"\n\r?\n")
CHUNK_LINE_RE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*\r\n")
DIGITS_RE = re.compile(rb"[0-9]+")


def header_fields(lines: list[bytes]) -> list[bytes]:
    """Header lines (ends stripped), folded lines joined and every line checked, as h11's
    ``_decode_header_lines`` does: each is ``name:value`` with a token for name."""
    folded: list[bytes] = []
    for line in lines:
        match = FOLD_RE.match(line)
        if match:
            if not folded:
                raise HttpFramingError("continuation line at start of headers")
            folded[-1] += b" " + line[match.end() :]
        else:
            folded.append(line)
    for line in folded:
        if FIELD_RE.fullmatch(line) is None:
            raise HttpFramingError(f"illegal header line: {line[:80]!r}")
    return folded


def split_lines(section: bytes) -> list[bytes]:
    """The lines of a head or trailer section ending in a blank line, without their ends."""
    lines = section.split(b"\n")
    lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    del lines[-2:]  # the blank line
    return lines


def content_length(value: bytes, seen: bytes | None) -> bytes:
    """One Content-Length value checked (a list of equal lengths is that length, as h11 reads
    it), and against the one ``seen`` before in the same head."""
    lengths = {length.strip() for length in value.split(b",")}
    if len(lengths) != 1:
        raise HttpFramingError("conflicting Content-Length headers")
    value = lengths.pop()
    if len(value) > 20 or not DIGITS_RE.fullmatch(value):
        raise HttpFramingError(f"bad Content-Length: {value[:40]!r}")
    if seen is not None and seen != value:
        raise HttpFramingError("conflicting Content-Length headers")
    return value


def framing_fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """``FRAMING_FIELDS_RE``'s pairs from checked header lines (``header_fields``)."""
    return FRAMING_FIELDS_RE.findall(b"\n" + b"\n".join(lines))


def check_fields(fields: list[tuple[bytes, bytes]]) -> None:
    """The Content-Length and Transfer-Encoding rules, for a head or trailers whose framing
    is not used (an interim answer's, a trailer section): h11 refuses the same."""
    seen: bytes | None = None
    chunked = False
    for name, value in fields:
        if len(name) == 14 and name[0] in b"cC":
            seen = content_length(value.strip(b" \t"), seen)
        elif len(name) == 17:
            if chunked or value.strip(b" \t").lower() != b"chunked":
                raise HttpFramingError("a Transfer-Encoding other than one chunked")
            chunked = True
