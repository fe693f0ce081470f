"""Handler for the replay round-trip test: dead-letters a message at once, handles its replay.

Every call is appended to ``RETRYD_TEST_LOG`` as one JSON line (one os.write, O_APPEND).
"""

from __future__ import annotations

import os

from retryd import NonRetryableError
from retryd.handlers.base import Message
from tests.integration.handlers import append_log_line


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
    append_log_line(entry)
    if replay_id is None:
        raise NonRetryableError("poison until someone replays it")
