"""Set up OpenTelemetry for an agent: a tracer provider whose spans go to Kafka.

spanmill does not have a tracer of its own. :func:`configure` builds a standard
OpenTelemetry SDK ``TracerProvider`` with a ``BatchSpanProcessor`` around a
:class:`~spanmill.sdk.exporter.KafkaSpanExporter`, and (unless told otherwise)
installs it as the global provider, so any other OpenTelemetry instrumentation in
the agent (HTTP clients, GenAI instrumentations) lands in the same traces.

An agent that already configures OpenTelemetry itself can skip :func:`configure`:
the episode helpers then use the global provider, and adding
``BatchSpanProcessor(KafkaSpanExporter(...))`` to that provider sends the spans
to spanmill.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.util.types import AttributeValue

from spanmill import __version__
from spanmill import semconv as sc
from spanmill.config import KafkaSettings
from spanmill.sdk.exporter import KafkaSpanExporter

logger = logging.getLogger(__name__)

INSTRUMENTATION_SCOPE: Final = "spanmill.sdk"


@dataclass
class _State:
    provider: TracerProvider | None = None
    agent_name: str | None = None


_state = _State()
_lock = threading.Lock()


def configure(
    service_name: str,
    *,
    kafka: KafkaSettings | None = None,
    agent_name: str | None = None,
    exporter: SpanExporter | None = None,
    resource_attributes: Mapping[str, AttributeValue] | None = None,
    schedule_delay_ms: int = 500,
    set_global: bool = True,
) -> TracerProvider:
    """Trace this process's agent episodes to Kafka; returns the tracer provider.

    ``service_name`` becomes the resource's ``service.name``. ``kafka`` says how to
    reach Kafka (default: the ``SPANMILL_KAFKA_*`` environment); ``exporter``
    replaces the Kafka exporter altogether (a console or in-memory exporter, say).
    ``agent_name`` is the default name of :func:`~spanmill.sdk.episode`.
    ``schedule_delay_ms`` is how long finished spans may wait to be batched.

    Calling it again replaces the earlier configuration, flushing what it held.
    With ``set_global`` the provider also becomes OpenTelemetry's global one, which
    OpenTelemetry allows once per process; later calls keep the first global.
    """
    if not service_name:
        raise ValueError("service_name must not be empty: it names the agent's service")
    resource = Resource.create({**(resource_attributes or {}), sc.SERVICE_NAME: service_name})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter if exporter is not None else KafkaSpanExporter(kafka),
            schedule_delay_millis=schedule_delay_ms,
        )
    )
    with _lock:
        previous, _state.provider = _state.provider, provider
        _state.agent_name = agent_name
    if previous is not None:
        previous.shutdown()
    if set_global:
        current = trace.get_tracer_provider()
        if isinstance(current, trace.ProxyTracerProvider):
            trace.set_tracer_provider(provider)
        elif current is not previous:
            logger.warning(
                "OpenTelemetry already has a global tracer provider (%s); spanmill's "
                "episodes use their own, other instrumentation keeps the existing one",
                type(current).__name__,
            )
    return provider


def get_tracer() -> trace.Tracer:
    """The tracer the episode helpers use: the configured provider's, else the global one."""
    provider = _state.provider
    if provider is not None:
        return provider.get_tracer(INSTRUMENTATION_SCOPE, __version__)
    return trace.get_tracer(INSTRUMENTATION_SCOPE, __version__)


def default_agent_name() -> str | None:
    return _state.agent_name


def force_flush(timeout_s: float = 30.0) -> bool:
    """Export every finished span now; False when it did not finish in time."""
    provider = _state.provider
    if provider is None:
        return True
    return provider.force_flush(int(timeout_s * 1000))


def shutdown() -> None:
    """Flush and close what :func:`configure` set up; call it before the process exits."""
    with _lock:
        provider, _state.provider = _state.provider, None
        _state.agent_name = None
    if provider is not None:
        provider.shutdown()
