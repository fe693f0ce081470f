"""PythonHandler and load_handler: outcomes, timeouts, abandoned threads, shutdown signals."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from retryd.errors import HandlerLoadError, NonRetryableError
from retryd.handlers import python_handler
from retryd.handlers.base import HandlerShutdown, Message
from retryd.handlers.http_handler import HttpHandler
from retryd.handlers.loader import load_handler
from retryd.handlers.python_handler import PythonHandler
from retryd.policy.classify import Outcome
from tests import handlers_for_tests
from tests.support import wait_for

MSG = Message(key=b"k", value=b"v", topic="orders", partition=2, offset=41)


class PaymentDeclined(Exception):
    pass


class CardExpired(PaymentDeclined):
    pass


class Permanent(NonRetryableError):
    pass


class Custom(BaseException):
    pass


@pytest.fixture
def make() -> Iterator[Callable[..., PythonHandler]]:
    made: list[PythonHandler] = []

    def factory(func: Callable[[Message], Any], **kw: Any) -> PythonHandler:
        kw.setdefault("timeout_s", 5.0)
        handler = PythonHandler(func, **kw)
        made.append(handler)
        return handler

    yield factory
    for handler in made:
        handler.close()


def raiser(exc: BaseException) -> Callable[[Message], None]:
    def func(message: Message) -> None:
        raise exc

    return func


def test_success_ignores_return_value(make: Callable[..., PythonHandler]) -> None:
    seen: list[Message] = []

    def func(message: Message) -> str:
        seen.append(message)
        return "DEAD"

    result = make(func)(MSG)
    assert result.outcome is Outcome.SUCCESS
    assert result.error_class is None
    assert seen == [MSG]


def test_exception_is_retryable(make: Callable[..., PythonHandler]) -> None:
    result = make(raiser(ValueError("bad amount")))(MSG)
    assert result.outcome is Outcome.RETRY
    assert result.error_class == "ValueError"
    assert result.error_message == "bad amount"


def test_non_retryable_error_subclass_is_dead(make: Callable[..., PythonHandler]) -> None:
    result = make(raiser(Permanent("gone")))(MSG)
    assert result.outcome is Outcome.DEAD
    assert result.error_class == f"{__name__}.Permanent"


@pytest.mark.parametrize(
    "names",
    [["PaymentDeclined"], [f"{__name__}.PaymentDeclined"], ["CardExpired"], ["KeyError", "X"]],
)
def test_names_in_non_retryable_list_are_dead(
    make: Callable[..., PythonHandler], names: list[str]
) -> None:
    exc: Exception = KeyError("k") if "KeyError" in names else CardExpired("expired")
    result = make(raiser(exc), non_retryable=names)(MSG)
    assert result.outcome is Outcome.DEAD


def test_unlisted_exception_stays_retryable(make: Callable[..., PythonHandler]) -> None:
    result = make(raiser(PaymentDeclined("x")), non_retryable=["CardExpired", "x.PaymentDeclined"])(
        MSG
    )
    assert result.outcome is Outcome.RETRY


@pytest.mark.parametrize("exc", [Custom("odd"), GeneratorExit()])
def test_base_exceptions_are_caught(make: Callable[..., PythonHandler], exc: BaseException) -> None:
    handler = make(raiser(exc))
    result = handler(MSG)
    assert result.outcome is Outcome.RETRY
    assert result.error_class in (f"{__name__}.Custom", "GeneratorExit")
    # the worker survived and serves the next call
    assert handler(MSG).outcome is Outcome.RETRY


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
def test_exit_signals_become_handler_shutdown(
    make: Callable[..., PythonHandler], exc: BaseException
) -> None:
    with pytest.raises(HandlerShutdown) as info:
        make(raiser(exc))(MSG)
    assert info.value.__cause__ is exc
    assert "orders[2]@41" in str(info.value)


def test_worker_thread_is_reused(make: Callable[..., PythonHandler]) -> None:
    threads: list[threading.Thread] = []
    handler = make(lambda m: threads.append(threading.current_thread()))
    for _ in range(5):
        handler(MSG)
    assert len(set(threads)) == 1
    assert threads[0].daemon
    assert threads[0] is not threading.current_thread()


def test_hung_call_times_out_and_its_thread_is_abandoned(
    make: Callable[..., PythonHandler],
) -> None:
    release = threading.Event()
    threads: dict[bytes | None, threading.Thread] = {}

    def func(message: Message) -> None:
        threads[message.value] = threading.current_thread()
        if message.value == b"hang":
            release.wait(30)

    handler = make(func, timeout_s=0.2)
    start = time.monotonic()
    result = handler(Message(key=None, value=b"hang", topic="t"))
    elapsed = time.monotonic() - start
    try:
        assert result.outcome is Outcome.RETRY
        assert result.error_class == "timeout"
        assert 0.15 <= elapsed < 3.0
        assert handler.abandoned == 1
        # the next call runs at once on a fresh thread while the hung one is still stuck
        assert handler(Message(key=None, value=b"next", topic="t")).outcome is Outcome.SUCCESS
        assert threads[b"next"] is not threads[b"hang"]
        assert threads[b"hang"].is_alive()
    finally:
        release.set()
    wait_for(lambda: handler.abandoned == 0, 5, what="abandoned call to return")
    threads[b"hang"].join(5)
    assert not threads[b"hang"].is_alive()  # the abandoned thread exits instead of idling


def test_concurrent_calls_get_their_own_threads(make: Callable[..., PythonHandler]) -> None:
    barrier = threading.Barrier(2, timeout=5)
    handler = make(lambda m: barrier.wait())
    results: list[Outcome] = []
    other = threading.Thread(target=lambda: results.append(handler(MSG).outcome))
    other.start()
    results.append(handler(MSG).outcome)
    other.join(5)
    assert results == [Outcome.SUCCESS, Outcome.SUCCESS]


def test_close_stops_idle_workers() -> None:
    threads: list[threading.Thread] = []
    handler = PythonHandler(lambda m: threads.append(threading.current_thread()), timeout_s=5)
    handler(MSG)
    handler.close()
    threads[0].join(5)
    assert not threads[0].is_alive()


def test_per_call_overhead_is_small(make: Callable[..., PythonHandler]) -> None:
    handler = make(lambda m: None)
    for _ in range(200):
        handler(MSG)
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        handler(MSG)
    per_call_us = (time.perf_counter() - start) / n * 1e6
    print(f"sync no-op handler: {per_call_us:.1f} us/call")
    assert per_call_us < 2000  # generous: shared CI cores; typically ~30-50 us


# -- async --------------------------------------------------------------------------------------


def test_async_success(make: Callable[..., PythonHandler]) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def func(message: Message) -> None:
        await asyncio.sleep(0)
        loops.append(asyncio.get_running_loop())

    handler = make(func)
    assert handler(MSG).outcome is Outcome.SUCCESS
    assert handler(MSG).outcome is Outcome.SUCCESS
    assert len(loops) == 2 and loops[0] is loops[1]  # one persistent loop


@pytest.mark.parametrize(
    ("exc", "outcome", "error_class"),
    [
        (ValueError("nope"), Outcome.RETRY, "ValueError"),
        (Permanent("gone"), Outcome.DEAD, f"{__name__}.Permanent"),
        (TimeoutError("business timeout"), Outcome.RETRY, "TimeoutError"),
        (asyncio.CancelledError(), Outcome.RETRY, "asyncio.exceptions.CancelledError"),
        (Custom("odd"), Outcome.RETRY, f"{__name__}.Custom"),
    ],
)
def test_async_raise(
    make: Callable[..., PythonHandler], exc: BaseException, outcome: Outcome, error_class: str
) -> None:
    async def func(message: Message) -> None:
        raise exc

    handler = make(func)
    result = handler(MSG)
    assert (result.outcome, result.error_class) == (outcome, error_class)
    assert handler(MSG).outcome is outcome  # the loop survived


def test_async_system_exit_becomes_handler_shutdown(make: Callable[..., PythonHandler]) -> None:
    async def func(message: Message) -> None:
        raise SystemExit(1)

    handler = make(func)
    with pytest.raises(HandlerShutdown):
        handler(MSG)
    with pytest.raises(HandlerShutdown):  # and the loop is still alive
        handler(MSG)


def test_async_hang_is_really_cancelled(make: Callable[..., PythonHandler]) -> None:
    cancelled = threading.Event()

    async def func(message: Message) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    handler = make(func, timeout_s=0.2)
    start = time.monotonic()
    result = handler(MSG)
    assert time.monotonic() - start < 3.0
    assert (result.outcome, result.error_class) == (Outcome.RETRY, "timeout")
    assert cancelled.wait(5)
    assert handler.abandoned == 0


def test_async_blocking_loop_is_abandoned(
    make: Callable[..., PythonHandler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(python_handler, "ASYNC_CANCEL_GRACE_S", 0.2)
    release = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    async def func(message: Message) -> None:
        loops.append(asyncio.get_running_loop())
        if message.value == b"block":
            release.wait(30)  # blocking call inside async def: cancellation cannot land

    handler = make(func, timeout_s=0.2)
    try:
        result = handler(Message(key=None, value=b"block", topic="t"))
        assert result.error_class == "timeout"
        assert handler.abandoned == 1
        assert handler(MSG).outcome is Outcome.SUCCESS  # on a fresh loop
        assert loops[1] is not loops[0]
    finally:
        release.set()
    wait_for(lambda: handler.abandoned == 0, 5, what="blocked call to return")
    wait_for(lambda: loops[0].is_closed(), 5, what="abandoned loop to stop")


def test_sync_callable_returning_coroutine_is_awaited(make: Callable[..., PythonHandler]) -> None:
    async def inner(message: Message) -> None:
        raise ValueError("from coroutine")

    result = make(lambda m: inner(m))(MSG)
    assert (result.outcome, result.error_class) == (Outcome.RETRY, "ValueError")


def test_async_callable_object(make: Callable[..., PythonHandler]) -> None:
    class Obj:
        async def __call__(self, message: Message) -> None:
            await asyncio.sleep(0)

    assert python_handler.is_async_callable(Obj())
    assert make(Obj())(MSG).outcome is Outcome.SUCCESS


# -- loader -------------------------------------------------------------------------------------


def test_load_python_handlers() -> None:
    for spec in (
        "python:tests.handlers_for_tests:ok",
        "python:tests.handlers_for_tests:async_ok",
        "python:tests.handlers_for_tests:Namespace.nested",
    ):
        handler = load_handler(spec, timeout_s=2)
        try:
            assert isinstance(handler, PythonHandler)
            assert handler(MSG).outcome is Outcome.SUCCESS, spec
        finally:
            handler.close()
    handler = load_handler(
        "python:tests.handlers_for_tests:fail", timeout_s=2, non_retryable=["ValueError"]
    )
    try:
        assert handler(MSG).outcome is Outcome.DEAD
    finally:
        handler.close()
    assert handlers_for_tests.CALLS[-2:] == [MSG, MSG]


def test_load_http_handler_does_no_io() -> None:
    handler = load_handler("http://user:secret@127.0.0.1:1/hook?token=x", timeout_s=2)
    try:
        assert isinstance(handler, HttpHandler)
        assert "secret" not in handler.url and "token" not in handler.url
    finally:
        handler.close()


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "unknown handler spec"),
        ("ftp://host/x", "unknown handler spec"),
        ("tests.handlers_for_tests:ok", "unknown handler spec"),
        ("python:tests.handlers_for_tests", "bad python handler spec"),
        ("python:tests.handlers_for_tests:", "bad python handler spec"),
        ("python:tests/handlers_for_tests:ok", "bad python handler spec"),
        ("python:a:b:c", "bad python handler spec"),
        ("python:tests.no_such_module_xyz:ok", "cannot import module 'tests.no_such_module_xyz'"),
        ("python:tests.handlers_for_tests:missing", "has no attribute 'missing'"),
        ("python:tests.handlers_for_tests:Namespace.nope", "has no attribute 'nope'"),
        ("python:tests.handlers_for_tests:not_callable", "is a int, not a callable"),
        ("http://", "bad handler URL"),
        ("https:///path-only", "bad handler URL"),
    ],
)
def test_loader_errors(spec: str, fragment: str) -> None:
    with pytest.raises(HandlerLoadError) as info:
        load_handler(spec, timeout_s=1)
    assert fragment in str(info.value)


def test_loader_wraps_import_error() -> None:
    with pytest.raises(HandlerLoadError) as info:
        load_handler("python:tests.no_such_module_xyz:ok", timeout_s=1)
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_loader_redacts_credentials_in_errors() -> None:
    with pytest.raises(HandlerLoadError) as info:
        load_handler("gopher://user:hunter2@host/x", timeout_s=1)
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_loader_rejects_bad_timeout(timeout: float) -> None:
    with pytest.raises(HandlerLoadError, match="timeout"):
        load_handler("python:tests.handlers_for_tests:ok", timeout_s=timeout)
