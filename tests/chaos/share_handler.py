"""The chaos handler of the share-mode scenarios (``python:tests.chaos.share_handler:handle``):
``tests.chaos.handler.handle`` (same plan, same call log), each call then held ``CALL_S``.

Why: with the instant chaos handler a share worker holds its acquired records for a few
milliseconds per poll, so a SIGKILL nearly always lands between two polls, with everything
acknowledged, and the share group never has to hand a record out again (0 main-topic repeats
in a full-size run of 12 kills). Held 50 ms after the call is logged, a record a killed
worker had handled is still unacknowledged: the broker hands it out again, as in production
where calls take time, and the ledger counts the repeat.
"""

from __future__ import annotations

import time

from retryd.handlers.base import Message
from tests.chaos.handler import handle as chaos_handle

CALL_S = 0.05


def handle(message: Message) -> None:
    try:
        chaos_handle(message)
    finally:
        time.sleep(CALL_S)  # the call's duration (see the module docstring)
