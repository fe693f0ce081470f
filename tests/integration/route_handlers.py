"""Business handlers for the error-route tests: each record's value names the exception to raise
at each retry number, e.g. ``{"id": "a", "raise": ["RateLimited", "Declined"]}`` raises
``RateLimited`` on the main topic, ``Declined`` at retry 1, and succeeds from retry 2 on
(``"always": "SlowDown"`` raises that at every call). Calls are recorded in ``CALLS``."""

from __future__ import annotations

import json
import threading

from retryd.handlers.base import Message

CALLS: list[tuple[str, int, str]] = []  # (id, retry number, topic consumed from)
_LOCK = threading.Lock()


class RateLimited(Exception):
    """Routed to its own sequence."""


class SlowDown(RateLimited):
    """A subclass: takes its base class's route."""


class Declined(Exception):
    """Routed straight to a named dead-letter topic."""


ERRORS: dict[str, type[Exception]] = {
    "RateLimited": RateLimited,
    "SlowDown": SlowDown,
    "Declined": Declined,
    "RuntimeError": RuntimeError,
}


def _act(message: Message) -> None:
    spec = json.loads(message.value or b"{}")
    with _LOCK:
        CALLS.append((spec["id"], message.retry_number, message.topic))
    plan = spec.get("raise", [])
    name = spec.get("always") or (
        plan[message.retry_number] if message.retry_number < len(plan) else None
    )
    if name is not None:
        raise ERRORS[name](f"{spec['id']} at retry {message.retry_number}")


def sync_handler(message: Message) -> None:
    _act(message)


async def async_handler(message: Message) -> None:
    _act(message)
