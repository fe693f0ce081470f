"""Time options of the command line (``--since``/``--until``): ISO-8601 or relative to now.

One function, ``parse_instant``, so the pipeline's parser (``retryd.policy.timespec``, same
forms and signature) can replace it in one import. Forms:

- ISO-8601 date or date-time: ``2024-05-01``, ``2024-05-01T10:00``, ``2024-05-01T10:00:00Z``,
  ``2024-05-01T12:00:00+02:00``; without a UTC offset it is UTC (hosts in any time zone must
  mean the same instant);
- relative, "that long before now": ``90s``, ``30m``, ``2h``, ``7d``, ``1w``, ``1h30m``,
  optionally followed by ``ago``;
- ``now``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from retryd.errors import ConfigError

UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART_RE = re.compile(r"(\d+)\s*(ms|s|m|h|d|w)", re.ASCII)
_RELATIVE_RE = re.compile(r"^(?:\d+\s*(?:ms|s|m|h|d|w)\s*)+(?:ago)?$", re.ASCII)
# The shape of the accepted forms, for the HTTP API's schema (a value of this shape may still be
# refused: a 13th month, a time before 1970).
TIME_PATTERN = (
    r"^(now|([0-9]{1,9} ?(ms|s|m|h|d|w) ?)+(ago)?|"
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}(:[0-9]{2}(:[0-9]{2}([.][0-9]{1,6})?)?)?"
    r"(Z|[+-][0-9]{2}:?[0-9]{2})?)?)$"
)
FORMS = "ISO-8601 (2024-05-01, 2024-05-01T10:00:00Z) or relative (30m, 2h, 7d, 1h30m ago)"


def parse_instant(text: str, now_ms: int) -> int:
    """Epoch milliseconds (UTC) of ``text``; ``now_ms`` anchors relative forms. Raises
    ConfigError with one readable line."""
    cleaned = text.strip().lower()
    if not cleaned:
        raise ConfigError([f"empty time: expected {FORMS}"])
    if cleaned == "now":
        return now_ms
    if _RELATIVE_RE.match(cleaned):
        ago = sum(int(n) * UNIT_MS[unit] for n, unit in _PART_RE.findall(cleaned))
        if ago > now_ms:
            raise ConfigError([f"{text!r} reaches before 1970-01-01"])
        return now_ms - ago
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError([f"invalid time {text!r}: expected {FORMS}"]) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    at = (parsed - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    if at < 0:
        raise ConfigError([f"{text!r} is before 1970-01-01"])
    return at
