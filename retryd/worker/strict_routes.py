"""The copy of a record parked behind its key's chain (``key_order = strict``), or
dead-lettered behind a dead-lettered head: the envelope is built here, apart from the engine.

A parked copy keeps its retry number (parking is not a retry), names its origin like every
routed copy, and carries ``retryd_parked`` = the time it was first parked (kept across parks,
so the cap can release it however often it was parked again)."""

from __future__ import annotations

from retryd.policy import key_order as ko
from retryd.policy.headers import (
    DEAD_REASON,
    ERROR_CLASS,
    ERROR_MESSAGE,
    FIRST_FAILURE_TIMESTAMP,
    GROUP,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP,
    ORIGINAL_TOPIC,
    RETRY_NUMBER,
    RETRY_TIMESTAMP,
    ROUTE,
    header_value,
    truncate_utf8,
    user_headers,
)
from retryd.policy.routing import Route
from retryd.worker.reading import readable_headers
from retryd.worker.work import Work


def park_route(
    w: Work,
    now_ms: int,
    park_topic: str,
    park_delay_ms: int,
    failed_topic: str,
    group: str,
    dead_reason: str | None = None,
) -> Route:
    """The copy of ``w`` parked (again) in ``park_topic``, or dead-lettered to
    ``failed_topic`` with ``dead_reason``."""
    source, _ = readable_headers(w.msg)
    env = w.env
    if env is None:  # a main-topic record: its own origin
        msg = w.msg
        raw = w.raw
        timestamp = raw.timestamp()[1] if raw is not None else msg.timestamp
        origin = (msg.topic, msg.partition, w.offset, timestamp if timestamp > 0 else 0)
        number, first_failure, route_name = 0, None, None
        error_class: str | None = None
        error_message: str | None = None
        since = now_ms
    else:
        origin = (
            env.original_topic,
            env.original_partition,
            env.original_offset,
            env.original_timestamp,
        )
        number = env.retry_number
        first_failure = env.first_failure_timestamp
        error_class, error_message = env.error_class, env.error_message
        route_name = env.route
        try:
            since = ko.parked_since(header_value(source, ko.PARKED)) or now_ms
        except Exception:
            since = now_ms
    headers = user_headers(source) if source else []
    append = headers.append
    append((RETRY_NUMBER, b"%d" % number))
    if dead_reason is None:
        topic, due = park_topic, now_ms + park_delay_ms
        append((RETRY_TIMESTAMP, b"%d" % due))
    else:
        topic, due = failed_topic, None
    append((ORIGINAL_TOPIC, origin[0].encode("utf-8", errors="replace")))
    append((ORIGINAL_PARTITION, b"%d" % origin[1]))
    append((ORIGINAL_OFFSET, b"%d" % origin[2]))
    append((ORIGINAL_TIMESTAMP, b"%d" % origin[3]))
    if first_failure is not None or dead_reason is not None:
        append((FIRST_FAILURE_TIMESTAMP, b"%d" % (first_failure or now_ms)))
    if error_class is not None:
        append((ERROR_CLASS, truncate_utf8(error_class, 256)))
    if error_message is not None:
        append((ERROR_MESSAGE, truncate_utf8(error_message)))
    if dead_reason is not None:
        append((DEAD_REASON, dead_reason.encode("ascii")))
    append((GROUP, group.encode()))
    if route_name:
        append((ROUTE, route_name.encode("ascii", errors="replace")))
    if dead_reason is None:
        append((ko.PARKED, b"%d" % since))
    return Route(topic, headers, now_ms, number, due, dead_reason)
