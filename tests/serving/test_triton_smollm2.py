"""SmolLM2 served by the real tritonserver through the Python backend."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from spanmill.serving import protocol
from spanmill.serving.protocol import GenerationParams
from spanmill.serving.repository import write_python_version

pytestmark = pytest.mark.services


def inputs_of(tensors: dict) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in tensors.items():
        dtype, _ = protocol.INPUTS[name]
        tensor = httpclient.InferInput(name, list(array.shape), protocol.CLIENT_DTYPES[dtype])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def outputs_of(result: httpclient.InferResult) -> dict:
    return {name: result.as_numpy(name) for name in protocol.OUTPUTS}


def infer(
    client: httpclient.InferenceServerClient, model: str, version: str, tensors: dict
) -> dict:
    return outputs_of(client.infer(model, inputs_of(tensors), model_version=version))


def test_smollm2_answers_through_triton(triton, smollm2_dir: Path) -> None:  # type: ignore[no-untyped-def]
    write_python_version(triton.model_repository, "assistant", 1, smollm2_dir, num_threads=1)
    client = httpclient.InferenceServerClient(triton.http_url, network_timeout=300)
    client.load_model("assistant")
    try:
        assert client.is_model_ready("assistant", "1")
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        request = protocol.encode_request(messages, GenerationParams(max_tokens=12))
        result = protocol.decode_result(infer(client, "assistant", "1", request))
        choice = result.choices[0]
        assert result.model_version == "1"
        assert "Paris" in choice.text
        assert 0 < len(choice.token_ids) <= 12
        assert len(choice.logprobs) == len(choice.token_ids)
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in choice.logprobs)
        assert len(result.prompt_token_ids) > 5

        # Two sampled choices with a seed are reproducible.
        sampled = protocol.encode_request(
            messages, GenerationParams(max_tokens=8, temperature=0.9, n=2, seed=7)
        )
        first = protocol.decode_result(infer(client, "assistant", "1", sampled))
        second = protocol.decode_result(infer(client, "assistant", "1", sampled))
        assert len(first.choices) == 2
        assert [c.token_ids for c in first.choices] == [c.token_ids for c in second.choices]

        # A malformed request is an error for that request only.
        bad = dict(request)
        bad["MESSAGES"] = np.array([[b"not json"]], dtype=object)
        with pytest.raises(Exception, match="MESSAGES must be UTF-8 JSON"):
            infer(client, "assistant", "1", bad)
        assert client.is_model_ready("assistant", "1")
    finally:
        client.unload_model("assistant")


CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Germany": "Berlin", "Russia": "Moscow",
            "China": "Beijing", "Egypt": "Cairo", "Greece": "Athens"}  # fmt: skip


def test_requests_that_arrive_together_are_generated_together(  # type: ignore[no-untyped-def]
    triton, smollm2_dir: Path
) -> None:
    write_python_version(triton.model_repository, "batched", 1, smollm2_dir, num_threads=1)
    client = httpclient.InferenceServerClient(triton.http_url, network_timeout=300, concurrency=8)
    client.load_model("batched")
    try:
        pending = {}
        for country in CAPITALS:
            messages = [{"role": "user", "content": f"What is the capital of {country}?"}]
            request = protocol.encode_request(messages, GenerationParams(max_tokens=16))
            pending[country] = client.async_infer("batched", inputs_of(request), model_version="1")
        answers = {
            country: protocol.decode_result(outputs_of(call.get_result())).choices[0].text
            for country, call in pending.items()
        }
        # Each answer went back to the request that asked it.
        for country, city in CAPITALS.items():
            assert city in answers[country], answers
        stats = client.get_inference_statistics("batched", "1")["model_stats"][0]
        assert int(stats["inference_count"]) == len(CAPITALS)
        # Fewer executions than requests: the dynamic batcher gathered the queued ones.
        assert int(stats["execution_count"]) < len(CAPITALS)
    finally:
        client.unload_model("batched")
