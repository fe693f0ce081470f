"""Importable business handlers for handler-loader tests (``python:tests.handlers_for_tests:…``)."""

from __future__ import annotations

from retryd.handlers.base import Message

CALLS: list[Message] = []
not_callable = 42


def ok(message: Message) -> None:
    CALLS.append(message)


async def async_ok(message: Message) -> None:
    CALLS.append(message)


def fail(message: Message) -> None:
    raise ValueError(f"cannot handle offset {message.offset}")


class Namespace:
    @staticmethod
    def nested(message: Message) -> str:
        return "ignored return value"
