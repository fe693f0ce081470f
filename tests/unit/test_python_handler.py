"""Python handler adapters driven through the worker's real pools, and load_handler: outcomes,
timeouts, abandoned threads and loops, exit signals that must not stop a worker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from retryd.errors import HandlerLoadError, NonRetryableError
from retryd.handlers import python_handler
from retryd.handlers.base import Message
from retryd.handlers.http_handler import HttpHandler
from retryd.handlers.loader import load_handler
from retryd.handlers.python_handler import (
    AsyncPythonHandler,
    PythonHandler,
    SyncPythonHandler,
)
from retryd.policy.classify import HandlerResult, Outcome
from retryd.worker import loop_pool
from tests import handlers_for_tests
from tests.pool_support import Harness, work_of
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


class Called:
    """A handler adapter behind a real pool: ``called(message)`` is one call as the worker
    makes it (timeout enforced by the pool)."""

    def __init__(self, func: Callable[[Message], Any], **kw: Any) -> None:
        timeout_s = kw.setdefault("timeout_s", 5.0)
        self.adapter = PythonHandler(func, **kw)
        self.harness = Harness(self.adapter, max_in_flight=4, timeout_s=timeout_s)

    def __call__(self, message: Message) -> HandlerResult:
        return self.harness.call(message)

    @property
    def abandoned(self) -> int:
        """Abandoned calls still running."""
        return self.harness.pool.hung

    def close(self) -> None:
        self.harness.close()


@pytest.fixture
def make() -> Iterator[Callable[..., Called]]:
    made: list[Called] = []

    def factory(func: Callable[[Message], Any], **kw: Any) -> Called:
        called = Called(func, **kw)
        made.append(called)
        return called

    yield factory
    for called in made:
        called.close()


def raiser(exc: BaseException) -> Callable[[Message], None]:
    def func(message: Message) -> None:
        raise exc

    return func


def test_success_ignores_return_value(make: Callable[..., Called]) -> None:
    seen: list[Message] = []

    def func(message: Message) -> str:
        seen.append(message)
        return "DEAD"

    result = make(func)(MSG)
    assert result.outcome is Outcome.SUCCESS
    assert result.error_class is None
    assert [(m.topic, m.partition, m.offset, m.key, m.value) for m in seen] == [
        ("orders", 2, 41, b"k", b"v")
    ]


def test_exception_is_retryable(make: Callable[..., Called]) -> None:
    result = make(raiser(ValueError("bad amount")))(MSG)
    assert result.outcome is Outcome.RETRY
    assert result.error_class == "ValueError"
    assert result.error_message == "bad amount"


def test_non_retryable_error_subclass_is_dead(make: Callable[..., Called]) -> None:
    result = make(raiser(Permanent("gone")))(MSG)
    assert result.outcome is Outcome.DEAD
    assert result.error_class == f"{__name__}.Permanent"


@pytest.mark.parametrize(
    "names",
    [["PaymentDeclined"], [f"{__name__}.PaymentDeclined"], ["CardExpired"], ["KeyError", "X"]],
)
def test_names_in_non_retryable_list_are_dead(
    make: Callable[..., Called], names: list[str]
) -> None:
    exc: Exception = KeyError("k") if "KeyError" in names else CardExpired("expired")
    result = make(raiser(exc), non_retryable=names)(MSG)
    assert result.outcome is Outcome.DEAD


def test_unlisted_exception_stays_retryable(make: Callable[..., Called]) -> None:
    result = make(raiser(PaymentDeclined("x")), non_retryable=["CardExpired", "x.PaymentDeclined"])(
        MSG
    )
    assert result.outcome is Outcome.RETRY


@pytest.mark.parametrize("exc", [Custom("odd"), GeneratorExit()])
def test_base_exceptions_are_caught(make: Callable[..., Called], exc: BaseException) -> None:
    handler = make(raiser(exc))
    result = handler(MSG)
    assert result.outcome is Outcome.RETRY
    assert result.error_class in (f"{__name__}.Custom", "GeneratorExit")
    # the worker survived and serves the next call
    assert handler(MSG).outcome is Outcome.RETRY


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
def test_exit_signals_are_retryable_failures_not_exits(
    make: Callable[..., Called], exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    # A record must never be able to stop a worker: a handler raising SystemExit on one
    # message would otherwise stop it again after every restart.
    handler = make(raiser(exc))
    result = handler(MSG)
    assert result.outcome is Outcome.RETRY
    assert result.error_class == type(exc).__name__
    assert "orders[2]@41" in caplog.text
    assert handler(MSG).outcome is Outcome.RETRY  # and the pool still serves calls


def test_worker_thread_is_reused(make: Callable[..., Called]) -> None:
    threads: list[threading.Thread] = []
    handler = make(lambda m: threads.append(threading.current_thread()))
    for _ in range(5):
        handler(MSG)
    assert len(set(threads)) == 1
    assert threads[0].daemon
    assert threads[0] is not threading.current_thread()


def test_hung_call_times_out_and_its_thread_is_abandoned(
    make: Callable[..., Called],
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
        assert elapsed >= 0.15  # it waited for its timeout; it returned while the call hangs:
        assert not release.is_set() and threads[b"hang"].is_alive()
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


def test_concurrent_calls_get_their_own_threads(make: Callable[..., Called]) -> None:
    barrier = threading.Barrier(2, timeout=5)  # both calls must be in flight at once
    handler = make(lambda m: barrier.wait())
    h = handler.harness
    h.submit([(None, [work_of(MSG)]), (None, [work_of(MSG)])])
    done = h.collect(2)
    assert [w.result.outcome for w in done if w.result] == [Outcome.SUCCESS] * 2


def test_close_stops_idle_workers() -> None:
    threads: list[threading.Thread] = []
    called = Called(lambda m: threads.append(threading.current_thread()), timeout_s=5)
    called(MSG)
    called.close()
    threads[0].join(5)
    assert not threads[0].is_alive()


# -- async --------------------------------------------------------------------------------------


def test_async_success(make: Callable[..., Called]) -> None:
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
    make: Callable[..., Called], exc: BaseException, outcome: Outcome, error_class: str
) -> None:
    async def func(message: Message) -> None:
        raise exc

    handler = make(func)
    result = handler(MSG)
    assert (result.outcome, result.error_class) == (outcome, error_class)
    assert handler(MSG).outcome is outcome  # the loop survived


def test_async_system_exit_is_a_retryable_failure(make: Callable[..., Called]) -> None:
    async def func(message: Message) -> None:
        raise SystemExit(1)

    handler = make(func)
    assert handler(MSG).error_class == "SystemExit"
    assert handler(MSG).outcome is Outcome.RETRY  # and the loop is still alive


def test_async_hang_is_really_cancelled(make: Callable[..., Called]) -> None:
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
    assert time.monotonic() - start < 30  # at its timeout, not when the call would have ended
    assert (result.outcome, result.error_class) == (Outcome.RETRY, "timeout")
    assert cancelled.wait(5)
    assert handler.abandoned == 0


def test_async_blocking_loop_is_abandoned(
    make: Callable[..., Called], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop_pool, "ASYNC_CANCEL_GRACE_S", 0.2)
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


def test_sync_callable_returning_coroutine_is_awaited(make: Callable[..., Called]) -> None:
    async def inner(message: Message) -> None:
        raise ValueError("from coroutine")

    result = make(lambda m: inner(m))(MSG)
    assert (result.outcome, result.error_class) == (Outcome.RETRY, "ValueError")


def test_async_callable_object(make: Callable[..., Called]) -> None:
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
        assert isinstance(handler, SyncPythonHandler | AsyncPythonHandler)
        harness = Harness(handler, timeout_s=2)
        try:
            assert harness.call(MSG).outcome is Outcome.SUCCESS, spec
        finally:
            harness.close()
    assert isinstance(
        load_handler("python:tests.handlers_for_tests:async_ok", timeout_s=2), AsyncPythonHandler
    )
    handler = load_handler(
        "python:tests.handlers_for_tests:fail", timeout_s=2, non_retryable=["ValueError"]
    )
    assert isinstance(handler, SyncPythonHandler)
    assert handler.call(MSG).outcome is Outcome.DEAD
    assert [m.offset for m in handlers_for_tests.CALLS[-2:]] == [41, 41]


def test_load_http_handler_does_no_io() -> None:
    handler = load_handler(
        "http://user:secret@127.0.0.1:1/hook?token=x", timeout_s=2, max_in_flight=64
    )
    assert isinstance(handler, HttpHandler)
    assert handler.max_connections == 64  # the keep-alive pool fits the calls in flight
    assert "secret" not in handler.url and "token" not in handler.url


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


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_record_of_a_closed_assignment_never_starts(kind: str) -> None:
    """A revoke closes the partition under the lifecycle lock, and a slot claims under the
    same lock: once closed, a queued record of it never starts (its next owner runs it), and
    a record claimed before the close counts as running for the revoke to wait on."""
    from retryd.worker.partition import PartitionState

    calls: list[int] = []

    def sync_handler(message: Message) -> None:
        calls.append(message.offset)

    async def async_handler(message: Message) -> None:
        calls.append(message.offset)

    func = sync_handler if kind == "sync" else async_handler
    harness = Harness(PythonHandler(func, timeout_s=5.0))
    try:
        part = PartitionState("orders", 2, None)
        harness.lifecycle.close(part, 0)
        w = work_of(MSG, part)
        harness.submit([(None, [w])])
        open_part = PartitionState("orders", 3, None)
        harness.submit([(None, [work_of(MSG, open_part)])])
        harness.collect(0)
        wait_for(lambda: open_part.running == 0 and len(calls) == 1, 5, what="one call")
        assert w.result is None and w.attempt == 0 and part.running == 0
    finally:
        harness.close()


class _Suspend:
    """An awaitable that suspends once: a call in the middle of its await."""

    def __await__(self) -> Any:
        yield


@pytest.mark.parametrize("batch", [False, True])
def test_closing_a_suspended_async_call_is_no_answer(
    batch: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A call frozen in an abandoned (stopped) event loop is closed when the garbage collector
    finalises its task (``GeneratorExit``). The adapter lets that through: no failure is
    logged or returned for the record (the worker already runs it again elsewhere)."""
    from retryd.handlers.python_batch import PythonBatchHandler

    async def handle(m: Any) -> None:
        await _Suspend()

    handler: Any = (
        PythonBatchHandler(handle, timeout_s=1.0, max_batch=2)
        if batch
        else PythonHandler(handle, timeout_s=1.0)
    )
    coro = handler.acall_batch([MSG]) if batch else handler.acall(MSG)
    coro.send(None)  # suspended inside the business code
    with caplog.at_level("DEBUG"), pytest.raises(GeneratorExit):
        coro.throw(GeneratorExit())  # what close() does; swallowed, a result would come back
    assert not [r for r in caplog.records if "GeneratorExit" in r.getMessage()]
