"""The ``Tracing`` collaborator's contract, and its disabled form (``NO_TRACING``).

A disabled ``Tracing`` does nothing at all: ``wrap`` hands the handler back unchanged (so
handler calls run exactly as without tracing, with no per-record work), ``stamp`` is never
called (the settler checks ``enabled`` once per routed copy) and a record's headers, its
``traceparent`` included, travel as they always did. ``retryd.tracing.spans.SpanTracing`` is
the enabled form, built by ``retryd.tracing.setup.tracing_from_env``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from retryd.handlers.base import Handler, Message
    from retryd.policy.headers import Headers
    from retryd.policy.routing import Route


class Tracing:
    """Tracing switched off: every method is free and changes nothing."""

    enabled = False

    def wrap(self, handler: Handler, group: str) -> Handler:
        """The handler whose calls are spans (this one: ``handler`` itself)."""
        return handler

    def stamp(self, message: Message, route: Route) -> None:
        """Give ``route``'s copy the trace headers of the call that routed it (nothing here)."""

    def replay_headers(self, headers: Headers, target: str) -> Headers:
        """A replayed copy's headers with a fresh ``traceparent`` in the dead letter's trace
        (here: unchanged, so a ``traceparent`` the dead letter carries travels on as it is)."""
        return headers

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export what is still buffered and stop (nothing here)."""


NO_TRACING = Tracing()
