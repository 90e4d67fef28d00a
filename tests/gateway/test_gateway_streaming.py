"""True streaming through the real gateway, tritonserver and SmolLM2.

Shown by order of events, not by timing: the first piece reaches the client before
the gateway records the answer's end; the pieces make the text a plain call gives;
and a client that goes away stops generation (Triton's own metrics count the
request as cancelled, with fewer tokens than it asked for), after which the
model instance answers the next request.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.http as triton_http

from spanmill.config import GatewaySettings, KafkaSettings, TritonSettings
from spanmill.gateway.app import create_app
from spanmill.gateway.routing import RoutingTable
from spanmill.serving.repository import write_python_version

pytestmark = pytest.mark.services

MODEL = "streamer"
QUEUED = "queued"  # the same model, generating one row at a time, with one more waiting
STORY = [{"role": "user", "content": "Write a long story about a cat who travels the world."}]


@pytest.fixture(scope="module")
def streamer(triton, smollm2_dir: Path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    write_python_version(triton.model_repository, MODEL, 1, smollm2_dir, num_threads=2)
    write_python_version(triton.model_repository, QUEUED, 1, smollm2_dir, num_threads=2,
                         max_queue_size=1, max_batch_size=1)  # fmt: skip
    client = triton_http.InferenceServerClient(triton.http_url, network_timeout=300)
    client.load_model(MODEL)
    client.load_model(QUEUED)
    yield triton.http_url
    client.unload_model(MODEL)
    client.unload_model(QUEUED)


@pytest.fixture(params=[300.0])
def gateway(kafka, streamer: str, serve_app, request) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(f"spans-{uuid.uuid4().hex[:8]}", 1)
    settings = GatewaySettings(
        kafka=KafkaSettings(bootstrap_servers=kafka.bootstrap_servers, spans_topic=topic),
        triton=TritonSettings(http_url=streamer),
        request_timeout_s=request.param,
    )
    table = RoutingTable.model_validate({"revision": 1, "routes": {
        name: {"triton_model": name, "backends": [{"version": "1", "weight": 1}]}
        for name in (MODEL, QUEUED)
    }})  # fmt: skip
    with serve_app(create_app(settings, table=table)) as url:
        yield url, topic


def events(response: httpx.Response) -> Iterator[tuple[int, dict]]:
    """(time received, chunk) for each Server-Sent Event, up to ``[DONE]``."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return
        yield time.time_ns(), json.loads(line[6:])


def test_pieces_arrive_as_generated_and_make_the_plain_answer(gateway, kafka) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaConsumer

    from spanmill.spans import detect_and_decode

    url, topic = gateway
    request = {"model": MODEL, "messages": STORY, "max_tokens": 64, "temperature": 0}
    plain = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=300).json()
    assert "choices" in plain, plain
    text = plain["choices"][0]["message"]["content"]
    assert plain["usage"]["completion_tokens"] == 64  # it ran to the limit: 64 tokens

    streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=streamed, timeout=300) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        received = list(events(r))
    pieces = [(at, c["choices"][0]["delta"].get("content")) for at, c in received if c["choices"]]
    content = [(at, piece) for at, piece in pieces if piece]
    assert "".join(piece for _, piece in content) == text
    assert len(content) > 20  # piece by piece, not one block
    assert received[-1][1]["usage"]["completion_tokens"] == 64
    assert [c["choices"][0]["finish_reason"] for _, c in received if c["choices"]][-1] == "length"

    # The gateway records the span once the answer has ended: the first piece was
    # in the client's hands before that.
    consumer = KafkaConsumer(topic, bootstrap_servers=kafka.bootstrap_servers,
                             auto_offset_reset="earliest", consumer_timeout_ms=15000)  # fmt: skip
    spans = [s for m in consumer for s in detect_and_decode(m.value)]
    consumer.close()
    assert len(spans) == 2
    ended = max(span.end_time_unix_nano for span in spans)
    assert content[0][0] < ended


def triton_counter(metrics_url: str, name: str, outcome: str) -> float:
    text = httpx.get(metrics_url).text
    pattern = rf'^{name}{{[^}}]*model="{MODEL}"[^}}]*outcome="{outcome}"[^}}]*}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_client_that_goes_away_stops_generation(gateway, triton) -> None:  # type: ignore[no-untyped-def]
    url, _ = gateway
    metrics_url = f"http://{triton.running.host}:{triton.running.ports['metrics']}/metrics"
    cancelled = triton_counter(metrics_url, "spanmill_generation_requests_total", "cancelled")
    long = {"model": MODEL, "messages": STORY, "max_tokens": 1024, "temperature": 0,
            "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=long, timeout=300) as r:
        read = 0
        for _, chunk in events(r):
            read += bool(chunk["choices"] and chunk["choices"][0]["delta"].get("content"))
            if read == 3:
                break  # the client goes away: the connection closes here
    # The next request is answered by the same (single) model instance, which is
    # free again only once the abandoned generation stopped.
    short = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}],
             "max_tokens": 4, "temperature": 0}  # fmt: skip
    answer = httpx.post(f"{url}/v1/chat/completions", json=short, timeout=300)
    assert answer.status_code == 200
    deadline = time.monotonic() + 30
    while (
        triton_counter(metrics_url, "spanmill_generation_requests_total", "cancelled") == cancelled
    ):
        assert time.monotonic() < deadline, "Triton never counted the request as cancelled"
        time.sleep(0.2)
    tokens = triton_counter(metrics_url, "spanmill_generation_tokens_total", "cancelled")
    assert 3 <= tokens < 1024  # it stopped long before the 1024 tokens it asked for


