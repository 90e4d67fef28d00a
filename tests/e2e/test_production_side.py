"""Spans are born: an agent calls SmolLM2 through the gateway and Triton.

Real tritonserver serving SmolLM2-135M-Instruct through the Python backend, the
real gateway, the real tansu broker, the calculator agent with the SDK. Its
episode spans and rewards, and the gateway's LLM spans, all arrive on Kafka in
one trace per episode.
"""

from __future__ import annotations

import shutil
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
import tritonclient.http as triton_http
from kafka import KafkaConsumer

from spanmill import sdk
from spanmill import semconv as sc
from spanmill.config import GatewaySettings, KafkaSettings, TritonSettings
from spanmill.gateway.app import create_app
from spanmill.gateway.routing import RoutingTable
from spanmill.serving.repository import write_python_version
from spanmill.spans import Span, detect_and_decode
from spanmill.tasks.runner import run_agent

pytestmark = pytest.mark.services


def test_agent_through_gateway_to_kafka(kafka, triton, smollm2_dir: Path, serve_app) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(f"spans-{uuid.uuid4().hex[:8]}", 3)
    # A Triton model of its own, removed afterwards: the session's Triton is shared, and a
    # "calculator" left in its repository would not be MLflow's version 1 to later tests.
    served = f"production-side-{uuid.uuid4().hex[:6]}"
    write_python_version(triton.model_repository, served, 1, smollm2_dir, num_threads=1)
    client = triton_http.InferenceServerClient(triton.http_url, network_timeout=300)
    client.load_model(served)
    kafka_settings = KafkaSettings(bootstrap_servers=kafka.bootstrap_servers, spans_topic=topic)
    gateway = GatewaySettings(kafka=kafka_settings, triton=TritonSettings(http_url=triton.http_url))
    table = RoutingTable.model_validate(
        {"routes": {"calculator": {"triton_model": served,
                                   "backends": [{"version": "1", "weight": 1}]}}}
    )  # fmt: skip
    sdk.configure("calculator-agent", kafka=kafka_settings, set_global=False)
    try:
        with serve_app(create_app(gateway, table=table)) as url:
            report = run_agent("calculator", 3, f"{url}/v1", "calculator", prompt_style="few_shot")
        assert sdk.force_flush()
    finally:
        sdk.shutdown()
        client.unload_model(served)
        shutil.rmtree(triton.model_repository / served, ignore_errors=True)
    print(
        f"\nSmolLM2 few-shot on 3 held-out problems: success {report.success_rate:.2f}, "
        f"valid calls {report.valid_call_rate:.2f}, errors {report.errors}"
    )
    assert report.errors == 0
    assert all(e.verdict is not None for e in report.episodes)

    consumer = KafkaConsumer(
        topic, bootstrap_servers=kafka.bootstrap_servers, group_id=f"t-{uuid.uuid4().hex}",
        auto_offset_reset="earliest", session_timeout_ms=6000, consumer_timeout_ms=15000,
    )  # fmt: skip
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for message in consumer:
        spans = detect_and_decode(message.value)
        assert {s.trace_id for s in spans} == {message.key.decode()}
        for span in spans:
            by_trace[span.trace_id].append(span)
    consumer.close()

    for episode in report.episodes:
        spans = by_trace[episode.trace_id]
        agent = [s for s in spans if s.operation_name == sc.OPERATION_INVOKE_AGENT]
        llm = [s for s in spans if s.is_llm_call]
        assert len(agent) == 1, f"episode {episode.episode_id}: {[s.name for s in spans]}"
        # The gateway's LLM spans joined the agent's trace, under the episode.
        assert llm, f"no LLM span in trace {episode.trace_id}"
        assert {s.service_name for s in llm} == {"spanmill-gateway"}
        assert all(s.model_version == "1" and s.completion_token_ids for s in llm)
        assert all(s.task_id == episode.instance.id for s in llm)
        assert all(
            len(s.completion_logprobs or []) == len(s.completion_token_ids or []) for s in llm
        )
        rewards = {r.name: r for r in agent[0].rewards}
        assert rewards["success"].primary
        assert rewards["success"].value == episode.verdict.primary.value  # type: ignore[union-attr]
        # Few-shot turns are marked as examples in what the gateway recorded.
        assert any(m.get(sc.SPANMILL_MESSAGE_EXAMPLE) for m in llm[0].input_messages)
