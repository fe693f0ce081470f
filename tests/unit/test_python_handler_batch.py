"""``PythonHandler.call_many``: a batch on the handler thread, per-call timeouts, cancellation."""

from __future__ import annotations

import threading
import time

import pytest

from retryd.handlers.base import HandlerShutdown, Message
from retryd.handlers.python_handler import PythonHandler
from retryd.policy.classify import Outcome


def _msgs(*values: bytes) -> list[Message]:
    return [Message(key=None, value=v, offset=i) for i, v in enumerate(values)]


def behave(message: Message) -> None:
    if message.value == b"fail":
        raise ValueError("no")
    if message.value == b"hang":
        time.sleep(5)
    if message.value == b"exit":
        raise SystemExit(3)


def test_results_in_order_with_durations() -> None:
    h = PythonHandler(behave, timeout_s=1)
    out = list(h.call_many(_msgs(b"ok", b"fail", b"ok")))
    assert [r.outcome for r, _ in out] == [Outcome.SUCCESS, Outcome.RETRY, Outcome.SUCCESS]
    assert all(0 <= s < 1 for _, s in out)
    h.close()


def test_a_hung_call_times_out_and_the_rest_runs_on_a_fresh_thread() -> None:
    h = PythonHandler(behave, timeout_s=0.3)
    started = time.monotonic()
    out = [r for r, _ in h.call_many(_msgs(b"ok", b"hang", b"ok", b"fail"))]
    assert time.monotonic() - started < 2
    assert [r.outcome for r in out] == [
        Outcome.SUCCESS,
        Outcome.RETRY,
        Outcome.SUCCESS,
        Outcome.RETRY,
    ]
    assert out[1].error_class == "timeout"
    assert h.abandoned == 1
    h.close()


def test_cancel_stops_before_the_next_call_and_reports_only_calls_that_ran() -> None:
    seen: list[int] = []
    gate = threading.Event()

    def slow(message: Message) -> None:
        seen.append(message.offset)
        if message.offset == 1:
            gate.set()
        time.sleep(0.05)

    h = PythonHandler(slow, timeout_s=1)
    results = list(h.call_many(_msgs(*[b"x"] * 20), cancel=gate.is_set))
    assert len(results) == len(seen)  # every call that ran was reported, nothing else
    assert 2 <= len(seen) < 20
    h.close()


def test_caller_closing_the_iterator_stops_the_batch() -> None:
    seen: list[int] = []

    def record(message: Message) -> None:
        seen.append(message.offset)
        time.sleep(0.02)

    h = PythonHandler(record, timeout_s=1)
    it = h.call_many(_msgs(*[b"x"] * 50))
    next(it)
    it.close()
    # the thread stops after the call it was running; the handler stays usable
    assert [r.outcome for r, _ in h.call_many(_msgs(b"y"))] == [Outcome.SUCCESS]
    assert len(seen) < 50
    h.close()


def test_system_exit_in_a_batch_raises_handler_shutdown() -> None:
    h = PythonHandler(behave, timeout_s=1)
    it = h.call_many(_msgs(b"ok", b"exit", b"ok"))
    assert next(it)[0].outcome is Outcome.SUCCESS
    with pytest.raises(HandlerShutdown):
        next(it)
    h.close()


def test_async_handlers_take_the_sequential_path() -> None:
    async def handle(message: Message) -> None:
        if message.value == b"fail":
            raise ValueError("no")

    h = PythonHandler(handle, timeout_s=1)
    out = [r.outcome for r, _ in h.call_many(_msgs(b"ok", b"fail"))]
    assert out == [Outcome.SUCCESS, Outcome.RETRY]
    h.close()
