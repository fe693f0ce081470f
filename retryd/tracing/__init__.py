"""Distributed tracing with OpenTelemetry (the optional ``tracing`` extra): one trace per
message across every hop (main topic, tiers, dead letter, replay). ``tracing_from_env``
builds the ``Tracing`` collaborator once per process; off, it costs nothing per record.
Importing this package never imports OpenTelemetry."""

from retryd.tracing.base import NO_TRACING, Tracing
from retryd.tracing.setup import tracing_from_env

__all__ = ["NO_TRACING", "Tracing", "tracing_from_env"]
