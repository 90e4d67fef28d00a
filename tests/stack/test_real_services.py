"""Talk to each real service the fixtures start: tansu, MLflow and tritonserver."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from spanmill import semconv

pytestmark = pytest.mark.services

ECHO_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [ {{ name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

ECHO_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.decode().upper().encode() for t in text], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("UPPER", upper)]))
        return responses
"""


def write_echo_model(repository: Path, name: str) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(ECHO_CONFIG.format(name=name))
    (version / "model.py").write_text(ECHO_MODEL)


def test_kafka_produce_and_consume_with_key_and_headers(kafka) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaConsumer, KafkaProducer

    key = uuid.uuid4().hex.encode()
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    producer.send(
        semconv.SPANS_TOPIC, key=key, value=b'{"hello": "spans"}', headers=[("h", b"v")]
    ).get(timeout=30)
    producer.close()

    consumer = KafkaConsumer(
        semconv.SPANS_TOPIC,
        bootstrap_servers=kafka.bootstrap_servers,
        group_id=f"test-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        consumer_timeout_ms=20000,
    )
    received = [m for m in consumer if m.key == key]
    consumer.close()
    assert len(received) == 1
    assert received[0].value == b'{"hello": "spans"}'
    assert received[0].headers == [("h", b"v")]


def test_kafka_has_the_span_topics(kafka) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers)
    try:
        topics = consumer.topics()
        assert {semconv.SPANS_TOPIC, semconv.DLQ_TOPIC} <= topics
        assert len(consumer.partitions_for_topic(semconv.SPANS_TOPIC) or ()) == 3
    finally:
        consumer.close()


def test_mlflow_log_and_read_a_run(mlflow_server) -> None:  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    experiment_id = client.create_experiment(f"stack-{uuid.uuid4().hex[:8]}")
    run = client.create_run(experiment_id)
    client.log_param(run.info.run_id, "lora_rank", "8")
    for step, loss in enumerate([2.0, 1.5, 1.2]):
        client.log_metric(run.info.run_id, "loss", loss, step=step)
    client.set_terminated(run.info.run_id)

    fetched = client.get_run(run.info.run_id)
    assert fetched.data.params == {"lora_rank": "8"}
    assert fetched.data.metrics["loss"] == pytest.approx(1.2)
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [m.value for m in history] == [2.0, 1.5, 1.2]
    assert fetched.info.status == "FINISHED"


def test_triton_load_infer_unload_over_http_and_grpc(triton) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    # The session's Triton is shared: a name of this test's own.
    name = f"upper-{uuid.uuid4().hex[:8]}"
    write_echo_model(triton.model_repository, name)
    http = httpclient.InferenceServerClient(triton.http_url)
    assert http.is_server_live() and http.is_server_ready()
    http.load_model(name)
    assert http.is_model_ready(name)

    text = np.array(["spanmill", "héllo"], dtype=object)
    inp = httpclient.InferInput("TEXT", [2], "BYTES")
    inp.set_data_from_numpy(text)
    result = http.infer(name, [inp], outputs=[httpclient.InferRequestedOutput("UPPER")])
    assert [s.decode() for s in result.as_numpy("UPPER")] == ["SPANMILL", "HÉLLO"]

    grpc = grpcclient.InferenceServerClient(triton.grpc_url)
    ginp = grpcclient.InferInput("TEXT", [1], "BYTES")
    ginp.set_data_from_numpy(np.array(["grpc"], dtype=object))
    gresult = grpc.infer(name, [ginp])
    assert gresult.as_numpy("UPPER")[0] == b"GRPC"

    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index[name]["state"] == "READY"
    http.unload_model(name)
    assert not http.is_model_ready(name)


def test_the_sessions_triton_is_started_again_when_it_dies(triton) -> None:  # type: ignore[no-untyped-def]
    """One tritonserver serves every test of a worker: killed (as a crash would), it is
    started again on the same address, and what happened is said (conftest's
    ``_triton_outlives_each_test`` does this after every test, into the warnings summary)."""
    import tritonclient.http as httpclient

    assert triton.restart_if_dead() is None  # running: left alone
    url, dead = triton.http_url, triton.running.process
    os.killpg(os.getpgid(dead.pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while dead.alive() and time.monotonic() < deadline:  # a zombie, as a crash leaves it
        time.sleep(0.05)

    said = triton.restart_if_dead()
    # Its status, where no other reaper (subprocess's own) took it first.
    assert said is not None and "had exited" in said and "started again" in said
    assert "exit status -9" in said or "no status" in said
    assert not dead.alive() and triton.running.process.alive()
    assert triton.http_url == url
    name = f"upper-{uuid.uuid4().hex[:8]}"
    write_echo_model(triton.model_repository, name)
    http = httpclient.InferenceServerClient(url)
    http.load_model(name)
    inp = httpclient.InferInput("TEXT", [1], "BYTES")
    inp.set_data_from_numpy(np.array(["again"], dtype=object))
    assert http.infer(name, [inp]).as_numpy("UPPER")[0] == b"AGAIN"
    http.unload_model(name)
