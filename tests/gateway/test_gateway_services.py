"""The real gateway against the real tritonserver and tansu broker (echo model)."""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import tritonclient.http as triton_http
from kafka import KafkaConsumer

from spanmill import semconv as sc
from spanmill.config import GatewaySettings, KafkaSettings, TritonSettings
from spanmill.gateway.app import create_app
from spanmill.gateway.routing import RoutingTable
from spanmill.serving.repository import write_echo_version
from spanmill.spans import Span, detect_and_decode
from spanmill.stack.ports import free_port
from spanmill.stack.services import TritonServer

pytestmark = pytest.mark.services

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def echo_table(model: str = "echo") -> RoutingTable:
    return RoutingTable.model_validate(
        {"revision": 1, "routes": {model: {"triton_model": "echo",
                                           "backends": [{"version": "1", "weight": 1}]}}}
    )  # fmt: skip


@pytest.fixture(scope="module")
def echo_model(triton) -> Iterator[str]:  # type: ignore[no-untyped-def]
    write_echo_version(triton.model_repository, "echo", 1)
    client = triton_http.InferenceServerClient(triton.http_url)
    client.load_model("echo")
    yield triton.http_url
    client.unload_model("echo")


def settings(kafka_bootstrap: str, topic: str, triton_url: str, **extra: object) -> GatewaySettings:
    return GatewaySettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, spans_topic=topic),
        triton=TritonSettings(http_url=triton_url),
        **extra,  # type: ignore[arg-type]
    )


def read_spans(bootstrap: str, topic: str, expected: int) -> list[tuple[bytes, Span]]:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"test-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        consumer_timeout_ms=15000,
    )
    found = []
    for message in consumer:
        found.extend((message.key, span) for span in detect_and_decode(message.value))
        if len(found) >= expected:
            break
    consumer.close()
    return found


def test_chat_completion_is_answered_and_recorded(kafka, echo_model, serve_app) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(f"spans-{uuid.uuid4().hex[:8]}", 3)
    app = create_app(settings(kafka.bootstrap_servers, topic, echo_model), table=echo_table())
    with serve_app(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        raw = client.chat.completions.with_raw_response.create(
            model="echo",
            messages=[{"role": "system", "content": "be brief"},
                      {"role": "user", "content": "héllo spans"}],
            temperature=0,
            max_tokens=64,
            extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
            extra_body={"metadata": {sc.SPANMILL_TASK_ID: "task-7",
                                     sc.SPANMILL_PROMPT_NAME: "calc-zero-shot"}},
        )  # fmt: skip
        response = raw.parse()
        assert response.choices[0].message.content == "héllo spans"
        assert response.usage is not None and response.usage.completion_tokens == len(
            "héllo spans".encode()
        )
        models = client.models.list()
        assert [m.id for m in models.data] == ["echo"]

        # Tool calls: model text holding a JSON call becomes OpenAI tool_calls.
        tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
        call = client.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": '{"tool": "calculator", "expression": "6*7"}'}],
            tools=tools,  # type: ignore[arg-type]
        )
        assert call.choices[0].finish_reason == "tool_calls"
        tool_call = call.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert tool_call.function.name == "calculator"  # type: ignore[union-attr]

        # Streaming gives the same answer in chunks.
        stream = client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "streamed"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "streamed"

        metrics = httpx.get(f"{url}/metrics").text
        assert re.search(r'spanmill_gateway_requests_total\{model="echo",status="200",'
                         r'version="1"\} 3\.0', metrics)  # fmt: skip

    spans = read_spans(kafka.bootstrap_servers, topic, 3)
    assert len(spans) == 3
    key, span = next((k, s) for k, s in spans if s.trace_id == TRACE_ID)
    assert key == TRACE_ID.encode()
    assert span.parent_span_id == PARENT_ID
    # The response names the call's own span, as W3C Trace Context's traceresponse.
    assert raw.headers["traceresponse"] == f"00-{TRACE_ID}-{span.span_id}-01"
    assert span.is_llm_call and span.model_version == "1" and span.model == "echo"
    assert span.task_id == "task-7" and span.prompt_name == "calc-zero-shot"
    assert span.response_id == response.id
    assert span.completion_token_ids == list("héllo spans".encode())
    assert span.completion_logprobs == [0.0] * len("héllo spans".encode())
    assert span.input_messages[1]["parts"][0]["content"] == "héllo spans"
    assert span.output_messages[0]["parts"][0]["content"] == "héllo spans"
    assert span.prompt_token_ids  # the rendered prompt, as the model saw it
    # Calls without a traceparent start traces of their own.
    assert len({s.trace_id for _, s in spans}) == 3


