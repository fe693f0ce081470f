"""The demo business handler: fails as each demo order says, so outcomes are known in advance."""

from __future__ import annotations

import json

from retryd import NonRetryableError
from retryd.handlers.base import Message


class PaymentServiceUnavailable(Exception):
    """A transient failure: retried along the sequence."""


def handle(message: Message) -> None:
    order = json.loads(message.value or b"{}")
    if order.get("poison"):
        raise NonRetryableError(f"order {order.get('order')}: unknown product")
    if message.retry_number < int(order.get("fail_times", 0)):
        raise PaymentServiceUnavailable(f"payment service unavailable (try {message.retry_number})")
