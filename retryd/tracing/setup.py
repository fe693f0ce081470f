"""Building the ``Tracing`` collaborator once, at start-up, from the standard OTEL_* variables.

Tracing is on only when both hold:

* the optional ``tracing`` extra is installed (``pip install 'retryd[tracing]'``: the
  OpenTelemetry SDK and its OTLP/HTTP exporter), and
* the environment asks for traces: ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp`` or
  ``console``), or an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_ENDPOINT``). ``OTEL_TRACES_EXPORTER=none`` and
  ``OTEL_SDK_DISABLED=true`` switch it off whatever else is set.

Everything else is the SDK's own handling of its variables: the exporter reads
``OTEL_EXPORTER_OTLP_*`` (endpoint, headers, timeout, compression, certificates), the batch
processor ``OTEL_BSP_*``, the sampler ``OTEL_TRACES_SAMPLER(_ARG)``, the resource
``OTEL_RESOURCE_ATTRIBUTES``. ``service.name`` is ``OTEL_SERVICE_NAME``, else ``retryd``.

Asked for but not installed, tracing stays off with one warning: a worker never fails to start
over its traces. Nothing read here (headers of the exporter above all) is logged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from retryd import __version__
from retryd.tracing.base import NO_TRACING, Tracing

log = logging.getLogger(__name__)

EXPORTERS = ("otlp", "console")


def tracing_wanted(environ: Mapping[str, str]) -> list[str]:
    """The exporters the environment asks for (empty: tracing off). Pure."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [
        n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()
    ]
    if "none" in names:
        return []
    if not names:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint and endpoint.strip() else []
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        log.warning(
            "OTEL_TRACES_EXPORTER: %s not supported (supported: %s); ignored",
            ", ".join(sorted(set(unknown))[:5])[:200],
            ", ".join(EXPORTERS),
        )
    return [n for n in dict.fromkeys(names) if n in EXPORTERS]


def tracing_from_env(
    environ: Mapping[str, str] | None = None, *, install_global: bool = False
) -> Tracing:
    """The ``Tracing`` this process runs with: ``NO_TRACING`` unless the environment asks for
    traces and the SDK is installed (see the module docstring). ``install_global`` (workers)
    also makes its provider OpenTelemetry's global one, so spans a Python handler makes with
    ``opentelemetry.trace.get_tracer`` go the same way (once per process: the API keeps the
    first). The sidecar and the replay CLI leave it alone: instrumented libraries there (the
    HTTP framework traces its own requests when a global provider is set) would turn every
    health probe into a trace."""
    env = os.environ if environ is None else environ
    exporters = tracing_wanted(env)
    if not exporters:
        return NO_TRACING
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )

        from retryd.tracing.spans import SpanTracing
    except ImportError as exc:
        log.warning(
            "tracing is asked for (OTEL_* variables) but the tracing extra is not installed "
            "(%s): install it with pip install 'retryd[tracing]'; running without traces",
            exc.name or exc,
        )
        return NO_TRACING
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if "otlp" in exporters and protocol.strip() != "http/protobuf":
        log.warning("OTLP protocol %r not supported: spans are sent over http/protobuf", protocol)
    resource = Resource.create({"service.version": __version__})
    if not env.get("OTEL_SERVICE_NAME") and str(
        resource.attributes.get("service.name", "")
    ).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "retryd"}))
    provider = TracerProvider(resource=resource)
    for name in exporters:
        exporter: SpanExporter
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        else:
            exporter = ConsoleSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if install_global:
        from opentelemetry import trace

        trace.set_tracer_provider(provider)
    log.info(
        "tracing on: service %s, exporters %s",
        resource.attributes.get("service.name"),
        ", ".join(exporters),
    )
    return SpanTracing(provider)
