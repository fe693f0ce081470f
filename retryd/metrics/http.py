"""The sidecar's own HTTP metrics, with every label value taken from a bounded set.

A label value that comes from a request (an invented HTTP method, a random path) would make a
new series per value: anyone who can reach the port could grow ``/metrics`` and, in
multiprocess mode, the metric files on disk without bound (they outlive the process). So:

- ``method`` is one of ``METHODS`` or ``other``;
- ``route`` is a route template of the app (``/v1/failed/{partition}/{offset}``) or
  ``unmatched``;
- ``status`` is one of ``STATUSES`` or its class (``2xx`` … ``5xx``);
- ``reason`` of ``retryd_http_auth_failures_total`` is one of ``AUTH_FAILURE_REASONS``.

``sanitize`` applies the same rule when the metric files are read, so series written by an
older sidecar that did not bound its labels are dropped rather than served forever.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import Metric

LOCAL = CollectorRegistry(auto_describe=True)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "other"
UNMATCHED = "unmatched"
STATUSES = frozenset(
    {200, 202, 204, 400, 401, 403, 404, 405, 409, 413, 422, 429, 500, 502, 503, 504}
)
STATUS_CLASSES = frozenset({"1xx", "2xx", "3xx", "4xx", "5xx"})
AUTH_FAILURE_REASONS = ("missing_token", "invalid_token", "insufficient_scope")

HTTP_REQUESTS = Counter(
    "retryd_http_requests",
    "Sidecar HTTP requests by method, route template and status",
    ["method", "route", "status"],
    registry=LOCAL,
)
HTTP_DURATION = Histogram(
    "retryd_http_request_duration_seconds",
    "Sidecar HTTP request duration by method and route template",
    ["method", "route"],
    registry=LOCAL,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
AUTH_FAILURES = Counter(
    "retryd_http_auth_failures",
    "Rejected /v1 requests and explorer sign-ins and acts: missing_token and invalid_token "
    "answer 401, insufficient_scope answers 403",
    ["reason"],
    registry=LOCAL,
)
for _reason in AUTH_FAILURE_REASONS:  # every reason is exported from the start, at 0
    AUTH_FAILURES.labels(reason=_reason)


def method_label(method: str) -> str:
    upper = method.upper()
    return upper if upper in METHODS else OTHER


def status_label(status: int) -> str:
    if status in STATUSES:
        return str(status)
    klass = f"{status // 100}xx"
    return klass if klass in STATUS_CLASSES else OTHER


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    """Count one request; ``route`` must already be a template or ``unmatched``."""
    m = method_label(method)
    HTTP_REQUESTS.labels(method=m, route=route, status=status_label(status)).inc()
    HTTP_DURATION.labels(method=m, route=route).observe(seconds)


def count_auth_failure(reason: str) -> None:
    AUTH_FAILURES.labels(reason=reason if reason in AUTH_FAILURE_REASONS else OTHER).inc()


_HTTP_FAMILIES = ("retryd_http_requests", "retryd_http_request_duration_seconds")


def _label_ok(name: str, value: str, routes: frozenset[str]) -> bool:
    if name == "method":
        return value in METHODS or value == OTHER
    if name == "route":
        return value in routes or value == UNMATCHED
    if name == "status":
        return (
            value in STATUS_CLASSES
            or value == OTHER
            or (value.isdigit() and int(value) in STATUSES)
        )
    return True


def sanitize(families: Iterable[Metric], routes: frozenset[str]) -> list[Metric]:
    """Drop HTTP samples whose labels are outside the bounded sets (see module docstring)."""
    out = []
    for fam in families:
        if fam.name in _HTTP_FAMILIES:
            fam.samples = [
                s
                for s in fam.samples
                if all(_label_ok(k, v, routes) for k, v in s.labels.items() if k != "le")
            ]
        elif fam.name == "retryd_http_auth_failures":
            fam.samples = [
                s for s in fam.samples if s.labels.get("reason") in (*AUTH_FAILURE_REASONS, OTHER)
            ]
        out.append(fam)
    return out
