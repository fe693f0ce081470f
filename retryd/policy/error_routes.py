"""Error routes: a failure's class picks its own retry sequence or dead-letter topic.

    [error_routes]
    "TimeoutError"          = "exp(1s, x2, max=1m, n=10, jitter=20%)"
    "myapp.errors.Declined" = "dlt:payments.declined"
    "http_429"              = "exp(10s, x2, n=6)"
    "http_5xx"              = ["1m", "5m", "30m"]
    "InventoryLocked"       = "30s,30s,1m"    # a class an HTTP service names in X-Retryd-Error
    "ValidationError"       = "dead"

Matchers:

* an error class name, simple or dotted: a Python exception class and its subclasses (the most
  derived class with a route wins; a dotted name wins over a simple one on the same class),
  the class an HTTP service names in its ``X-Retryd-Error`` response header, or one of retryd's
  own classes (``timeout``, ``connection_error``, ...);
* ``http_<status>`` (``http_503``) and ``http_<d>xx`` (``http_5xx``): an HTTP answer's status.
  For one HTTP answer the named class wins over the exact status, which wins over the range.

Targets: a retry sequence in any form ``retry_sequence`` takes (without ``quick=``: quick retries
happen before a failure is routed), ``dlt:<topic>`` (straight to that dead-letter topic, dead
reason ``routed``), or ``dead`` (straight to ``failed_topic``, as a non-retryable failure).

Only retryable failures take a sequence route; a non-retryable one (``non_retryable``,
``NonRetryableError``, a 4xx, a body ``{"status": "DEAD"}``) is never retried, but does take a
matching ``dlt:`` or ``dead`` route. ``retryd.policy.routing`` applies the routes; this module
parses and validates them (at start-up: every problem names its route).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from retryd.errors import ConfigError, SequenceError
from retryd.policy.backoff import Backoff, parse_backoff
from retryd.policy.tables import table_from_value

__all__ = [
    "DEAD_TARGET",
    "DLT_PREFIX",
    "MAX_NAME",
    "MAX_ROUTES",
    "ErrorRoute",
    "ErrorRouteError",
    "Match",
    "Target",
    "error_name",
    "parse_error_routes",
    "routes_from_value",
]

# Every route is a lookup at start-up and may add tier topics: a table longer than this is a
# generated config gone wrong, not a policy.
MAX_ROUTES = 64
# Matchers and the class an HTTP service names: long enough for a dotted Python class name.
MAX_NAME = 200
DLT_PREFIX = "dlt:"
DEAD_TARGET = "dead"

# A class name (Python, or named by a service): token characters only, so it can travel in a
# header and a log line unquoted. re.ASCII: no look-alike letters of other scripts.
_CLASS_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z", re.ASCII)
_STATUS_RE = re.compile(r"http_([1-5][0-9][0-9])\Z", re.ASCII)
_RANGE_RE = re.compile(r"http_([1-5])xx\Z", re.ASCII)
# 408 and 429 are the retryable 4xx (classify_http); every other 4xx is dead-lettered.
_RETRYABLE_4XX = frozenset({408, 429})


class ErrorRouteError(SequenceError):
    """``error_routes`` is invalid; ``problems`` holds one line per problem, each naming its
    route."""

    def __init__(self, problems: list[str]) -> None:
        ConfigError.__init__(self, problems)


class Match(enum.StrEnum):
    CLASS = "class"
    STATUS = "status"  # http_503
    RANGE = "range"  # http_5xx


class Target(enum.StrEnum):
    SEQUENCE = "sequence"
    DLT = "dlt"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class ErrorRoute:
    """One parsed route. ``name`` is the matcher as written: also the ``retryd_route`` header
    value of every copy it routes, so a tier worker continues on it."""

    name: str
    match: Match
    target: Target
    text: str  # the target as written, for messages
    backoff: Backoff | None = None  # Target.SEQUENCE
    topic: str | None = None  # Target.DLT

    @property
    def terminal(self) -> bool:
        """Dead-letters at once (``dlt:`` or ``dead``)."""
        return self.target is not Target.SEQUENCE

    @property
    def delays_ms(self) -> tuple[int, ...]:
        return self.backoff.delays_ms if self.backoff is not None else ()

    @property
    def jitter(self) -> float:
        return self.backoff.jitter if self.backoff is not None else 0.0


def error_name(value: object) -> str | None:
    """The class an HTTP service named in ``X-Retryd-Error``, or None when absent or unusable.

    The value comes from another service: anything that is not a short token (at most
    ``MAX_NAME`` characters of ``[A-Za-z0-9_.-]``, starting with a letter or ``_``) is ignored,
    never raised on, so a hostile or broken header can at worst fail to match a route."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > MAX_NAME or _CLASS_RE.match(text) is None:
        return None
    return text


