"""Turns a handler spec (``python:pkg.mod:func`` or an ``http(s)://`` URL) into a Handler.

With ``handler_batch`` > 0 the same specs give batch handlers: ``python:`` a
``PythonBatchHandler`` (``handle_batch(records) -> outcomes``), a URL the HTTP adapter's bulk
mode (one request carrying many records).

Everything that can be checked before the first message is checked here, so a bad
deployment fails at start-up with one readable line instead of dead-lettering traffic.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from yarl import URL

from retryd.errors import HandlerLoadError
from retryd.handlers.base import Handler
from retryd.handlers.http_handler import HttpHandler, redact_url
from retryd.handlers.python_batch import PythonBatchHandler
from retryd.handlers.python_handler import PythonHandler

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_PYTHON_SPEC = re.compile(
    rf"^python:(?P<module>{_IDENT}(?:\.{_IDENT})*):(?P<attr>{_IDENT}(?:\.{_IDENT})*)$"
)


def load_handler(
    spec: str,
    *,
    timeout_s: float,
    non_retryable: Sequence[str] = (),
    max_in_flight: int = 16,
    batch: int = 0,
) -> Handler:
    """Build the handler for ``spec``; raises ``HandlerLoadError`` if it cannot work.

    ``max_in_flight`` sizes the HTTP connection pool (one connection per call in flight).
    ``batch`` > 0 builds a batch handler of up to ``batch`` records per call (``handler_batch``).
    """
    if not timeout_s > 0:
        raise HandlerLoadError(f"handler timeout must be > 0 seconds, got {timeout_s!r}")
    if batch < 0:
        raise HandlerLoadError(f"handler batch must be >= 0, got {batch!r}")
    spec = spec.strip()
    if spec.startswith("python:"):
        func = _import_callable(spec)
        if batch:
            return PythonBatchHandler(
                func,
                timeout_s=timeout_s,
                max_batch=batch,
                non_retryable=non_retryable,
                name=spec.removeprefix("python:"),
            )
        return PythonHandler(
            func,
            timeout_s=timeout_s,
            non_retryable=non_retryable,
            name=spec.removeprefix("python:"),
        )
    if spec.lower().startswith(("http://", "https://")):
        if batch:
            return _http_bulk_handler(spec, timeout_s, max_in_flight, batch)
        return _http_handler(spec, timeout_s, max_in_flight)
    if spec.lower().startswith("http+unix://"):  # HTTP over a Unix socket (a pod's volume)
        if not urlsplit(spec).netloc:
            raise HandlerLoadError(
                f"bad handler URL {spec!r}: needs http+unix://<percent-encoded socket path>/path"
            )
        if batch:
            return _http_bulk_handler(spec, timeout_s, max_in_flight, batch)
        return HttpHandler(spec, timeout_s=timeout_s, max_connections=max_in_flight)
    shown = redact_url(spec) if "://" in spec else spec
    raise HandlerLoadError(
        f"unknown handler spec {shown!r}: expected 'python:package.module:function' "
        "or an http:// / https:// (or http+unix://) URL"
    )


def _import_callable(spec: str) -> Any:
    match = _PYTHON_SPEC.match(spec)
    if match is None:
        raise HandlerLoadError(
            f"bad python handler spec {spec!r}: expected 'python:package.module:function'"
        )
    module_name, attr_path = match["module"], match["attr"]
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise HandlerLoadError(
            f"handler {spec!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc}); is it installed or on PYTHONPATH?"
        ) from exc
    walked = module_name
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise HandlerLoadError(
                f"handler {spec!r}: {walked!r} has no attribute {part!r}"
            ) from exc
        walked = f"{walked}.{part}"
    if not callable(target):
        raise HandlerLoadError(
            f"handler {spec!r}: {walked} is a {type(target).__name__}, not a callable"
        )
    return target


def _url(spec: str) -> URL:
    try:
        url = URL(spec)
        url.raw_host  # noqa: B018 - parsing the authority may raise
    except (ValueError, TypeError) as exc:
        raise HandlerLoadError(f"bad handler URL {redact_url(spec)!r}: {exc}") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise HandlerLoadError(
            f"bad handler URL {redact_url(spec)!r}: needs http(s)://host[:port]/path"
        )
    return url


def _http_handler(spec: str, timeout_s: float, max_in_flight: int) -> HttpHandler:
    return HttpHandler(str(_url(spec)), timeout_s=timeout_s, max_connections=max_in_flight)


def _http_bulk_handler(spec: str, timeout_s: float, max_in_flight: int, batch: int) -> Handler:
    """The HTTP adapter's bulk mode: one connection per batch call in flight (the batch pool
    runs ``max_in_flight // batch`` calls at a time, at least one)."""
    url = spec if spec.lower().startswith("http+unix://") else str(_url(spec))
    try:  # by name: the bulk adapter is an optional part of a build
        bulk: Any = importlib.import_module("retryd.handlers.http_bulk")
    except ModuleNotFoundError as exc:
        if exc.name != "retryd.handlers.http_bulk":
            raise
        raise HandlerLoadError(
            f"handler {redact_url(spec)!r} with handler_batch={batch}: bulk HTTP mode not "
            "available in this build"
        ) from exc
    try:
        handler: Handler = bulk.HttpBulkHandler(
            url,
            timeout_s=timeout_s,
            max_batch=batch,
            max_connections=max(1, max_in_flight // batch),
        )
    except ValueError as exc:  # e.g. https://: bulk mode speaks plain http only
        raise HandlerLoadError(f"handler_batch={batch}: {exc}") from exc
    return handler
