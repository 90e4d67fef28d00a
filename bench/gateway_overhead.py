"""Gateway overhead: a chat completion through the gateway vs the same request to Triton.

Everything real: tansu (the gateway emits its spans), tritonserver with an echo
model and with SmolLM2-135M-Instruct, and the gateway as its own process
(`spanmill gateway`). Prints p50/p99 latency of both paths in one run, the
difference, the p50 of the same request through a bare Python proxy (the floor
any Python gateway starts from on this machine, ``bench/_bare_proxy.py``),
requests/s through the gateway against Triton's own at the same concurrency, and
requests/s under concurrency (SmolLM2's with Triton's dynamic batching against one
request at a time, in the same run).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import tritonclient.http as triton_http

from spanmill.gateway.routing import RoutingTable
from spanmill.models import pull_model
from spanmill.serving import protocol
from spanmill.serving.protocol import GenerationParams
from spanmill.serving.repository import write_echo_version, write_python_version
from spanmill.stack.ports import free_port
from spanmill.stack.process import wait_until
from spanmill.stack.services import KafkaBroker, TritonServer

MESSAGES = [{"role": "user", "content": "What is 12 plus 30? Answer with the number."}]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def direct(client: httpx.Client, model: str, max_tokens: int) -> float:
    """The same request straight to Triton, on the generate extension the gateway calls."""
    body = protocol.generate_body(MESSAGES, GenerationParams(max_tokens=max_tokens))
    started = time.perf_counter()
    with client.stream("POST", f"/v2/models/{model}/versions/1/generate_stream", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data:") and protocol.is_final(json.loads(line[5:])):
                break
    return time.perf_counter() - started


def through_gateway(client: httpx.Client, model: str, max_tokens: int) -> float:
    body = {"model": model, "messages": MESSAGES, "temperature": 0, "max_tokens": max_tokens}
    started = time.perf_counter()
    response = client.post("/v1/chat/completions", json=body)
    response.raise_for_status()
    return time.perf_counter() - started


async def throughput(base_url: str, model: str, concurrency: int, total: int) -> float:
    body = {"model": model, "messages": MESSAGES, "temperature": 0, "max_tokens": 32}
    # aiohttp for the load on both paths: httpx's async client costs more than twice the
    # CPU a call, which on two cores the servers measured would go without.
    async with aiohttp.ClientSession(base_url) as client:
        queue = list(range(total))

        async def worker() -> None:
            while queue:
                queue.pop()
                async with client.post("/v1/chat/completions", json=body) as response:
                    response.raise_for_status()
                    await response.read()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - started)


async def direct_throughput(
    triton_url: str, model: str, concurrency: int, total: int, pause_s: float = 0.0
) -> float:
    """Requests/s of the same 32-token requests sent straight to Triton.

    Triton answers a request sent on a connection right after the previous answer
    about 40 ms late (measured here: 20-40 requests/s at concurrency 1, against about
    200 with a 1 ms pause between requests); ``pause_s`` waits that long before each
    request, which the gateway's own calls do by the work between them.
    """
    body = protocol.generate_body(MESSAGES, GenerationParams(max_tokens=32))
    path = f"/v2/models/{model}/versions/1/generate_stream"
    async with aiohttp.ClientSession(f"http://{triton_url}") as client:
        queue = list(range(total))

        async def worker() -> None:
            while queue:
                queue.pop()
                await asyncio.sleep(pause_s)
                # Read as the gateway reads it: the events as they come, to the end.
                async with client.post(path, json=body) as response:
                    response.raise_for_status()
                    async for _ in response.content.iter_any():
                        pass

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - started)


def compare(
    name: str, triton_url: str, gateway_url: str, bare_url: str, n: int, max_tokens: int
) -> None:
    """Direct, through the gateway and through the bare proxy, in turn; each comes first,
    second and third equally often, since a request is slowed by the work the one
    before it left behind (the gateway's span on its way to Kafka)."""
    tclient = httpx.Client(base_url=f"http://{triton_url}", timeout=300)
    gclient = httpx.Client(base_url=gateway_url, timeout=300)
    with tclient, gclient, httpx.Client(base_url=bare_url, timeout=300) as bclient:
        paths = [
            lambda: direct(tclient, name, max_tokens),
            lambda: through_gateway(gclient, name, max_tokens),
            lambda: through_gateway(bclient, name, max_tokens),
        ]
        for path in paths * 3:  # warm every path
            path()
        times: list[list[float]] = [[], [], []]
        for i in range(n):
            for k in range(3):
                times[(i + k) % 3].append(paths[(i + k) % 3]() * 1000)
    d, g, b = times
    p50 = percentile(d, 0.5)
    print(
        f"{name:<8} n={n:<4} direct p50 {p50:8.2f} ms"
        f"  p99 {percentile(d, 0.99):8.2f}"
        f" | gateway p50 {percentile(g, 0.5):8.2f} ms  p99 {percentile(g, 0.99):8.2f}"
        f" | overhead p50 {percentile(g, 0.5) - p50:+7.2f} ms"
        f"  ratio {statistics.median(g) / statistics.median(d):.2f}x"
        f" | bare proxy p50 {percentile(b, 0.5):8.2f} ms ({percentile(b, 0.5) - p50:+.2f})",
        flush=True,
    )


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    repository = work / "repo"
    write_echo_version(repository, "echo", 1)
    write_python_version(repository, "smollm2", 1, pull_model("smollm2-135m"), num_threads=1)
    broker = KafkaBroker("127.0.0.1", free_port(), work / "kafka").start()
    triton = TritonServer(
        "127.0.0.1", work / "triton", repository,
        http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
    ).start()  # fmt: skip
    gateway = bare = None
    try:
        client = triton_http.InferenceServerClient(triton.url, network_timeout=300)
        client.load_model("echo")
        client.load_model("smollm2")
        routes = RoutingTable.model_validate({"routes": {
            m: {"triton_model": m, "backends": [{"version": "1", "weight": 1}]}
            for m in ("echo", "smollm2")}})  # fmt: skip
        routing_file = work / "routes.json"
        routing_file.write_text(routes.dumps())
        port = free_port()
        env = dict(os.environ, SPANMILL_KAFKA_BOOTSTRAP_SERVERS=broker.url,
                   SPANMILL_TRITON_HTTP_URL=triton.url)  # fmt: skip
        gateway = subprocess.Popen(
            [sys.executable, "-m", "spanmill.cli.main", "gateway", "--port", str(port),
             "--routing-file", str(routing_file)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        bare_port = free_port()
        bare = subprocess.Popen(
            [sys.executable, "-m", "bench._bare_proxy", triton.url, str(bare_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        bare_url = f"http://127.0.0.1:{bare_port}"
        wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, timeout=60,
                   what="gateway")  # fmt: skip
        wait_until(lambda: httpx.get(bare_url).status_code == 200, timeout=60,
                   what="bare proxy")  # fmt: skip
        print("latency, one request at a time (gateway includes span emission to Kafka; the "
              "bare proxy is the floor of a Python proxy here, bench/_bare_proxy.py):")  # fmt: skip
        compare("echo", triton.url, url, bare_url, n=300, max_tokens=32)
        compare("smollm2", triton.url, url, bare_url, n=20, max_tokens=16)
        print("throughput, echo model, 32-token answers, through the gateway vs direct:")
        for concurrency in (1, 8, 32):
            rps = asyncio.run(throughput(url, "echo", concurrency, total=400))
            raw = asyncio.run(direct_throughput(triton.url, "echo", concurrency, total=400))
            base = asyncio.run(
                direct_throughput(triton.url, "echo", concurrency, total=400, pause_s=0.001)
            )
            print(f"  concurrency {concurrency:>2}: {rps:8.1f} requests/s, direct {base:8.1f}"
                  f" (back to back {raw:6.1f}), ratio {rps / base:.2f}", flush=True)  # fmt: skip
        print("throughput through the gateway, SmolLM2 (Triton batches the requests that queue):")
        single = 0.0
        for concurrency in (1, 8):
            rps = asyncio.run(throughput(url, "smollm2", concurrency, total=16))
            single = single or rps
            print(f"  concurrency {concurrency:>2}: {rps:8.2f} requests/s, "
                  f"{rps / single:.2f}x concurrency 1", flush=True)  # fmt: skip
        spans = httpx.get(f"{url}/metrics").text
        emitted = [
            ln
            for ln in spans.splitlines()
            if ln.startswith("spanmill_gateway_spans_") and "_created" not in ln
        ]
        print("  " + "; ".join(emitted))
    finally:
        for process in (gateway, bare):
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
        triton.stop()
        broker.stop()


if __name__ == "__main__":
    main()
