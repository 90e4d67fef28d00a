"""Helpers for the support agent's tests: importing it, undoing its instrumentation, and
the gateway and collector it talks to."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AGENT_DIR = Path(__file__).resolve().parents[1] / "examples" / "support_agent"
# The agent is a folder of its own, not an installed package: import it from there.
if str(AGENT_DIR.parent) not in sys.path:
    sys.path.insert(0, str(AGENT_DIR.parent))


def uninstrument_openai() -> None:
    """Undo ``setup_telemetry`` so that the next test can instrument afresh.

    OpenLLMetry 0.62's ``uninstrument()`` leaves ``Completions.create`` wrapped:
    it names the methods by dotted paths that opentelemetry-instrumentation 0.66's
    ``unwrap`` no longer resolves. Left there, the next instrumentation wraps the
    old wrapper, and the gateway gets the ``traceparent`` of an unexported span.
    """
    from openai.resources.chat.completions import AsyncCompletions, Completions
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.instrumentation.utils import unwrap

    OpenAIInstrumentor().uninstrument()
    for cls in (Completions, AsyncCompletions):
        unwrap(cls, "create")


@dataclass(frozen=True)
class Stack:
    """A gateway and a collector, as processes, on a topic of their own."""

    gateway: str
    collector: str
    store: str
    # The agent's key: a client key at the gateway, a producer key at the collector.
    key: str

    @property
    def otlp_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@contextmanager
def gateway_and_collector(
    kafka: Any, triton_url: str, work: Path, model: str, version: int
) -> Iterator[Stack]:
    """``spanmill gateway`` routing ``model`` to one Triton version, and ``spanmill collector``
    (with its OTLP/HTTP receiver) writing a store under ``work``, on a fresh span topic."""
    from spanmill.keys import key_line, new_key
    from spanmill.stack.ports import free_port
    from spanmill.stack.services import CollectorProcess, GatewayProcess

    # Keys asked on both sides, as on a shared cluster: what the agent sends is trusted.
    key = new_key()
    keys_file = work / "agent-keys"
    keys_file.write_text(key_line("support-agent", key) + "\n")

    suffix = uuid.uuid4().hex[:8]
    topics = {
        "SPANMILL_KAFKA_SPANS_TOPIC": kafka.create_topic(f"spans-{suffix}", 3),
        "SPANMILL_KAFKA_DLQ_TOPIC": kafka.create_topic(f"spans-{suffix}.dlq", 1),
    }
    routes = work / "routes.json"
    backends = [{"version": str(version), "weight": 1}]
    table = {"revision": 1, "routes": {model: {"triton_model": model, "backends": backends}}}
    routes.write_text(json.dumps(table))
    gateway = GatewayProcess(
        "127.0.0.1", free_port(), work, routing_file=routes,
        kafka_bootstrap=kafka.bootstrap_servers, triton_url=triton_url,
    )  # fmt: skip
    gateway.settings_env.update(topics, SPANMILL_GATEWAY_CLIENT_KEYS_FILE=str(keys_file))
    store = str(work / "spans")
    collector = CollectorProcess(
        "127.0.0.1", free_port(), work, store_url=store, kafka_bootstrap=kafka.bootstrap_servers
    )
    # tansu: a fresh group per test, and its first assignment takes half the session timeout.
    collector.settings_env.update(
        topics,
        SPANMILL_COLLECTOR_GROUP_ID=f"support-{suffix}",
        SPANMILL_COLLECTOR_SESSION_TIMEOUT_MS="6000",
        SPANMILL_COLLECTOR_BATCH_MAX_SECONDS="0.5",
        SPANMILL_COLLECTOR_RECEIVER_KEYS_FILE=str(keys_file),
    )
    running = []
    try:
        running.append(gateway.start())
        running.append(collector.start())
        yield Stack(gateway.url, collector.url, store, key)
    finally:
        for service in reversed(running):
            service.stop()


@contextmanager
def served(kafka: Any, triton: Any, work: Path, model: str) -> Iterator[Stack]:
    """:func:`gateway_and_collector` in front of version 1 of ``model``, which the
    caller has written into ``triton``'s repository: loaded for the block's length."""
    import tritonclient.http as triton_http

    client = triton_http.InferenceServerClient(triton.http_url, network_timeout=300)
    client.load_model(model)
    try:
        with gateway_and_collector(kafka, triton.http_url, work, model, 1) as running:
            yield running
    finally:
        client.unload_model(model)
