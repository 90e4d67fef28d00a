"""The number format a model computes in follows the device it loads on.

bf16 only where the hardware multiplies it (on an AVX2-only CPU a SmolLM2 training
step took 22 times as long in bf16 as in fp32); these tests decide both ways on any
machine by standing in for the hardware's answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spanmill import precision
from spanmill.config import ServingSettings
from spanmill.rollout.materialize import ServingOptions
from spanmill.serving.generation import Generator, ServingSpec
from spanmill.train.rl import placement
from spanmill.train.settings import TrainSettings


def _cpu(monkeypatch: pytest.MonkeyPatch, *, avx512_bf16: bool, amx: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)


@pytest.mark.parametrize(("avx512_bf16", "amx"), [(True, False), (False, True), (True, True)])
def test_a_cpu_with_bf16_instructions_computes_in_bf16(
    monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool, amx: bool
) -> None:
    _cpu(monkeypatch, avx512_bf16=avx512_bf16, amx=amx)
    assert precision.bf16_native("cpu")
    assert precision.resolve("auto", "cpu") == "bfloat16"
    assert placement(TrainSettings(track=False)) == ("cpu", torch.bfloat16)


def test_a_cpu_without_them_computes_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu(monkeypatch, avx512_bf16=False, amx=False)
    assert not precision.bf16_native("cpu")
    assert precision.resolve("auto", "cpu") == "float32"
    assert placement(TrainSettings(track=False)) == ("cpu", torch.float32)


def test_a_format_asked_for_by_name_is_kept_and_a_slow_one_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _cpu(monkeypatch, avx512_bf16=False, amx=False)
    with caplog.at_level("WARNING", logger="spanmill.precision"):
        assert precision.resolve("bfloat16", "cpu") == "bfloat16"
    assert "without hardware support" in caplog.text
    assert placement(TrainSettings(track=False, precision="bf16")) == ("cpu", torch.bfloat16)
    assert precision.resolve("float32", "cpu") == "float32"


def test_a_gpu_decides_by_its_own_support(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CPU's answer must not matter for a GPU instance.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision.resolve("auto", "cuda:1") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert precision.resolve("auto", "cuda:0") == "float32"


def test_serving_defaults_to_auto_everywhere_a_version_is_written() -> None:
    assert ServingSettings().dtype == "auto"
    assert ServingOptions().dtype == "auto"
    assert ServingSpec(base_model="m").dtype == "auto"


@pytest.mark.parametrize(("native", "expected"), [(False, torch.float32), (True, torch.bfloat16)])
def test_a_served_model_loads_in_the_format_its_device_decides(
    monkeypatch: pytest.MonkeyPatch, smollm2_dir: Path, native: bool, expected: torch.dtype
) -> None:
    _cpu(monkeypatch, avx512_bf16=native, amx=False)
    generator = Generator(str(smollm2_dir))
    assert generator.model.dtype == expected
