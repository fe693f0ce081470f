"""Handler for the replay round-trip test: dead-letters a message at once, handles its replay.

Every call is appended to ``RETRYD_TEST_LOG`` as one JSON line (one os.write, O_APPEND).
"""

from __future__ import annotations

import json
import os

from retryd import NonRetryableError
from retryd.handlers.base import Message


def replay_aware(message: Message) -> None:
    replay_id = message.header("retryd_replay_id")
    entry = {
        "topic": message.topic,
        "offset": message.offset,
        "retry_number": message.retry_number,
        "replay_id": replay_id.decode() if replay_id else None,
        "replayed_from": (message.header("retryd_replayed_from") or b"").decode() or None,
        "pid": os.getpid(),
    }
    path = os.environ.get("RETRYD_TEST_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())
        finally:
            os.close(fd)
    if replay_id is None:
        raise NonRetryableError("poison until someone replays it")
