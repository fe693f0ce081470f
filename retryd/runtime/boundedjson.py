"""Reading the small JSON files other processes leave in the shared state dir (circuit orders,
worker heartbeats) as untrusted input.

A reader takes at most ``max_bytes`` of a regular file (``read_regular``: opening never waits,
a bigger file is refused unread) and parses it with bounded nesting and bounded numbers
(``loads``), so nothing in a file can raise anything but ``Refused``, recurse deeply, convert a
huge number or allocate much. ``Refusals`` remembers the file state last refused per file, so
a file that stays bad is logged once, not at every read.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from collections.abc import Hashable
from itertools import accumulate
from pathlib import Path
from typing import Any

MAX_DIGITS = 19  # of any integer: int() of a long literal costs, of a huge one fails
FLOAT_CHARS = 40  # of any other number (a double's repr is at most 24 characters)


class Refused(ValueError):
    """The file or its content is not usable (the message says why, never what it holds)."""


# --- parsing ------------------------------------------------------------------------------------

# a complete JSON string, escapes included ("unrolled": no backtracking between alternatives)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
# the escape of a UTF-16 surrogate: the only way a lone one gets into strictly decoded UTF-8
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def too_deep(text: str, limit: int) -> bool:
    """Whether brackets outside strings nest deeper than ``limit``. On any prefix of ``text``
    that is valid JSON the running depth is exactly the depth ``json.loads`` recurses to (it
    stops at the first invalid character, and after the first complete value), so checking
    this first bounds the parser's recursion. Linear, at C speed (no loop over characters in
    Python): a megabyte of brackets costs milliseconds."""
    if text.count("[") + text.count("{") <= limit:
        return False  # (cannot be deeper: the common case, without the scan)
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if brackets.count("[") + brackets.count("{") <= limit:
        return False
    return max(accumulate(map(_STEP.__getitem__, brackets))) > limit


def _int_parser(max_digits: int) -> Any:
    def parse(literal: str) -> int:
        if len(literal.lstrip("-")) > max_digits:
            raise Refused(f"holds a number of more than {max_digits} digits")
        return int(literal)

    return parse


def _float(literal: str) -> float:
    if len(literal) > FLOAT_CHARS:
        raise Refused(f"holds a number written with more than {FLOAT_CHARS} characters")
    return float(literal)  # 1e999 is inf here: callers that take floats check them


def _no_constant(name: str) -> object:
    raise Refused(f"holds {name}")


def _lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_lone_surrogate(k) or _lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_lone_surrogate(v) for v in value)
    return False


def loads(
    data: bytes,
    *,
    max_bytes: int,
    max_depth: int,
    max_digits: int = MAX_DIGITS,
    unicode_only: bool = False,
) -> object:
    """The JSON document in ``data``. Raises ``Refused`` and nothing else: the size, the
    nesting and every number's length are bounded before or while ``json.loads`` runs.
    ``unicode_only``: refuse a document with a string holding a lone UTF-16 surrogate (JSON
    allows ``"\\ud800"``; such a string cannot be written out as UTF-8, in an HTTP answer or
    a log line)."""
    if len(data) > max_bytes:
        raise Refused(f"is more than {max_bytes} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("is not UTF-8") from None
    if too_deep(text, max_depth):
        raise Refused(f"nests deeper than {max_depth} levels")
    try:
        doc = json.loads(
            text,
            parse_int=_int_parser(max_digits),
            parse_float=_float,
            parse_constant=_no_constant,
        )
    except Refused:
        raise
    except (ValueError, RecursionError, OverflowError):
        raise Refused("is not JSON") from None
    # (the nesting is bounded: so is this walk's recursion; and it runs only when needed)
    if unicode_only and _SURROGATE_ESCAPE.search(text) and _lone_surrogate(doc):
        raise Refused("holds text that is not Unicode (a lone surrogate)")
    return doc


# --- reading ------------------------------------------------------------------------------------


def os_reason(exc: OSError) -> str:
    """An OS error as a log may show it: its kind, never the path or content involved."""
    return f"{type(exc).__name__}: {exc.strerror or 'error'}"


def read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def file_state(st: os.stat_result) -> Hashable:
    """What changes when a file is replaced or rewritten (a refusal is remembered for this)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_regular(
    path: Path,
    max_bytes: int,
    *,
    follow_symlinks: bool = True,
    refusals: Refusals | None = None,
) -> tuple[bytes | None, str | None, Hashable]:
    """(the file's bytes, None, its state), or (None, why it is refused, the state refused);
    (None, None, None) when there is no file. Reads at most ``max_bytes + 1`` bytes, of a
    regular file only: opening never waits (a FIFO put there would block a plain ``open`` for
    good). With ``refusals``, a file still in the state it was last refused in is refused
    again unread (as "unchanged"), so a hostile file costs an ``open`` and a ``stat`` per read
    after the first. Never raises."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:
        return None, f"cannot be opened ({os_reason(exc)})", ("open", exc.errno, _link(path))
    try:
        st = os.fstat(fd)
        state = file_state(st)
        if refusals is not None and refusals.still(str(path), state):
            return None, "is unchanged since it was refused", state
        if not stat.S_ISREG(st.st_mode):
            return None, "is not a regular file", state
        if st.st_size > max_bytes:
            return None, f"is {st.st_size} bytes, more than {max_bytes}", state
        data = read_at_most(fd, max_bytes + 1)
    except OSError as exc:
        return None, f"cannot be read ({os_reason(exc)})", ("read", exc.errno)
    finally:
        os.close(fd)
    return data, None, state


def _link(path: Path) -> Hashable:
    """The state of what is at ``path`` itself (a symlink that cannot be opened), or None."""
    try:
        return file_state(os.lstat(path))
    except OSError:
        return None


class Refusals:
    """The file state last refused per file, so that a file that stays bad is logged once,
    not at every read. Bounded: the oldest entry goes when ``limit`` files are remembered."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._last: dict[str, Hashable] = {}

    def first(self, path: str, state: Hashable) -> bool:
        """Record that ``path`` was refused in ``state``; whether that is news (to log)."""
        with self._lock:
            if path in self._last and self._last[path] == state:
                return False
            self._last.pop(path, None)
            if len(self._last) >= self.limit:
                del self._last[next(iter(self._last))]
            self._last[path] = state
            return True

    def still(self, path: str, state: Hashable) -> bool:
        """Whether ``path`` was last refused in this very ``state`` (``first``'s state must
        then be the file state alone)."""
        with self._lock:
            return path in self._last and self._last[path] == state

    def forget(self, path: str) -> None:
        with self._lock:
            self._last.pop(path, None)


__all__ = [
    "MAX_DIGITS",
    "Refusals",
    "Refused",
    "file_state",
    "loads",
    "os_reason",
    "read_at_most",
    "read_regular",
    "too_deep",
]