def _matcher(name: str) -> tuple[Match, str | None]:
    """``(kind, problem)`` of one matcher."""
    if not name:
        return Match.CLASS, "an empty matcher: name an exception class, http_<status> or http_<d>xx"
    if len(name) > MAX_NAME:
        return Match.CLASS, f"matcher longer than {MAX_NAME} characters"
    status = _STATUS_RE.match(name)
    if status is not None:
        if 200 <= int(status.group(1)) < 300:
            return Match.STATUS, "a 2xx answer is a success, never routed"
        return Match.STATUS, None
    code_range = _RANGE_RE.match(name)
    if code_range is not None:
        if code_range.group(1) == "2":
            return Match.RANGE, "a 2xx answer is a success, never routed"
        return Match.RANGE, None
    if name.lower().startswith("http_") and name[5:6].isdigit():
        return Match.STATUS, "an HTTP matcher is http_<status> (http_503) or http_<d>xx (http_5xx)"
    if _CLASS_RE.match(name) is None or ".." in name or name.endswith((".", "-")):
        return Match.CLASS, (
            "not a matcher: name an exception class (ValueError, myapp.errors.Declined), "
            "http_<status> (http_503) or http_<d>xx (http_5xx)"
        )
    return Match.CLASS, None


def _route(name: str, target: str) -> ErrorRoute:
    """One route; raises ErrorRouteError naming it."""

    def fail(why: str) -> ErrorRouteError:
        return ErrorRouteError([f"error_routes: route {name!r} = {target!r}: {why}"])

    match, problem = _matcher(name)
    if problem is not None:
        raise fail(problem)
    text = target.strip()
    if text == DEAD_TARGET:
        return ErrorRoute(name, match, Target.DEAD, text)
    if text.lower().startswith(DLT_PREFIX):
        topic = text[len(DLT_PREFIX) :].strip()
        if not topic:
            raise fail("'dlt:' names no topic: write dlt:<topic>")
        # the name itself is checked with every other topic name (RetryPlan.parse)
        return ErrorRoute(name, match, Target.DLT, text, topic=topic)
    if not text:
        raise fail("an empty target: give a retry sequence, 'dlt:<topic>' or 'dead'")
    try:
        backoff = parse_backoff(text)
    except SequenceError as exc:
        raise fail(
            f"expected a retry sequence ('1m,5m', 'exp(1s, x2, n=5)'), 'dlt:<topic>' or "
            f"'dead': {exc.problems[0]}"
        ) from exc
    if backoff.quick:
        raise fail(
            "quick= is not allowed in a route: quick retries happen before a failure is "
            "routed (set it in retry_sequence)"
        )
    if backoff.first_delay_ms:
        raise fail(
            "delay= is not allowed in a route: it delays a record's first attempt, before any "
            "failure (set it in retry_sequence)"
        )
    status = int(name[5:]) if match is Match.STATUS else 0
    if 400 <= status < 500 and status not in _RETRYABLE_4XX:
        raise fail(
            f"HTTP {status} is non-retryable, so a retry sequence never applies: route it to "
            "'dlt:<topic>' or 'dead', or have the service answer {\"status\": \"RETRY\"}"
        )
    return ErrorRoute(name, match, Target.SEQUENCE, text, backoff=backoff)


def parse_error_routes(routes: Mapping[str, str]) -> tuple[ErrorRoute, ...]:
    """Every route of ``routes`` (matcher -> target), in order; raises ErrorRouteError with
    one line per problem."""
    problems: list[str] = []
    if len(routes) > MAX_ROUTES:
        problems.append(
            f"error_routes: {len(routes)} routes, at most {MAX_ROUTES} (a route per exception "
            "class of a common base is better written once, for the base)"
        )
    parsed: list[ErrorRoute] = []
    for name, target in routes.items():
        try:
            parsed.append(_route(name, target))
        except ErrorRouteError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ErrorRouteError(problems)
    return tuple(parsed)


def _target_text(name: str, value: Any) -> str:
    """A target as text: a list of delays is a comma list."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        return ",".join(value)
    raise ValueError(
        f"route {name!r}: the target must be a string ('1m,5m', 'dlt:<topic>', 'dead') or a "
        "list of delays"
    )


def routes_from_value(value: Any) -> dict[str, str]:
    """``error_routes`` from any source, as matcher -> target text.

    TOML gives a table; ``RETRYD_ERROR_ROUTES`` is a JSON object or ``matcher=target`` pairs
    separated by ``;`` (targets hold commas: ``TimeoutError=exp(1s, n=5); http_5xx=1m,5m``).
    Raises ValueError naming what could not be read."""
    value = table_from_value(value, name="matcher", value_name="target")
    out: dict[str, str] = {}
    for name, target in value.items():
        if not isinstance(name, str):
            raise ValueError(f"matcher {name!r} is not text")
        out[name.strip()] = _target_text(name, target)
    return out
