"""Fixtures for rollout tests: small models that fail in realistic ways, the gateway in front
of the session's Triton, the registry, and an in-memory Kubernetes API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollout_helpers import gateway_settings

from spanmill.contracts import TrainManifest
from spanmill.gateway.app import create_app
from spanmill.registry import ModelRegistry

# A chat template like those of models that take no system prompt: rendering one raises.
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('this model takes no system prompt') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="session")
def no_system_model(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A tiny random Llama whose chat template rejects system prompts.

    It loads and answers a user-only smoke check, then fails every production
    request that carries a system prompt: the kind of fault only traffic finds.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("no-system-model")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    tokenizer.chat_template = NO_SYSTEM_TEMPLATE
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def unloadable_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder with a config and nothing else: Triton fails to load it."""
    folder = tmp_path_factory.mktemp("unloadable-model")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


@pytest.fixture(scope="session")
def smollm2_lora(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A real LoRA adapter on SmolLM2 (untrained: made by PEFT, saved as training would)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("smollm2-lora")
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                        task_type="CAUSAL_LM")  # fmt: skip
    get_peft_model(model, config).save_pretrained(folder)
    # What training writes beside its adapter, and registration reads.
    TrainManifest(
        output_dir=str(folder), base_model=str(smollm2_dir), method="sft", global_step=0,
        dataset_digest="0" * 64,
    ).write(folder)  # fmt: skip
    return folder


@pytest.fixture
def gateway(kafka, triton, serve_app, tmp_path: Path) -> Iterator[tuple[str, Path]]:  # type: ignore[no-untyped-def]
    """A gateway in front of the session's Triton, routing by a file; (url, routing file)."""
    routes = tmp_path / "routes.json"
    app = create_app(gateway_settings(kafka, triton, routing_file=routes))
    with serve_app(app) as url:
        yield url, routes


@pytest.fixture
def registry(mlflow_server) -> ModelRegistry:  # type: ignore[no-untyped-def]
    return ModelRegistry(mlflow_server.tracking_uri)
