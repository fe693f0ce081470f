"""An asyncio event loop on a daemon thread of its own: how both handler pools run async calls.

Group mode's ``LoopPool`` and share mode's ``Calls`` each run ``async def`` handlers on such a
loop, and each abandons a loop whose call ignores its cancellation and starts a new one (a
generation). Starting one is the same in both: the loop is running before this returns, so a
call submitted at once is never lost, and it is closed on its own thread once stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

START_WAIT_S = 10.0  # how long the starter waits for the loop to run (a busy machine's start)


def start_loop_thread(
    name: str, on_exit: Callable[[], None] | None = None
) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """A new event loop running forever on a daemon thread named ``name``.

    ``on_exit`` runs on that thread once the loop has stopped, before the loop is closed (share
    mode counts a replaced loop as hung until then)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(started.set)
        try:
            loop.run_forever()
        finally:
            if on_exit is not None:
                on_exit()
            with contextlib.suppress(Exception):
                loop.close()

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()
    started.wait(START_WAIT_S)
    return loop, thread


__all__ = ["start_loop_thread"]
