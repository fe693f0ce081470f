"""A routed copy the broker refuses as too large: dead-letter an envelope without the payload.

A failing record close to the broker's size limit grows by retryd's headers when it is
routed, and the copy can be refused (``MSG_SIZE_TOO_LARGE``). Retrying the send can never
succeed, and stopping would restart into the same record forever; so the record ends in
``failed_topic`` with ``retryd_dead_reason=too_large``: retryd's headers (the original
coordinates, where the payload can still be read while the source topic retains it) and no
value, no user headers (they may be what made it large).
"""

from __future__ import annotations

from retryd.policy.headers import (
    DEAD_REASON,
    ERROR_CLASS,
    ERROR_MESSAGE,
    RETRY_TIMESTAMP,
    Headers,
    is_retryd_header,
    truncate_utf8,
)
from retryd.policy.routing import Route
from retryd.policy.sequence import RetryPlan

DEAD_TOO_LARGE = "too_large"
TOO_LARGE_CLASS = "copy_too_large"


def route_too_large(plan: RetryPlan, refused: Route, size: int, problem: str) -> Route:
    """The dead letter that replaces ``refused``: its retryd headers (coordinates, retry
    number, group), the reason, and what was refused."""
    kept: Headers = [
        (name, value)
        for name, value in refused.headers
        if is_retryd_header(name) and name not in _REPLACED
    ]
    kept.append((ERROR_CLASS, TOO_LARGE_CLASS.encode()))
    kept.append(
        (
            ERROR_MESSAGE,
            truncate_utf8(
                f"a routed copy of {size} bytes to {refused.topic} was refused ({problem}); "
                "the payload stays at the original coordinates"
            ),
        )
    )
    kept.append((DEAD_REASON, DEAD_TOO_LARGE.encode()))
    return Route(
        plan.failed_topic,
        kept,
        refused.timestamp_ms,
        refused.retry_number,
        None,
        DEAD_TOO_LARGE,
    )


_REPLACED = frozenset({ERROR_CLASS, ERROR_MESSAGE, DEAD_REASON, RETRY_TIMESTAMP})
