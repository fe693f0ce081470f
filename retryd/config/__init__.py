"""Configuration lives at the edge: one frozen Settings object, read once by the CLI."""

from retryd.config.settings import (
    ConsumerMode,
    GroupProtocol,
    Ordering,
    Role,
    Settings,
    TierConsumer,
    load_settings,
    redact_kafka,
)

__all__ = [
    "ConsumerMode",
    "GroupProtocol",
    "Ordering",
    "Role",
    "Settings",
    "TierConsumer",
    "load_settings",
    "redact_kafka",
]
