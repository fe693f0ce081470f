"""Kafka headers as HTTP headers and back (the mapping is described in
``retryd.handlers.http_handler``'s docstring): shared by the single-record mode, which sends
them as HTTP headers, and bulk mode, which sends the same pairs inside its JSON."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

KAFKA_HEADER_PREFIX = "X-Kafka-"
HEADERS_B64 = "X-Retryd-Headers-B64"

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")


def _plain_text(value: bytes | None) -> str | None:
    if not value:
        return None if value is None else ""
    if not value.isascii():
        return None
    text = value.decode("ascii")
    if not text.isprintable() or text[0] == " " or text[-1] == " ":
        return None
    return text


def encode_kafka_headers(
    headers: Iterable[tuple[str, bytes | None]],
) -> list[tuple[str, str]]:
    """HTTP headers (``X-Kafka-*`` plus at most one ``X-Retryd-Headers-B64``) for Kafka headers."""
    headers = list(headers)
    if not headers:
        return []
    folded = Counter(name.lower() for name, _ in headers)
    exact = Counter(name for name, _ in headers)
    out: list[tuple[str, str]] = []
    packed: dict[str, Any] = {}
    for name, value in headers:
        text = _plain_text(value)
        if text is not None and folded[name.lower()] == 1 and _SAFE_NAME.fullmatch(name):
            out.append((KAFKA_HEADER_PREFIX + name, text))
            continue
        encoded = None if value is None else base64.b64encode(value).decode("ascii")
        if exact[name] > 1:
            packed.setdefault(name, []).append(encoded)
        else:
            packed[name] = encoded
    if packed:
        out.append((HEADERS_B64, json.dumps(packed, ensure_ascii=True, separators=(",", ":"))))
    return out


def decode_kafka_headers(http_headers: Mapping[str, str]) -> list[tuple[str, bytes | None]]:
    """Kafka headers back from a request's HTTP headers (for Python sidecars and tests).

    Names from ``X-Kafka-*`` come back in whatever case the HTTP layer delivered them.
    Raises ``ValueError`` on a malformed ``X-Retryd-Headers-B64``.
    """
    out: list[tuple[str, bytes | None]] = []
    packed_raw = None
    prefix = KAFKA_HEADER_PREFIX.lower()
    for name, value in http_headers.items():
        if name.lower().startswith(prefix):
            out.append((name[len(prefix) :], value.encode("ascii")))
        elif name.lower() == HEADERS_B64.lower():
            packed_raw = value
    if packed_raw is not None:
        try:
            packed = json.loads(packed_raw)
            if not isinstance(packed, dict):
                raise ValueError("not a JSON object")
            for name, encoded in packed.items():
                values = encoded if isinstance(encoded, list) else [encoded]
                for item in values:
                    out.append(
                        (name, None if item is None else base64.b64decode(item, validate=True))
                    )
        except (ValueError, TypeError, binascii.Error) as exc:
            raise ValueError(f"malformed {HEADERS_B64}: {exc}") from exc
    return out
