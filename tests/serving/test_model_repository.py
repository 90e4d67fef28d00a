"""The model repository writer: both flavours, and the errors it gives."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from generate_extension import as_event, as_tensors

from spanmill.serving import protocol, vllm
from spanmill.serving.generation import ServingSpec
from spanmill.serving.protocol import GenerationParams, ProtocolError
from spanmill.serving.repository import (
    ENGINE_VERSION,
    RepositoryError,
    python_config,
    versions,
    write_python_version,
    write_vllm_engine,
)


def fake_base(tmp_path: Path) -> Path:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    return base


def test_python_version_layout(tmp_path: Path) -> None:
    repo, base = tmp_path / "repo", fake_base(tmp_path)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    v1 = write_python_version(repo, "calculator", 1, base)
    v2 = write_python_version(repo, "calculator", 2, base, adapter)
    assert versions(repo, "calculator") == [1, 2]
    assert (v1 / "model.py").exists()
    assert ServingSpec.load(v1).adapter is None
    spec = ServingSpec.load(v2)
    assert spec.adapter == "adapter" and (v2 / "adapter" / "adapter_config.json").exists()
    assert spec.base_model == str(base.resolve())
    config = (repo / "calculator" / "config.pbtxt").read_text()
    assert 'name: "calculator"' in config and 'backend: "python"' in config
    for name in [*protocol.INPUTS, *protocol.OUTPUTS]:
        assert f'name: "{name}"' in config
    # Only MESSAGES is required.
    assert len(re.findall("optional: true", config)) == len(protocol.INPUTS) - 1


def test_copy_base_makes_a_self_contained_version(tmp_path: Path) -> None:
    v1 = write_python_version(tmp_path / "repo", "m", 1, fake_base(tmp_path), copy_base=True)
    assert ServingSpec.load(v1).base_model == "base"
    assert (v1 / "base" / "config.json").exists()


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [("bad name!", 1, "Triton model name"), ("ok", 0, "versions start at 1")],
)
def test_bad_targets(tmp_path: Path, name: str, version: int, message: str) -> None:
    with pytest.raises(RepositoryError, match=message):
        write_python_version(tmp_path, name, version, fake_base(tmp_path))


def test_missing_adapter_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match=r"adapter_config\.json"):
        write_python_version(tmp_path / "r", "m", 1, fake_base(tmp_path), tmp_path)


def test_vllm_flavour(tmp_path: Path) -> None:
    engine = write_vllm_engine(
        tmp_path, "calculator", "HuggingFaceTB/SmolLM2-135M-Instruct",
        {"calculator-v3": "/models/calculator/adapters/calculator-v3"}, max_lora_rank=16,
    )  # fmt: skip
    assert engine == tmp_path / "calculator" / str(ENGINE_VERSION)
    args = json.loads((engine / "model.json").read_text())
    assert args["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert args["enable_lora"] is True and args["max_lora_rank"] == 16
    assert json.loads((engine / "multi_lora.json").read_text()) == {
        "calculator-v3": "/models/calculator/adapters/calculator-v3"
    }
    config = (tmp_path / "calculator" / "config.pbtxt").read_text()
    # Complete, as Triton runs with auto-complete off: the backend's tensors are spelled out.
    assert 'backend: "vllm"' in config and "KIND_MODEL" in config
    assert "decoupled: true" in config and "max_batch_size: 0" in config
    for name in vllm.INPUTS:
        assert f'name: "{name}"' in config
    assert config.count("optional: true") == len(vllm.INPUTS) - 1  # all but text_input
    # The base model alone: no adapters, and LoRA still on for those to come.
    alone = write_vllm_engine(tmp_path, "calculator", "m", {})
    assert json.loads((alone / "multi_lora.json").read_text()) == {}
    with pytest.raises(RepositoryError, match="gpu_memory_utilization"):
        write_vllm_engine(tmp_path, "calculator", "m", {"a": "/a"}, gpu_memory_utilization=2)
    with pytest.raises(RepositoryError, match="LoRA name"):
        write_vllm_engine(tmp_path, "calculator", "m", {"a b": "/a"})


def test_gpu_config_uses_gpu_instances() -> None:
    assert "KIND_GPU" in python_config("m", gpu=True)


def test_protocol_round_trip() -> None:
    messages = [{"role": "user", "content": "hé"}]
    params = GenerationParams(temperature=0.5, top_p=0.75, max_tokens=5, n=2, seed=3, stop=("\n",))
    tools = [{"type": "function", "function": {"name": "calculator"}}]
    got_messages, got_tools, got_params = protocol.decode_request(
        as_tensors(protocol.generate_body(messages, params, tools))
    )
    assert (got_messages, got_tools, got_params) == (messages, tools, params)
    assert protocol.streamed(as_tensors(protocol.generate_body(messages, params, stream=True)))
    assert not protocol.streamed(as_tensors(protocol.generate_body(messages, params)))
    result = protocol.GenerationResult(
        choices=[
            protocol.Choice("a", [1, 2, 3], [-0.5, -1.0, -0.25], "stop"),
            protocol.Choice("b", [4], [-2.0], "length"),
        ],
        prompt_token_ids=[9, 8],
        model_version="2",
    )
    final = as_event(protocol.encode_result(result))
    assert protocol.is_final(final) and protocol.decode_final(final) == result
    one = protocol.GenerationResult([protocol.Choice("7", [22], [-0.5], "stop")], [5], "3")
    assert protocol.decode_final(as_event(protocol.encode_result(one))) == one
    partial = as_event(protocol.encode_partial(["x", "yz"]))
    assert not protocol.is_final(partial) and protocol.decode_partial(partial) == ["x", "yz"]


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"MESSAGES": np.array([b"[]"], dtype=object)}, "non-empty JSON array"),
        ({"MESSAGES": np.array([b"\xff"], dtype=object)}, "UTF-8 JSON"),
        ({"MESSAGES": np.array([b'[{"content": "x"}]'], dtype=object)}, r"MESSAGES\[0\]"),
        (
            {"MESSAGES": np.array([b'[{"role": "user"}]'], dtype=object),
             "TEMPERATURE": np.array([5.0], dtype=np.float32)},
            "TEMPERATURE",
        ),
        (
            {"MESSAGES": np.array([b'[{"role": "user"}]'], dtype=object),
             "N": np.array([99], dtype=np.int32)},
            "N must be",
        ),
    ],
)  # fmt: skip
def test_protocol_rejects_bad_requests(tensors: dict, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        protocol.decode_request(tensors)
