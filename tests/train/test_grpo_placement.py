"""Where GRPO's policy runs, decided without a GPU: the choices a GPU node would take."""

from __future__ import annotations

import pytest
import torch

from spanmill.serving.generation import Generator
from spanmill.train.rl import placement
from spanmill.train.settings import TrainSettings


def test_on_a_gpu_the_policy_generates_and_trains_there_in_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert placement(TrainSettings(track=False)) == ("cuda", torch.bfloat16)
    assert placement(TrainSettings(track=False, precision="fp16")) == ("cuda", torch.float16)
    assert placement(TrainSettings(track=False, precision="fp32")) == ("cuda", torch.float32)


def test_on_a_cpu_without_bf16_instructions_it_is_fp32_unless_bf16_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert placement(TrainSettings(track=False)) == ("cpu", torch.float32)
    assert placement(TrainSettings(track=False, precision="bf16")) == ("cpu", torch.bfloat16)
    with pytest.raises(Exception, match="fp16 needs a GPU"):
        placement(TrainSettings(track=False, precision="fp16"))


def test_generation_sends_its_inputs_where_the_weights_are() -> None:
    class Tokenizer:
        eos_token_id = 2
        pad_token_id = 2

    with torch.device("meta"):
        model = torch.nn.Linear(2, 2)
    model.generation_config = type("Config", (), {"eos_token_id": 2})()  # type: ignore[assignment]
    generator = Generator.around(model, Tokenizer())
    assert generator.device == torch.device("meta")
    assert generator.eos_ids == [2] and generator.pad_id == 2
