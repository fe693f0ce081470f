"""Error fingerprints: one row per failure mode, however many distinct messages it has.

``retryd_error_message`` carries whatever the handler raised: ``order 81723 not found``,
``timeout after 30.2s calling 10.0.3.7:8080``, ``duplicate key 'a9f3...'``. Grouping by the
raw text gives a row per order id. ``fingerprint`` replaces the variable parts with
placeholders so messages that differ only in them get the same template, and ``fingerprint_id``
gives the template a short stable name (the same in every report, on every machine).

What is replaced, in this order (earlier rules win, so a UUID is not read as numbers):

======================  ==============================================  ===========
part                    example                                         becomes
======================  ==============================================  ===========
quoted text             ``'abc'``, ``"x y"``, ```col```                 ``<str>``
UUID                    ``123e4567-e89b-12d3-a456-426614174000``        ``<uuid>``
date / time             ``2024-05-01T10:00:00Z``, ``2024-05-01 10:00``  ``<time>``
hex                     ``0x7f3a``, ``deadbeef42`` (8+ hex digits)      ``<hex>``
number (unit kept)      ``42``, ``-3.5``, ``10.0.3.7:8080``, ``30s``    ``<num>``, ``<num>s``
id (letters + digits)   ``a1b2c3``, ``ORD9F8A``                         ``<id>``
word ending in digits   ``order42``, ``sha256``                         ``order<num>``
======================  ==============================================  ===========

Runs of one placeholder separated only by spaces, commas, semicolons or bars collapse into
one (``[1, 2, 3]`` and ``[4]`` are the same list), whitespace is normalised, and the result
is cut at 300 characters.
Pure functions: the report applies them to each distinct message once.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

MAX_FINGERPRINT_CHARS = 300
# How many distinct messages one process keeps fingerprints of: bounded memory.
_CACHE_SIZE = 65_536

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b"
)
_TIME = re.compile(
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"
)
_HEX = re.compile(
    r"\b0[xX][0-9a-fA-F]+\b"  # 0x7f3a
    r"|\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"  # digits and a-f, 8+
)
# A number may carry a unit (30s, 512MB, 75%): the unit stays, the number goes.
_NUMBER = re.compile(
    r"(?<![A-Za-z0-9_])[-+]?\d+(?:[.,:/]\d+)*(?:[eE][-+]?\d+)?(?=[A-Za-z]*(?![A-Za-z0-9_]))",
    re.ASCII,
)
_TOKEN = re.compile(r"[A-Za-z0-9_]*\d[A-Za-z0-9_]*", re.ASCII)
_WORD_THEN_DIGITS = re.compile(r"([A-Za-z_]+)\d+", re.ASCII)
_PLACEHOLDER = r"<(?:str|uuid|time|hex|num|id)>"
_RUN = re.compile(rf"({_PLACEHOLDER})(?:[\s,;|]+\1)+")
_SPACES = re.compile(r"\s+")


def _token(match: re.Match[str]) -> str:
    token = match.group(0)
    word = _WORD_THEN_DIGITS.fullmatch(token)
    if word is not None:
        return f"{word.group(1)}<num>"
    return "<id>"


@lru_cache(maxsize=_CACHE_SIZE)
def fingerprint(message: str | None) -> str:
    """The message with its variable parts replaced (see the module docstring)."""
    if message is None:
        return ""
    text = _QUOTED.sub("<str>", message)
    text = _UUID.sub("<uuid>", text)
    text = _TIME.sub("<time>", text)
    text = _HEX.sub("<hex>", text)
    text = _NUMBER.sub("<num>", text)
    text = _TOKEN.sub(_token, text)
    text = _RUN.sub(lambda m: m.group(1), text)
    text = _SPACES.sub(" ", text).strip()
    return text[:MAX_FINGERPRINT_CHARS]


def fingerprint_id(error_class: str | None, template: str) -> str:
    """Short stable id of (error class, template): 12 hex digits of its SHA-256."""
    digest = hashlib.sha256(f"{error_class or ''}\x00{template}".encode()).hexdigest()
    return digest[:12]
