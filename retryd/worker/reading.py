"""Reading a consumed record's headers on the poll thread without trusting them.

The client decodes header *names* as UTF-8 when ``headers()`` is called, so a record whose
producer wrote a non-UTF-8 name raises there; values are bytes or None. Everything the poll
thread reads from a record goes through here, so what a record carries becomes a reason to
dead-letter it, never an exception in the loop.
"""

from __future__ import annotations

from typing import Any

Headers = list[tuple[str, bytes | None]]


def readable_headers(raw: Any) -> tuple[Headers | None, str | None]:
    """``(headers, None)``, or ``(None, problem)`` when the client cannot decode them. Names
    that are not text and values that are neither bytes nor None are left out (counted in the
    problem only when nothing else is wrong: they cannot be copied faithfully anyway)."""
    try:
        headers = raw.headers()
    except Exception as exc:  # UnicodeDecodeError for a non-UTF-8 name, or anything else
        return None, f"headers cannot be decoded: {type(exc).__name__}"
    if not headers:
        return headers, None
    clean: Headers = []
    for item in headers:
        try:
            name, value = item
        except (TypeError, ValueError):
            continue
        if isinstance(name, bytes):
            name = name.decode("utf-8", errors="replace")
        if not isinstance(name, str):
            continue
        if isinstance(value, str):
            value = value.encode("utf-8", errors="replace")
        if value is not None and not isinstance(value, bytes):
            continue
        clean.append((name, value))
    return clean, None
