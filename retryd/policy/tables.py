"""Settings that are tables (name -> value), read the same way from every source.

TOML gives a table; an environment variable gives a JSON object, or ``name=value`` pairs
separated by ``;`` (values may hold commas, e.g. an error route's ``1m,5m``). Used by
``error_routes`` and ``foreign_dead_letters``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def table_from_value(value: Any, *, name: str, value_name: str) -> Mapping[Any, Any]:
    """``value`` as a mapping (empty for None or blank text), not yet validated entry by
    entry. Raises ValueError naming what could not be read, in terms of
    ``name -> value_name``."""
    if value is None:
        return {}
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"not a JSON object of {name} -> {value_name}: {exc}") from exc
        else:
            value = pairs(text, name=name, value_name=value_name)
    if not isinstance(value, Mapping):
        raise ValueError(
            f"must be a table of {name} -> {value_name} (TOML), a JSON object, or "
            f"'{name}={value_name}; {name}={value_name}'"
        )
    return value


def pairs(text: str, *, name: str, value_name: str) -> dict[str, str]:
    """``a=x; b=y`` as ``{"a": "x", "b": "y"}``; a name given twice is an error."""
    out: dict[str, str] = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"{item.strip()[:80]!r}: expected {name}={value_name}")
        if key in out:
            raise ValueError(f"{name} {key[:80]!r} given twice")
        out[key] = val.strip()
    return out
