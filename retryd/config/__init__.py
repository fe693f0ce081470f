"""Configuration lives at the edge: one frozen Settings object, read once by the CLI."""

from retryd.config.settings import (
    GroupProtocol,
    Ordering,
    Role,
    Settings,
    TierConsumer,
    load_settings,
    redact_kafka,
)

__all__ = [
    "GroupProtocol",
    "Ordering",
    "Role",
    "Settings",
    "TierConsumer",
    "load_settings",
    "redact_kafka",
]
