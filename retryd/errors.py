"""One error hierarchy for retryd: callers catch ``RetrydError`` and get a readable message."""

from __future__ import annotations


class RetrydError(Exception):
    """Base of every error retryd raises on purpose."""


class SetupError(RetrydError):
    """The worker cannot start as configured: restarting it changes nothing (exit 4)."""


class RuntimeFault(RetrydError):
    """Something went wrong while running; a restart (with backoff) is the remedy."""


class ConfigError(SetupError):
    """A setting is invalid; ``problems`` holds one readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class SequenceError(ConfigError):
    """The retry sequence (``5m,30m,…``) cannot be parsed."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


class HeaderError(RetrydError):
    """A retryd header is missing or unparsable (the message is dead-lettered as malformed)."""


class HandlerLoadError(SetupError):
    """The handler spec does not point at something callable or reachable."""


class KafkaSetupError(SetupError):
    """Topics are missing or mis-sized, or a client cannot be configured."""


class KafkaRuntimeError(RuntimeFault):
    """The cluster cannot be reached, or a client hit a fatal error while running."""


class DeliveryError(RuntimeFault):
    """A routed copy could not be delivered; its input offset stays uncommitted."""


class HungHandlersError(RuntimeFault):
    """More handler calls are hung past their timeout than ``max_abandoned_handlers``: only a
    new process frees their threads."""


class BrokerStartError(RetrydError):
    """The embedded broker binary is missing or did not start."""


class NonRetryableError(Exception):
    """Raise (or subclass) this in a handler to dead-letter the message at once.

    Deliberately not a ``RetrydError``: it is a signal from business code, not a retryd failure.
    """


class TimeSpecError(RetrydError):
    """A point in time or a duration (``--since 2h``, ``--until 2024-05-01``) cannot be parsed."""
