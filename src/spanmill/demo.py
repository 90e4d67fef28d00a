"""The one-machine demo: the embedded stack, a champion in service, agent traffic.

Each step is a function so that the flywheel steps (dataset, training,
evaluation, registration, rollout) can join the same walk-through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spanmill.config import KafkaSettings, StackSettings
from spanmill.gateway.routing import RoutingFile, RoutingTable
from spanmill.models import pull_model
from spanmill.serving.repository import versions, write_python_version
from spanmill.stack.local import LocalStack
from spanmill.stack.services import RunningService

AGENT = "calculator"


@dataclass(frozen=True)
class Deployed:
    model: str
    version: int
    base_model: Path


def start_stack(
    settings: StackSettings, on_started: Callable[[RunningService], None] | None = None
) -> list[RunningService]:
    return LocalStack(settings).up(on_started=on_started)


def serve_base_as_champion(settings: StackSettings, base: str = "smollm2-135m") -> Deployed:
    """Serve the base model as version 1 of the agent's Triton model, all traffic to it.

    Idempotent: a version 1 already in the repository is loaded as it is.
    """
    import tritonclient.http as triton_http

    base_dir = pull_model(base)
    repository = settings.model_repository
    if 1 not in versions(repository, AGENT):
        write_python_version(repository, AGENT, 1, base_dir)
    client = triton_http.InferenceServerClient(
        f"{settings.host}:{settings.triton_http_port}", network_timeout=600
    )
    client.load_model(AGENT)
    routes = RoutingFile(settings.routing_file)
    current = routes.current()
    table = RoutingTable.model_validate(
        {
            "revision": current.revision + 1,
            "routes": {
                **{k: v.model_dump() for k, v in current.routes.items()},
                AGENT: {"triton_model": AGENT, "backends": [{"version": "1", "weight": 1}]},
            },
        }
    )
    routes.write(table)
    return Deployed(AGENT, 1, base_dir)


def spans_on_topic(kafka: KafkaSettings) -> int:
    """How many messages the span topic holds (the end offsets, summed)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**kafka.client_options())
    try:
        partitions = consumer.partitions_for_topic(kafka.spans_topic) or set()
        ends = consumer.end_offsets([TopicPartition(kafka.spans_topic, p) for p in partitions])
        return int(sum(ends.values()))
    finally:
        consumer.close()
