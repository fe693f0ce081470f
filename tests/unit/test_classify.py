"""Error classification: HTTP status / body overrides, exceptions, error class names."""

from __future__ import annotations

import json

import pytest

from retryd.errors import NonRetryableError
from retryd.policy.classify import (
    HandlerResult,
    Outcome,
    body_status,
    classify_exception,
    classify_http,
    error_class_name,
    timeout_result,
)

JSON = "application/json"


def js(word: str) -> bytes:
    return json.dumps({"status": word}).encode()


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.SUCCESS),
        (201, Outcome.SUCCESS),
        (204, Outcome.SUCCESS),
        (299, Outcome.SUCCESS),
        (100, Outcome.RETRY),
        (301, Outcome.RETRY),  # redirects are not followed: a misconfiguration, keep the message
        (302, Outcome.RETRY),
        (400, Outcome.DEAD),
        (401, Outcome.DEAD),
        (404, Outcome.DEAD),
        (409, Outcome.DEAD),
        (422, Outcome.DEAD),
        (408, Outcome.RETRY),
        (429, Outcome.RETRY),
        (500, Outcome.RETRY),
        (502, Outcome.RETRY),
        (503, Outcome.RETRY),
        (504, Outcome.RETRY),
    ],
)
def test_status_codes(status: int, outcome: Outcome) -> None:
    result = classify_http(status, b"", None)
    assert result.outcome is outcome
    if outcome is Outcome.SUCCESS:
        assert result.error_class is None
    else:
        assert result.error_class == f"http_{status}"
        assert result.error_message == f"HTTP {status}"


def test_error_message_is_body_snippet() -> None:
    result = classify_http(503, b"upstream down" + b"x" * 2000, "text/plain")
    assert result.error_message is not None
    assert result.error_message.startswith("upstream down")
    assert len(result.error_message) == 512


def test_binary_body_snippet_does_not_raise() -> None:
    result = classify_http(500, b"\xff\xfe\x00", "application/octet-stream")
    assert result.outcome is Outcome.RETRY
    assert result.error_message is not None


@pytest.mark.parametrize(
    ("status", "word", "outcome"),
    [
        (500, "SUCCESS", Outcome.SUCCESS),
        (404, "SUCCESS", Outcome.SUCCESS),
        (200, "DEAD", Outcome.DEAD),
        (200, "RETRY", Outcome.RETRY),
        (400, "RETRY", Outcome.RETRY),
        (200, "DROP", Outcome.DROP),
        (503, "DROP", Outcome.DROP),
        (503, "dead", Outcome.DEAD),  # words are case-insensitive
        (200, "success", Outcome.SUCCESS),
    ],
)
def test_json_status_overrides(status: int, word: str, outcome: Outcome) -> None:
    result = classify_http(status, js(word), JSON)
    assert result.outcome is outcome
    if outcome in (Outcome.RETRY, Outcome.DEAD):
        assert result.error_class == f"http_{status}"
        assert result.error_message is not None and word.upper() in result.error_message
    else:
        assert result.error_class is None


def test_json_override_with_charset_content_type() -> None:
    assert classify_http(200, js("DEAD"), "application/json; charset=utf-8").outcome is Outcome.DEAD
    assert classify_http(200, js("DEAD"), "application/problem+json").outcome is Outcome.DEAD


def test_json_without_content_type_still_overrides() -> None:
    assert classify_http(200, js("RETRY"), None).outcome is Outcome.RETRY


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (js("DEAD"), "text/plain"),  # JSON-looking body in a non-JSON response
        (b"DEAD", "text/plain"),
        (b"DEAD", JSON),  # invalid JSON
        (b'{"status": "DEAD"', JSON),  # truncated JSON
        (b"\xff\xfe", JSON),  # not UTF-8
        (b'["DEAD"]', JSON),  # not an object
        (b'{"status": 3}', JSON),  # not a string
        (b'{"status": "MAYBE"}', JSON),  # unknown word
        (b'{"state": "DEAD"}', JSON),  # other key
        (b"", JSON),
    ],
)
def test_bodies_that_do_not_override(body: bytes, content_type: str) -> None:
    assert body_status(body, content_type) is None
    assert classify_http(200, body, content_type).outcome is Outcome.SUCCESS
    assert classify_http(404, body, content_type).outcome is Outcome.DEAD
    assert classify_http(503, body, content_type).outcome is Outcome.RETRY


class Declined(Exception):
    pass


class HardDeclined(Declined):
    pass


class Permanent(NonRetryableError):
    pass


def test_classify_exception_retry_by_default() -> None:
    result = classify_exception(ValueError("bad"))
    assert result == HandlerResult(Outcome.RETRY, "ValueError", "bad")


def test_classify_exception_non_retryable_subclass() -> None:
    result = classify_exception(Permanent("no"))
    assert result == HandlerResult(Outcome.DEAD, f"{__name__}.Permanent", "no")
    assert classify_exception(NonRetryableError("x")).outcome is Outcome.DEAD


@pytest.mark.parametrize(
    "names",
    [
        ["Declined"],
        [f"{__name__}.Declined"],
        ["HardDeclined"],
        [f"{__name__}.HardDeclined"],
        ["Exception"],  # a listed base class covers subclasses
    ],
)
def test_classify_exception_listed_names(names: list[str]) -> None:
    assert classify_exception(HardDeclined("x"), names).outcome is Outcome.DEAD


@pytest.mark.parametrize("names", [[], ["HardDeclined"], ["other.module.Declined"], ["declined"]])
def test_classify_exception_unlisted_names(names: list[str]) -> None:
    assert classify_exception(Declined("x"), names).outcome is Outcome.RETRY


def test_classify_exception_empty_message_uses_repr() -> None:
    result = classify_exception(KeyError())
    assert result.error_message == "KeyError()"


def test_classify_base_exception() -> None:
    result = classify_exception(GeneratorExit())
    assert (result.outcome, result.error_class) == (Outcome.RETRY, "GeneratorExit")


def test_error_class_name() -> None:
    assert error_class_name(ValueError()) == "ValueError"
    assert error_class_name(HardDeclined()) == f"{__name__}.HardDeclined"
    assert error_class_name(json.JSONDecodeError("m", "d", 0)) == "json.decoder.JSONDecodeError"

    class Local(Exception):
        pass

    assert error_class_name(Local()).endswith("test_error_class_name.<locals>.Local")


def test_timeout_result() -> None:
    result = timeout_result(2.5)
    assert (result.outcome, result.error_class) == (Outcome.RETRY, "timeout")
    assert result.error_message == "handler did not finish within 2.5s"


def test_success_is_shared() -> None:
    assert HandlerResult.success() is HandlerResult.success()
    assert HandlerResult.success().outcome is Outcome.SUCCESS
