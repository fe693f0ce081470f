"""A demo handler for docker-compose: shows success, retries and dead-lettering.

Values starting with ``fail`` raise a retryable error (they walk the retry tiers and end in
failed_topic as ``exhausted``); values starting with ``poison`` are dead-lettered at once as
``non_retryable``; everything else succeeds.

    RETRYD_HANDLER=python:example_handler:handle   (with this directory on PYTHONPATH)
"""

from __future__ import annotations

import logging

from retryd import NonRetryableError
from retryd.handlers.base import Message

log = logging.getLogger(__name__)


class TemporaryFailure(Exception):
    """Stands in for a downstream outage: worth retrying later."""


def handle(message: Message) -> None:
    value = message.value or b""
    if value.startswith(b"poison"):
        raise NonRetryableError(f"cannot process {value[:40]!r}")
    if value.startswith(b"fail"):
        raise TemporaryFailure(f"downstream unavailable (retry {message.retry_number})")
    log.info(
        "handled %s[%d]@%d retry=%d",
        message.topic,
        message.partition,
        message.offset,
        message.retry_number,
    )