def test_a_prompt_over_the_context_window_is_refused_before_it_occupies_the_model(
    gateway,  # type: ignore[no-untyped-def]
) -> None:
    url, _ = gateway
    huge = {"model": MODEL, "max_tokens": 16,
            "messages": [{"role": "user", "content": "many words " * 40_000}]}  # fmt: skip
    refused = httpx.post(f"{url}/v1/chat/completions", json=huge, timeout=300)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert error["message"].startswith("this model's maximum context length is 8192 tokens")
    # A prompt that fits, with max_tokens past what the window leaves, is refused too
    # (about 7,200 tokens, and 1,000 more asked for, of 8,192).
    long = [{"role": "user", "content": "many words " * 3_600}]
    greedy = {"model": MODEL, "max_tokens": 1000, "messages": long}
    assert (
        httpx.post(f"{url}/v1/chat/completions", json=greedy, timeout=300).json()["error"]["code"]
        == "context_length_exceeded"
    )
    # The model was never busy with them: the next request is served as usual.
    short = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    assert httpx.post(f"{url}/v1/chat/completions", json=short, timeout=300).status_code == 200


def test_a_full_queue_is_refused_at_once_with_retry_after(gateway) -> None:  # type: ignore[no-untyped-def]
    from concurrent.futures import ThreadPoolExecutor

    url, _ = gateway
    long = {"model": QUEUED, "messages": STORY, "max_tokens": 1024, "temperature": 0,
            "stream": True}  # fmt: skip
    short = {"model": QUEUED, "messages": [{"role": "user", "content": "Say hi."}],
             "max_tokens": 4, "temperature": 0}  # fmt: skip
    with ThreadPoolExecutor(4) as pool:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=long, timeout=300) as busy:
            # The model instance is generating the long answer. The reader is kept: a
            # discarded one would close the connection, and that cancels the answer.
            reading = events(busy)
            next(reading)
            # Four more arrive while it does. The model's one row is taken and one more
            # may wait (Triton's own queue may hold another): the others are refused at once.
            calls = [pool.submit(httpx.post, f"{url}/v1/chat/completions", json=short,
                                 timeout=300) for _ in range(4)]  # fmt: skip
            deadline = time.monotonic() + 60
            while sum(c.done() for c in calls) < 2:
                assert time.monotonic() < deadline, "a full queue kept its callers waiting"
                time.sleep(0.05)
            early = [c.result() for c in calls if c.done()]
        # The long answer's client went away; every request the queue took is served.
        answers = [c.result(timeout=300) for c in calls]
    refused = [a for a in answers if a.status_code == 429]
    accepted = [a for a in answers if a.status_code != 429]
    assert all(a in refused for a in early), [(a.status_code, a.text[:300]) for a in early]
    for answer in refused:
        assert answer.headers["retry-after"] == "1"
        assert answer.json()["error"]["code"] == "overloaded"
    assert len(refused) >= 2 and accepted, [a.status_code for a in answers]
    assert all(a.status_code == 200 for a in accepted), [a.text for a in accepted]


@pytest.mark.parametrize("gateway", [2.0], indirect=True)
def test_an_answer_past_the_deadline_is_stopped_and_refused_with_504(gateway, triton) -> None:  # type: ignore[no-untyped-def]
    url, _ = gateway
    metrics_url = f"http://{triton.running.host}:{triton.running.ports['metrics']}/metrics"
    before = triton_counter(metrics_url, "spanmill_generation_requests_total", "cancelled")
    long = {"model": MODEL, "messages": STORY, "max_tokens": 1024, "temperature": 0}
    late = httpx.post(f"{url}/v1/chat/completions", json=long, timeout=300)
    assert late.status_code == 504
    assert "took longer than 2 s" in late.json()["error"]["message"]
    wait_for_cancelled(metrics_url, before + 1)  # stopped, not left running to 1,024 tokens
    # Streamed, the deadline ends the stream with an error event.
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**long, "stream": True},
                      timeout=300) as r:  # fmt: skip
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert "took longer than 2 s" in json.loads(lines[-2][6:])["error"]["message"]
    wait_for_cancelled(metrics_url, before + 2)


def wait_for_cancelled(metrics_url: str, count: float) -> None:
    deadline = time.monotonic() + 30
    while triton_counter(metrics_url, "spanmill_generation_requests_total", "cancelled") < count:
        assert time.monotonic() < deadline, f"Triton did not count {count:g} cancelled requests"
        time.sleep(0.2)
