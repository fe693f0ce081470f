"""A persistent asyncio loop on a daemon thread for ``async def`` handlers.

A timeout cancels the coroutine (``asyncio.timeout``); if the loop itself is stuck (blocking code
inside ``async def``, or a coroutine that swallows cancellation) the caller gives up after a grace
period and the loop is abandoned like a hung thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from retryd.handlers.base import Message

if TYPE_CHECKING:
    from retryd.handlers.python_handler import PythonHandler

# (exception or None, return value)
Out = tuple[BaseException | None, Any]


class AsyncCall:
    """One async call in flight; ``done`` is released when ``result`` is set."""

    __slots__ = ("abandoned", "done", "finished", "message", "result")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.done = threading.Lock()
        self.done.acquire()
        self.finished = False
        self.abandoned = False
        self.result: Out | None = None  # None: timed out and cancelled


class LoopRunner:
    """A persistent asyncio loop on a daemon thread, running calls as tasks."""

    def __init__(self, owner: PythonHandler, name: str) -> None:
        self._owner = owner
        self.loop = asyncio.new_event_loop()
        self.lock = threading.Lock()
        self.inflight = 0
        self.abandoned = False
        self._tasks: set[asyncio.Task[Out | None]] = set()  # strong refs while running
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, call: AsyncCall, factory: Callable[[Message], Any], timeout: float) -> bool:
        with self.lock:
            self.inflight += 1
        try:
            self.loop.call_soon_threadsafe(self._start, call, factory, timeout)
        except RuntimeError:  # loop closed under us (close() raced)
            with self.lock:
                self.inflight -= 1
            return False
        return True

    def _start(self, call: AsyncCall, factory: Callable[[Message], Any], timeout: float) -> None:
        task = self.loop.create_task(_invoke(factory, call.message, timeout))
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, call))

    def _done(self, task: asyncio.Task[Out | None], call: AsyncCall) -> None:
        self._tasks.discard(task)
        result = None if task.cancelled() else task.result()
        with self.lock:
            self.inflight -= 1
            stop = self.abandoned and self.inflight == 0
            late = call.abandoned
            if not late:
                call.result = result
                call.finished = True
                call.done.release()
        if late:
            self._owner._late_return(call.message)
        if stop:
            self.loop.stop()

    def wait(self, call: AsyncCall, timeout: float) -> bool:
        """True once the call finished; False if it did not and is now abandoned (with the loop)."""
        if call.done.acquire(timeout=timeout):
            return True
        with self.lock:
            if call.finished:
                return True
            call.abandoned = True
            self.abandoned = True
            self._owner._count_abandoned(+1)
        return False

    def stop(self) -> None:
        if not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed concurrently
                self.loop.call_soon_threadsafe(self.loop.stop)


async def _invoke(
    factory: Callable[[Message], Any], message: Message, timeout: float
) -> Out | None:
    """Run one async call on the loop; never lets an exception escape into the loop."""
    try:
        async with asyncio.timeout(timeout) as scope:
            coro: Coroutine[Any, Any, Any] = factory(message)
            value = await coro
        return (None, value)
    except TimeoutError as exc:
        return None if scope.expired() else (exc, None)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the loop is shutting down
        return (exc, None)  # business code raised CancelledError itself
    except BaseException as exc:  # incl. KeyboardInterrupt/SystemExit: must not kill the loop
        return (exc, None)
