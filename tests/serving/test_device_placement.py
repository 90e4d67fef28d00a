"""The Python flavour generates where its Triton instance is: a KIND_GPU instance on its GPU.

There is no GPU here, so the GPU branch is shown by what the generator asks torch
for (the device the weights are moved to), and by the clear refusal when torch
has no CUDA device; the CPU branch runs for real.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from spanmill import serving
from spanmill.serving.generation import Generator, instance_device
from spanmill.serving.repository import write_python_version


@pytest.mark.parametrize(
    ("kind", "device_id", "device"),
    [("GPU", "0", "cuda:0"), ("GPU", 3, "cuda:3"), ("KIND_GPU", "1", "cuda:1"),
     ("CPU", "0", "cpu"), ("MODEL", "0", "cpu")],
)  # fmt: skip
def test_the_device_follows_the_instance_kind(kind: str, device_id: Any, device: str) -> None:
    assert instance_device(kind, device_id) == device


def _entry_point(monkeypatch: pytest.MonkeyPatch) -> Any:
    """triton_model.py as Triton's stub loads it (the backend's utils module only imported)."""
    utils: Any = types.ModuleType("triton_python_backend_utils")

    class MetricFamily:  # what initialize asks of it: metric families, counters in them
        COUNTER = "counter"

        def __init__(self, **_: Any) -> None: ...

        def Metric(self, labels: dict[str, str]) -> Any:
            return types.SimpleNamespace(increment=lambda value: None)

    utils.MetricFamily = MetricFamily
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", utils)
    entry = Path(serving.__file__).with_name("triton_model.py")
    spec = importlib.util.spec_from_file_location("model", entry)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def version(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    repository = tmp_path_factory.mktemp("repository")
    return write_python_version(repository, "calculator", 1, smollm2_dir, dtype="float32")


def _args(version: Path, kind: str, device_id: str = "0") -> dict[str, str]:
    return {
        "model_repository": str(version.parent),
        "model_version": version.name,
        "model_instance_kind": kind,
        "model_instance_device_id": device_id,
    }


def test_a_cpu_instance_generates_on_the_cpu(
    version: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _entry_point(monkeypatch).TritonPythonModel()
    model.initialize(_args(version, "CPU"))
    assert model.generator.device.type == "cpu"
    assert next(model.generator.model.parameters()).device.type == "cpu"


def test_a_cpu_instance_runs_as_many_threads_as_its_pod_has_cpus(
    version: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """torch counts the node's cores; a pod limited to one CPU (its cgroup quota) on a node
    of four gets one thread, not four throttled ones."""
    from spanmill import cpus

    (tmp_path / "cpu.max").write_text("100000 100000\n")
    monkeypatch.setattr(cpus, "CGROUP", tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        _entry_point(monkeypatch).TritonPythonModel().initialize(_args(version, "CPU"))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_gpu_instance_puts_the_weights_on_its_gpu(
    version: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved: list[str] = []
    original = torch.nn.Module.to

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        if args and isinstance(args[0], str):
            moved.append(args[0])
            return self  # no CUDA here: record where the weights were sent, keep them
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.nn.Module, "to", to)
    model = _entry_point(monkeypatch).TritonPythonModel()
    model.initialize(_args(version, "GPU", "1"))
    assert moved == ["cuda:1"]


def test_a_gpu_instance_without_cuda_is_refused_clearly(
    version: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"cuda:0 \(a KIND_GPU Triton instance\).*no CUDA"):
        Generator.from_version_dir(version, device="cuda:0")


def test_a_request_the_model_cannot_take_fails_alone(
    version: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a ProtocolError was answered per request: a chat template's raise_exception
    (roles that do not alternate, say), or a STOP that is not UTF-8, escaped execute, and
    Triton failed every request of the call, those already generating in the batch too
    (answered 502 and counted against the version, a client's bad call could roll back a
    canary). Now each is its own request's 400 and the others are answered."""
    import numpy as np

    module = _entry_point(monkeypatch)
    utils = sys.modules["triton_python_backend_utils"]

    class TritonError:
        INVALID_ARG, UNAVAILABLE = "invalid_arg", "unavailable"

        def __init__(self, message: str, code: str = "internal") -> None:
            self.message, self.code = message, code

    utils.TritonError = TritonError
    utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    utils.InferenceResponse = lambda tensors=None, error=None: types.SimpleNamespace(
        tensors=tensors, error=error
    )
    utils.Tensor = lambda name, value: (name, value)
    utils.get_input_tensor_by_name = lambda request, name: (
        types.SimpleNamespace(as_numpy=lambda: request.inputs[name])
        if name in request.inputs else None
    )  # fmt: skip

    class Sender:
        def __init__(self) -> None:
            self.final: Any = None

        def send(self, response: Any = None, flags: int = 0) -> None:
            if flags:
                self.final = response

        def is_cancelled(self) -> bool:
            return False

    def request(messages: Any, **more: Any) -> Any:
        inputs = {"MESSAGES": np.array([json.dumps(messages).encode()], dtype=object),
                  "MAX_TOKENS": np.array([4], dtype=np.int32), **more}  # fmt: skip
        sender = Sender()
        return types.SimpleNamespace(inputs=inputs, get_response_sender=lambda: sender), sender

    model = module.TritonPythonModel()
    model.initialize(_args(version, "CPU"))
    try:
        template = model.generator.tokenizer.chat_template
        model.generator.tokenizer.chat_template = (
            "{% if messages[0]['role'] == 'assistant' %}"
            "{{ raise_exception('conversations start with the user') }}{% endif %}" + template
        )
        refused, refused_sender = request([{"role": "assistant", "content": "hi"}])
        not_text, not_text_sender = request(
            [{"role": "user", "content": "hi"}], STOP=np.array([b"\xff"], dtype=object)
        )
        fine, fine_sender = request([{"role": "user", "content": "Say hi."}])
        model.execute([refused, not_text, fine])
        deadline = time.monotonic() + 120
        while fine_sender.final is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        model.finalize()
    assert refused_sender.final.error.code == TritonError.INVALID_ARG
    assert "chat template refused them" in refused_sender.final.error.message
    assert "conversations start with the user" in refused_sender.final.error.message
    assert not_text_sender.final.error.code == TritonError.INVALID_ARG
    assert fine_sender.final.error is None and fine_sender.final.tensors
