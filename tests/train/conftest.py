"""Fixtures for training tests: reference datasets, and a tiny model for the plumbing."""

from __future__ import annotations

from pathlib import Path

import pytest

from spanmill.tasks import get_task
from spanmill.train import write_reference_dataset


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A randomly initialised two-layer Llama with SmolLM2's tokenizer and chat template.

    It learns nothing useful, but trains in milliseconds a step, which is what
    tests of resuming, inputs and trainer wiring need.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Reference solutions of the calculator: 24 train episodes (48 samples), 4 eval."""
    folder = tmp_path_factory.mktemp("calculator-reference")
    return write_reference_dataset(get_task("calculator"), folder, n_train=24, n_eval=4)
