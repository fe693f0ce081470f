"""The handler of the strict key-order tests on Kafka: the value is JSON ``{"id": n}``; each
call fails (retryably) with probability ``RETRYD_TEST_FAIL_RATE`` (default 0.3); each success
is appended to ``$RETRYD_TEST_LOG`` (one write per line: a SIGKILL loses none) and to
``SUCCESSES``."""

from __future__ import annotations

import json
import os
import random
import threading
import time

from retryd.handlers.base import Message
from tests.integration.handlers import append_log_line

SUCCESSES: list[dict] = []
_LOCK = threading.Lock()


def flaky(message: Message) -> None:
    if random.random() < float(os.environ.get("RETRYD_TEST_FAIL_RATE", "0.3")):
        raise RuntimeError("transient")
    doc = json.loads(message.value or b"{}")
    entry = {
        "id": doc.get("id"),
        "key": (message.key or b"").decode(),
        "retry_number": message.retry_number,
        "pid": os.getpid(),
        "at": time.time(),
    }
    with _LOCK:
        SUCCESSES.append(entry)
    append_log_line(entry)
