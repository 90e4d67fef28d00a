"""SmolLM2 served by the real tritonserver through the Python backend, called as the
gateway calls it: Triton's generate extension, streamed or not."""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.http as httpclient

from spanmill.gateway.upstream import Target, TritonUpstream, UpstreamError
from spanmill.serving import protocol
from spanmill.serving.protocol import GenerationParams, GenerationResult
from spanmill.serving.repository import write_python_version

pytestmark = pytest.mark.services


def generate(url: str, model: str, messages: list[dict[str, Any]], params: GenerationParams) -> Any:
    async def call() -> GenerationResult:
        upstream = TritonUpstream(url, timeout_s=300)
        try:
            return await upstream.generate(Target(model, "1"), messages, params, None)
        finally:
            await upstream.close()

    return asyncio.run(call())


def test_smollm2_answers_through_triton(triton, smollm2_dir: Path) -> None:  # type: ignore[no-untyped-def]
    write_python_version(triton.model_repository, "assistant", 1, smollm2_dir, num_threads=1)
    client = httpclient.InferenceServerClient(triton.http_url, network_timeout=300)
    client.load_model("assistant")
    try:
        assert client.is_model_ready("assistant", "1")
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        result = generate(triton.http_url, "assistant", messages, GenerationParams(max_tokens=12))
        choice = result.choices[0]
        assert result.model_version == "1"
        assert "Paris" in choice.text
        assert 0 < len(choice.token_ids) <= 12
        assert len(choice.logprobs) == len(choice.token_ids)
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in choice.logprobs)
        assert len(result.prompt_token_ids) > 5

        # Two sampled choices with a seed are reproducible.
        sampled = GenerationParams(max_tokens=8, temperature=0.9, n=2, seed=7)
        first = generate(triton.http_url, "assistant", messages, sampled)
        second = generate(triton.http_url, "assistant", messages, sampled)
        assert len(first.choices) == 2
        assert [c.token_ids for c in first.choices] == [c.token_ids for c in second.choices]

        # A malformed request is an error for that request only.
        bad = protocol.generate_body(messages, GenerationParams(max_tokens=4))
        bad["MESSAGES"] = "not json"
        answer = httpx.post(
            f"http://{triton.http_url}/v2/models/assistant/versions/1/generate", json=bad
        )
        assert "MESSAGES must be UTF-8 JSON" in answer.text
        assert client.is_model_ready("assistant", "1")
        with pytest.raises(UpstreamError, match="not being served"):
            generate(triton.http_url, "nothing-here", messages, GenerationParams(max_tokens=2))
    finally:
        client.unload_model("assistant")


CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Germany": "Berlin", "Russia": "Moscow",
            "China": "Beijing", "Egypt": "Cairo", "Greece": "Athens"}  # fmt: skip


def _counter(text: str, name: str, model: str) -> float:
    found = re.search(rf'^{name}{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_requests_that_arrive_together_are_generated_together(  # type: ignore[no-untyped-def]
    triton, smollm2_dir: Path
) -> None:
    write_python_version(triton.model_repository, "batched", 1, smollm2_dir, num_threads=1)
    client = httpclient.InferenceServerClient(triton.http_url, network_timeout=300)
    client.load_model("batched")

    async def ask_all() -> dict[str, GenerationResult]:
        upstream = TritonUpstream(triton.http_url, timeout_s=300)
        try:
            answers = await asyncio.gather(*(
                upstream.generate(
                    Target("batched", "1"),
                    [{"role": "user", "content": f"What is the capital of {country}?"}],
                    GenerationParams(max_tokens=16), None,
                )
                for country in CAPITALS
            ))  # fmt: skip
        finally:
            await upstream.close()
        return dict(zip(CAPITALS, answers, strict=True))

    try:
        answers = {country: r.choices[0].text for country, r in asyncio.run(ask_all()).items()}
        # Each answer went back to the request that asked it.
        for country, city in CAPITALS.items():
            assert city in answers[country], answers
        # Generated together: the decode steps advanced several rows each.
        metrics = f"http://{triton.running.host}:{triton.running.ports['metrics']}/metrics"
        text = httpx.get(metrics).text
        steps = _counter(text, "spanmill_generation_steps_total", "batched")
        rows = _counter(text, "spanmill_generation_step_rows_total", "batched")
        assert steps > 0 and rows / steps > 2, (rows, steps)
    finally:
        client.unload_model("batched")