def test_auth_and_bad_requests(kafka, echo_model, serve_app) -> None:  # type: ignore[no-untyped-def]
    token, admin = uuid.uuid4().hex, uuid.uuid4().hex
    gateway = settings(kafka.bootstrap_servers, "unused-topic", echo_model, api_key=token,
                       admin_api_key=admin)  # fmt: skip
    with serve_app(create_app(gateway, table=echo_table())) as url:
        body = {"model": "echo", "messages": [{"role": "user", "content": "x"}]}
        assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 401
        auth = {"authorization": f"Bearer {token}"}
        ok = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth)
        assert ok.status_code == 200 and ok.headers["x-spanmill-model-version"] == "1"
        assert httpx.get(f"{url}/healthz").status_code == 200  # probes need no token
        missing = httpx.post(
            f"{url}/v1/chat/completions", json={**body, "model": "nope"}, headers=auth
        )
        assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]
        bad = httpx.post(
            f"{url}/v1/chat/completions", json={**body, "temperature": 7}, headers=auth
        )
        assert bad.status_code == 400 and "temperature" in bad.json()["error"]["message"]
        routes = echo_table("renamed").model_copy(update={"revision": 9})
        # The admin routes take their own credential: a client key does not open them.
        refused = httpx.put(f"{url}/admin/routes", content=routes.dumps(), headers=auth)
        assert refused.status_code == 401
        put = httpx.put(f"{url}/admin/routes", content=routes.dumps(),
                        headers={"authorization": f"Bearer {admin}"})  # fmt: skip
        assert put.json() == {"revision": 9}
        renamed = httpx.post(
            f"{url}/v1/chat/completions", json={**body, "model": "renamed"}, headers=auth
        )
        assert renamed.status_code == 200


def test_kafka_down_requests_still_served(echo_model, serve_app) -> None:  # type: ignore[no-untyped-def]
    dead = f"127.0.0.1:{free_port()}"
    app = create_app(settings(dead, "spans", echo_model, span_queue_size=2), table=echo_table())
    with serve_app(app) as url:
        body = {"model": "echo", "messages": [{"role": "user", "content": "still here"}]}
        for _ in range(8):
            response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
            assert response.status_code == 200
            assert response.json()["choices"][0]["message"]["content"] == "still here"
        metrics = httpx.get(f"{url}/metrics").text
        dropped = re.search(
            r'spanmill_gateway_spans_dropped_total\{reason="queue_full"\} (\d+)', metrics
        )
        assert dropped is not None and int(dropped.group(1)) >= 5


def test_triton_down_gives_503_then_recovers(kafka, tmp_path: Path, serve_app) -> None:  # type: ignore[no-untyped-def]
    http_port = free_port()
    gateway = settings(kafka.bootstrap_servers, "spans-down", f"127.0.0.1:{http_port}")
    with serve_app(create_app(gateway, table=echo_table())) as url:
        body = {"model": "echo", "messages": [{"role": "user", "content": "are you there"}]}
        down = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        assert down.status_code == 503
        assert "unavailable" in down.json()["error"]["message"]
        assert httpx.get(f"{url}/readyz").status_code == 503

        repository = tmp_path / "repo"
        write_echo_version(repository, "echo", 1)
        server = TritonServer(
            "127.0.0.1", tmp_path / "triton", repository,
            http_port=http_port, grpc_port=free_port(), metrics_port=free_port(),
        )  # fmt: skip
        running = server.start()
        try:
            triton_http.InferenceServerClient(f"127.0.0.1:{http_port}").load_model("echo")
            assert httpx.get(f"{url}/readyz").status_code == 200
            up = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
            assert up.status_code == 200, up.text
            assert json.loads(up.text)["choices"][0]["message"]["content"] == "are you there"
        finally:
            running.stop()


def test_a_client_that_stops_reading_is_taken_as_gone(kafka, echo_model, serve_app) -> None:  # type: ignore[no-untyped-def]
    """A client that keeps its connection open but stops reading a streamed answer holds
    neither its request slot nor the call past the bound: the call is recorded as a
    client gone (499), and the client may call again.

    The client is a real socket with a small receive buffer that never reads, against
    the real server: uvicorn's send then waits for the connection to drain, which is
    the wait the bound must end (a stand-in send would take for granted that the
    server's send blocks). The answer, eight choices of a long echo with a chunk per
    byte, is several times what the client's receive buffer, the server's send
    buffer and uvicorn's write buffer hold together."""
    app = create_app(
        settings(kafka.bootstrap_servers, "unused-topic", echo_model, request_timeout_s=5,
                 key_max_concurrent=1),
        table=echo_table(),
    )  # fmt: skip
    text = "x" * 6000
    streamed = json.dumps({"model": "echo", "messages": [{"role": "user", "content": text}],
                           "max_tokens": len(text), "n": 8, "stream": True}).encode()  # fmt: skip
    short = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    with serve_app(app) as url, socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        stalled.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(streamed), streamed)
        )
        # The stalled stream holds the client's one slot (429), until it is taken as gone.
        statuses: list[int] = []
        deadline = time.monotonic() + 60
        while not (429 in statuses and statuses[-1] == 200):
            assert time.monotonic() < deadline, f"the slot was never freed: {statuses[-5:]}"
            statuses.append(
                httpx.post(f"{url}/v1/chat/completions", json=short, timeout=30).status_code
            )
            time.sleep(0.1)
        metrics = httpx.get(f"{url}/metrics").text
        assert re.search(r'spanmill_gateway_requests_total\{model="echo",status="499",'
                         r'version="1"\} 1\.0', metrics), metrics  # fmt: skip
        # The server closed the connection: read on, the answer ends unfinished.
        stalled.settimeout(30)
        received = b""
        while piece := stalled.recv(1 << 16):
            received += piece
        assert received.startswith(b"HTTP/1.1 200") and b"data: [DONE]" not in received
