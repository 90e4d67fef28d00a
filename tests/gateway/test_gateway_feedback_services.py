"""A burst of feedback through the real gateway into the real tansu broker: all, once.

The gateway runs as its service does (``spanmill gateway``, settings from the
environment), in a process of its own, so that the test's client and the gateway
do not share one interpreter.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer
from keep_alive import answers_after_idle

from spanmill import semconv as sc
from spanmill.feedback import new_response_id
from spanmill.spans import Span, detect_and_decode
from spanmill.stack.ports import free_port

pytestmark = pytest.mark.services

POSTS = 10_000
BATCH = 10
BATCHED_POSTS = 100  # the rest are single posts
CONCURRENCY = 64
# Smaller than the posts in flight: the gateway's queue overflows, answers 503, and the
# retries of refused posts must not become duplicates.
QUEUE_SIZE = 16
CLIENTS = 8  # one httpx pool's bookkeeping grows with its connections: share them out
SENTINEL = b"end-of-test"


def feedback_items(count: int) -> list[dict[str, Any]]:
    """Items with a unique marker in the comment, half by trace id, half by response id."""
    items = []
    for i in range(count):
        trace = os.urandom(16).hex()
        link = (
            {"trace_id": trace}
            if i % 2
            else {"response_id": new_response_id(trace, os.urandom(4).hex())}
        )
        items.append({**link, "name": "thumbs", "value": i % 3 == 0, "comment": f"fb-{i}"})
    return items


Body = list[dict[str, Any]] | dict[str, Any]


async def post_until_taken(client: httpx.AsyncClient, body: Body) -> int:
    """Post, retrying what a 503 says was not delivered, as a client should; the retries."""
    retries = 0
    while True:
        reply = await client.post("/v1/feedback", json=body)
        if reply.status_code == 200:
            return retries
        assert reply.status_code == 503, reply.text
        retries += 1
        delivered = set(reply.json()["delivered"])
        if isinstance(body, list):
            body = [item for index, item in enumerate(body) if index not in delivered]
        await asyncio.sleep(float(reply.headers["retry-after"]))  # the server's own backoff


async def burst(url: str, items: list[dict[str, Any]]) -> int:
    batched = BATCH * BATCHED_POSTS
    bodies: list[Any] = [items[i : i + BATCH] for i in range(0, batched, BATCH)]
    bodies += items[batched:]
    gate = asyncio.Semaphore(CONCURRENCY)
    per_client = CONCURRENCY // CLIENTS
    limits = httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client)
    clients = [httpx.AsyncClient(base_url=url, limits=limits, timeout=60) for _ in range(CLIENTS)]

    async def one(index: int, body: Any) -> int:
        async with gate:
            return await post_until_taken(clients[index % CLIENTS], body)

    try:
        return sum(await asyncio.gather(*(one(i, body) for i, body in enumerate(bodies))))
    finally:
        for client in clients:
            await client.aclose()


@pytest.fixture
def gateway(kafka: Any) -> Iterator[tuple[str, str]]:
    """A gateway process sending spans to a fresh topic: its URL and the topic."""
    topic = kafka.create_topic(f"feedback-{uuid.uuid4().hex[:8]}", 3)
    port = free_port()
    env = {
        **os.environ,
        "SPANMILL_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "SPANMILL_KAFKA_SPANS_TOPIC": topic,
        "SPANMILL_TRITON_HTTP_URL": f"127.0.0.1:{free_port()}",  # feedback needs no model
        "SPANMILL_GATEWAY_SPAN_QUEUE_SIZE": str(QUEUE_SIZE),
    }
    command = [str(Path(sys.executable).parent / "spanmill"), "gateway", "--host", "127.0.0.1",
               "--port", str(port)]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _healthy(url):
            assert process.poll() is None, "the gateway exited"
            assert time.monotonic() < deadline, "the gateway did not come up"
            time.sleep(0.1)
        yield url, topic
    finally:
        process.terminate()
        process.wait(timeout=30)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def read_until_sentinels(bootstrap: str, topic: str, partitions: int) -> list[tuple[bytes, Span]]:
    """Every span on the topic: read until each partition's sentinel, which was written
    after every post was answered, so that nothing written before it can be missed."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"test-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
    )
    found: list[tuple[bytes, Span]] = []
    ended: set[int] = set()
    deadline = time.monotonic() + 120
    while len(ended) < partitions and time.monotonic() < deadline:
        for part, records in consumer.poll(timeout_ms=500).items():
            for record in records:
                if record.value == SENTINEL:
                    ended.add(part.partition)
                else:
                    found.extend((record.key, span) for span in detect_and_decode(record.value))
    consumer.close()
    assert len(ended) == partitions, f"sentinels seen on {sorted(ended)} only"
    return found


def test_a_burst_of_feedback_is_all_on_the_topic_once(kafka, gateway) -> None:  # type: ignore[no-untyped-def]
    url, topic = gateway
    items = feedback_items(POSTS)
    retries = asyncio.run(burst(url, items))  # posts the gateway refused (503) and were retried
    metrics = httpx.get(f"{url}/metrics").text
    assert f'spanmill_gateway_feedback_total{{outcome="accepted"}} {float(POSTS)}' in metrics

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    for partition in range(3):
        producer.send(topic, value=SENTINEL, partition=partition)
    producer.flush()
    producer.close()
    found = read_until_sentinels(kafka.bootstrap_servers, topic, 3)

    markers = Counter(span.attributes[sc.GEN_AI_EVALUATION_EXPLANATION] for _, span in found)
    assert len(markers) == POSTS, f"{POSTS - len(markers)} missing ({retries} retries)"
    assert markers.most_common(1)[0][1] == 1, f"duplicated: {markers.most_common(3)}"
    by_marker = {s.attributes[sc.GEN_AI_EVALUATION_EXPLANATION]: (k, s) for k, s in found}
    for item in items:
        key, span = by_marker[item["comment"]]
        trace = item.get("trace_id") or item["response_id"][len("chatcmpl-") : -8]
        assert span.trace_id == trace and key == trace.encode()  # in its trace's partition
        assert span.rewards[0].value == float(item["value"])
        assert span.attributes[sc.CLIENT_ADDRESS] == "127.0.0.1"
        assert span.attributes[sc.SPANMILL_FEEDBACK_PRINCIPAL] == "anonymous"


def test_an_idle_client_connection_outlives_the_clients_own_idle_limit(gateway) -> None:  # type: ignore[no-untyped-def]
    """httpx keeps an idle connection 5 s, as long as uvicorn's default keep-alive: a post
    sent on it as the gateway closed it failed with a ReadError in a burst of feedback."""
    url, _ = gateway
    assert answers_after_idle(url, "/healthz")
