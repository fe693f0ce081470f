"""Reading a consumed record's headers on the poll thread without trusting them.

confluent-kafka decodes header *names* as UTF-8 when ``headers()`` is called: on a name that
is not UTF-8 it raises, and asked again it returns a list whose tuples for such names hold
NULL, which crashes the interpreter when touched. So the engine reads a record's headers
exactly once, through its ``Message`` (which keeps them), and what a record carries becomes a
reason to dead-letter it, never an exception in the loop.
"""

from __future__ import annotations

from retryd.handlers.base import Message

Headers = list[tuple[str, bytes | None]]


def readable_headers(msg: Message) -> tuple[Headers, str | None]:
    """``(headers, None)``, or ``(the readable ones, why some could not be read)``."""
    return msg.headers, msg.headers_problem
