"""Batch handler adapters (``handle_batch``), the loader's batch mode and the
``handler_batch`` setting: per-record outcomes, and what a call that goes wrong as a whole
gives every record of it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

import retryd
from retryd.config import load_settings
from retryd.errors import ConfigError, HandlerLoadError, NonRetryableError
from retryd.handlers.base import Message, is_async_handler, is_batch_handler
from retryd.handlers.loader import load_handler
from retryd.handlers.python_batch import (
    BAD_ANSWER,
    AsyncPythonBatchHandler,
    PythonBatchHandler,
    SyncPythonBatchHandler,
)
from retryd.policy.classify import HandlerResult, Outcome

MSGS = [
    Message(key=b"k%d" % i, value=b"v", topic="orders", partition=1, offset=i) for i in range(4)
]


class Declined(Exception):
    pass


def _sync(answer: Any, **kw: Any) -> Sequence[HandlerResult]:
    def handle_batch(records: list[Message]) -> Any:
        assert [m.offset for m in records] == [0, 1, 2, 3]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    handler = PythonBatchHandler(handle_batch, timeout_s=1.0, max_batch=8, **kw)
    assert isinstance(handler, SyncPythonBatchHandler)
    return handler.call_batch(MSGS)


def _async(answer: Any, **kw: Any) -> Sequence[HandlerResult]:
    async def handle_batch(records: list[Message]) -> Any:
        await asyncio.sleep(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    handler = PythonBatchHandler(handle_batch, timeout_s=1.0, max_batch=8, **kw)
    assert isinstance(handler, AsyncPythonBatchHandler)
    return asyncio.run(handler.acall_batch(MSGS))


@pytest.fixture(params=["def", "async def"])
def call(request: pytest.FixtureRequest) -> Any:
    return _sync if request.param == "def" else _async


def test_per_record_outcomes(call: Any) -> None:
    results = call(
        [None, True, Declined("no funds"), NonRetryableError("poison")],
    )
    assert [r.outcome for r in results] == [
        Outcome.SUCCESS,
        Outcome.SUCCESS,
        Outcome.RETRY,
        Outcome.DEAD,
    ]
    assert results[2].error_class.endswith("Declined")
    assert results[2].error_message == "no funds"
    assert results[2].error_type is Declined  # error routes match the class


def test_explicit_retry_and_dead_carry_their_reason_as_error_class(call: Any) -> None:
    results = call([retryd.Retry("rate_limited"), retryd.Dead("bad_iban"), None, None])
    assert (results[0].outcome, results[0].error_class) == (Outcome.RETRY, "rate_limited")
    assert (results[1].outcome, results[1].error_class) == (Outcome.DEAD, "bad_iban")


def test_non_retryable_names_an_exception_class_dead(call: Any) -> None:
    results = call([Declined("x"), None, None, None], non_retryable=["Declined"])
    assert results[0].outcome is Outcome.DEAD


def test_none_as_the_whole_answer_is_every_record_succeeded(call: Any) -> None:
    assert [r.outcome for r in call(None)] == [Outcome.SUCCESS] * 4


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        ([None, None], "returned 2 outcomes for 4 records"),
        ("oops", "returned a str"),
        (42, "returned a int"),
        ([None, "fine", None, None], "returned 'fine' for orders[1]@1"),
    ],
)
def test_an_unreadable_answer_retries_every_record_and_says_why_once(
    call: Any, answer: Any, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="retryd.handlers.python_batch")
    results = call(answer)
    assert [(r.outcome, r.error_class) for r in results] == [(Outcome.RETRY, BAD_ANSWER)] * 4
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "orders[1]@0 (+3 more)" in errors[0].getMessage()
    assert kind in errors[0].getMessage()


def test_a_raised_exception_is_every_record_result_logged_once_per_kind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handle_batch(records: list[Message]) -> Any:
        raise Declined("database down")

    handler = PythonBatchHandler(handle_batch, timeout_s=1.0, max_batch=8)
    assert isinstance(handler, SyncPythonBatchHandler)
    with caplog.at_level(logging.DEBUG, logger="retryd.handlers.python_batch"):
        for _ in range(3):
            results = handler.call_batch(MSGS)
            assert {r.outcome for r in results} == {Outcome.RETRY}
            assert {r.error_message for r in results} == {"database down"}
    assert sum(1 for r in caplog.records if r.levelno == logging.ERROR) == 1
    dead = _sync(NonRetryableError("bad schema"))
    assert {r.outcome for r in dead} == {Outcome.DEAD}


def test_exit_signals_raised_by_business_code_are_retryable(call: Any) -> None:
    assert {r.outcome for r in call(KeyboardInterrupt())} == {Outcome.RETRY}
    assert {r.outcome for r in call(SystemExit(3))} == {Outcome.RETRY}


def test_loader_builds_batch_handlers_only_when_asked() -> None:
    spec = "python:tests.handlers_for_tests:ok"
    single = load_handler(spec, timeout_s=1.0)
    assert not is_batch_handler(single)
    batch = load_handler(spec, timeout_s=1.0, batch=50, non_retryable=["Declined"])
    assert is_batch_handler(batch) and not is_async_handler(batch)
    assert batch.max_batch == 50  # type: ignore[union-attr]
    with pytest.raises(HandlerLoadError):
        load_handler(spec, timeout_s=1.0, batch=-1)


def test_loader_bulk_http_mode_or_a_clear_error() -> None:
    try:
        import retryd.handlers.http_bulk  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(HandlerLoadError, match="bulk HTTP mode not available"):
            load_handler("http://127.0.0.1:9/handle", timeout_s=1.0, batch=10)
    else:
        handler = load_handler("http://127.0.0.1:9/handle", timeout_s=1.0, batch=10)
        assert is_batch_handler(handler) and is_async_handler(handler)
    with pytest.raises(HandlerLoadError, match="bad handler URL"):
        load_handler("http://", timeout_s=1.0, batch=10)


def test_handler_batch_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(main_topics="orders").handler_batch == 0
    monkeypatch.setenv("RETRYD_HANDLER_BATCH", "200")
    assert load_settings(main_topics="orders").handler_batch == 200
    monkeypatch.delenv("RETRYD_HANDLER_BATCH")
    with pytest.raises(ConfigError, match="handler_batch"):
        load_settings(main_topics="orders", handler_batch=-1)
    with pytest.raises(ConfigError, match="quick retries"):
        load_settings(main_topics="orders", handler_batch=10, retry_sequence="5m, quick=2@10ms")
