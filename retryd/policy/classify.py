"""Error classification: what a handler's result means for the message."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from retryd.errors import NonRetryableError


class Outcome(enum.StrEnum):
    SUCCESS = "success"
    RETRY = "retry"
    DEAD = "dead"
    DROP = "drop"


# Not frozen: a frozen dataclass costs ~2 µs to build (object.__setattr__ per field) and
# one is built per failed record. Treat instances as values: never mutate one.
@dataclass(slots=True)
class HandlerResult:
    outcome: Outcome
    error_class: str | None = None
    error_message: str | None = None
    # What error routes match on (retryd.policy.error_routes) besides ``error_class``: the
    # exception's class (routes for a base class catch subclasses), and the class an HTTP
    # service named in X-Retryd-Error (sanitised: ``error_routes.error_name``). Not compared:
    # two results are equal when they mean the same (outcome, class, message).
    error_type: type[BaseException] | None = field(default=None, compare=False)
    error_name: str | None = field(default=None, compare=False)

    @classmethod
    def success(cls) -> HandlerResult:
        return _SUCCESS


_SUCCESS = HandlerResult(Outcome.SUCCESS)
TIMEOUT_CLASS = "timeout"


def error_class_name(exc: BaseException) -> str:
    """``ValueError`` for builtins, ``package.module.Class`` for everything else."""
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _names(cls: type) -> set[str]:
    out: set[str] = set()
    for base in cls.__mro__:
        out.add(base.__qualname__)
        out.add(f"{base.__module__}.{base.__qualname__}")
    return out


class Classifier:
    """``classify_exception`` with the per-type work (MRO names, class name) cached: a handler
    that fails a million times fails with a handful of exception types."""

    __slots__ = ("_cache", "_non_retryable")

    MAX_TYPES = 1024  # exception types are code, not data; the bound only guards odd handlers

    def __init__(self, non_retryable: Iterable[str] = ()) -> None:
        self._non_retryable = frozenset(non_retryable)
        self._cache: dict[type, tuple[Outcome, str]] = {}

    def __call__(self, exc: BaseException) -> HandlerResult:
        cls = type(exc)
        hit = self._cache.get(cls)
        if hit is None:
            dead = issubclass(cls, NonRetryableError) or bool(_names(cls) & self._non_retryable)
            hit = (Outcome.DEAD if dead else Outcome.RETRY, error_class_name(exc))
            if len(self._cache) < self.MAX_TYPES:
                self._cache[cls] = hit
        try:
            message = str(exc) or repr(exc)
        except Exception:  # a broken __str__ in business code must not escape
            message = f"<{hit[1]} with an unprintable message>"
        return HandlerResult(hit[0], hit[1], message, cls)


def classify_exception(exc: BaseException, non_retryable: Iterable[str] = ()) -> HandlerResult:
    """Non-retryable if the exception (or a base class) is ``NonRetryableError`` or is named in
    ``non_retryable`` (simple or dotted name); retry otherwise."""
    return Classifier(non_retryable)(exc)


def timeout_result(seconds: float) -> HandlerResult:
    return HandlerResult(
        Outcome.RETRY, TIMEOUT_CLASS, f"handler did not finish within {seconds:g}s"
    )


_BODY_STATUS = {
    "SUCCESS": Outcome.SUCCESS,
    "RETRY": Outcome.RETRY,
    "DROP": Outcome.DROP,
    "DEAD": Outcome.DEAD,
}


def body_status(body: bytes, content_type: str | None) -> Outcome | None:
    """The Dapr-style ``{"status": ...}`` override in a JSON response body, if there is one."""
    if not body or (content_type and "json" not in content_type.lower()):
        return None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        # a body nested past the interpreter's recursion limit has no status word we can read:
        # the status code decides, as for any body that is not JSON (it must never raise)
        return None
    if isinstance(doc, dict) and isinstance(doc.get("status"), str):
        return _BODY_STATUS.get(doc["status"].upper())
    return None


def classify_http(
    status: int,
    body: bytes = b"",
    content_type: str | None = None,
    error_name: str | None = None,
) -> HandlerResult:
    """2xx success; 408, 429, 5xx retry; other 4xx dead; a JSON status word overrides the code.
    ``error_name`` is the class the service named (X-Retryd-Error, already sanitised): a
    failure carries it for the error routes."""
    error_class = f"http_{status}"
    override = body_status(body, content_type)
    snippet = body[:512].decode("utf-8", errors="replace")
    if override is not None:
        if override is Outcome.SUCCESS:
            return _SUCCESS
        if override is Outcome.DROP:
            return HandlerResult(Outcome.DROP)
        return HandlerResult(
            override,
            error_class,
            f"handler answered {status} status={override.name}",
            None,
            error_name,
        )
    if 200 <= status < 300:
        return _SUCCESS
    message = snippet or f"HTTP {status}"
    if status in (408, 429) or status >= 500 or status < 200:
        return HandlerResult(Outcome.RETRY, error_class, message, None, error_name)
    if 400 <= status < 500:
        return HandlerResult(Outcome.DEAD, error_class, message, None, error_name)
    # 3xx: redirects are not followed; treat as a retryable misconfiguration.
    return HandlerResult(Outcome.RETRY, error_class, message, None, error_name)
