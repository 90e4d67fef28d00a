"""Writing spanmill models into a Triton model repository.

One Triton model per agent, one Triton version per MLflow model version. Two
flavours:

* ``python``: Triton's Python backend running transformers (CPU or GPU); what
  runs locally and in tests.
* ``vllm``: Triton's vLLM backend with LoRA adapters, for GPU clusters. vLLM
  cannot run on a machine without a GPU, so here it is written and validated,
  not served.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from spanmill.errors import SpanmillError
from spanmill.precision import ServingDtype
from spanmill.serving import protocol, vllm
from spanmill.serving.generation import SERVING_SPEC, ServingSpec

Flavour = Literal["python", "vllm"]
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_ENTRY_POINT = Path(__file__).with_name("triton_model.py")


class RepositoryError(SpanmillError):
    """A model or version cannot be written to the model repository."""


def _check_target(repository: Path, model_name: str, version: int) -> Path:
    if not _MODEL_NAME.match(model_name):
        raise RepositoryError(
            f"Triton model name {model_name!r} must be letters, digits, '_', '.' or '-'"
        )
    if version < 1:
        raise RepositoryError(f"Triton versions start at 1, got {version}")
    return repository / model_name / str(version)


def _tensor_block(
    kind: str,
    tensors: Mapping[str, tuple[str, list[int]]],
    required: frozenset[str] = protocol.REQUIRED_INPUTS,
) -> str:
    entries = []
    for name, (dtype, dims) in tensors.items():
        optional = "\n    optional: true" if kind == "input" and name not in required else ""
        entries.append(
            f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: {dims}{optional}\n  }}'
        )
    return f"{kind} [\n" + ",\n".join(entries) + "\n]\n"


def python_config(
    model_name: str,
    *,
    instances: int = 1,
    gpu: bool = False,
    max_queue_size: int = protocol.MAX_QUEUE_SIZE,
    max_batch_size: int = protocol.MAX_BATCH_SIZE,
) -> str:
    """config.pbtxt of the Python-backend flavour, complete (no auto-complete needed)."""
    kind = "KIND_GPU" if gpu else "KIND_CPU"
    return (
        f'name: "{model_name}"\n'
        'backend: "python"\n'
        f"max_batch_size: {max_batch_size}\n"
        f"dynamic_batching {{ max_queue_delay_microseconds: {protocol.MAX_QUEUE_DELAY_US}"
        f" default_queue_policy {{ max_queue_size: {max_queue_size} }} }}\n"
        # Every version present is served, so champion and challenger can run side by side.
        "version_policy: { all: {} }\n"
        # Decoupled: answers leave through a response sender, a streamed one token by token.
        "model_transaction_policy { decoupled: true }\n"
        + _tensor_block("input", protocol.INPUTS)
        + _tensor_block("output", protocol.OUTPUTS)
        + f"instance_group [ {{ kind: {kind} count: {instances} }} ]\n"
    )


def write_python_version(
    repository: Path,
    model_name: str,
    version: int,
    base_model: str | Path,
    adapter: Path | None = None,
    *,
    dtype: ServingDtype = "auto",
    copy_base: bool = False,
    num_threads: int = 0,
    max_tokens_limit: int = 1024,
    gpu: bool = False,
    max_queue_size: int = protocol.MAX_QUEUE_SIZE,
    max_batch_size: int = protocol.MAX_BATCH_SIZE,
) -> Path:
    """Write (or replace) one version of a Python-backend model; returns the version folder.

    The adapter is always copied into the version folder, so a version stays what
    it was when written. The base model is referenced where it lies unless
    ``copy_base`` asks for a self-contained version (needed when the repository is
    shipped to another machine).
    """
    version_dir = _check_target(repository, model_name, version)
    base = str(base_model)
    if isinstance(base_model, Path) or Path(base).exists():
        base_path = Path(base).resolve()
        if not (base_path / "config.json").exists():
            raise RepositoryError(f"base model {base_path} has no config.json")
        base = str(base_path)
    if adapter is not None and not (adapter / "adapter_config.json").exists():
        raise RepositoryError(f"LoRA adapter {adapter} has no adapter_config.json")

    staging = version_dir.with_name(f".{version}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    spec_base = base
    if copy_base and Path(base).exists():
        shutil.copytree(base, staging / "base")
        spec_base = "base"
    spec_adapter = None
    if adapter is not None:
        shutil.copytree(adapter, staging / "adapter")
        spec_adapter = "adapter"
    shutil.copy2(_ENTRY_POINT, staging / "model.py")
    spec = ServingSpec(
        base_model=spec_base,
        adapter=spec_adapter,
        dtype=dtype,
        num_threads=num_threads,
        max_tokens_limit=max_tokens_limit,
    )
    (staging / SERVING_SPEC).write_text(spec.to_json())

    config = version_dir.parent / "config.pbtxt"
    config_text = python_config(
        model_name, gpu=gpu, max_queue_size=max_queue_size, max_batch_size=max_batch_size
    )
    if config.exists() and 'backend: "python"' not in config.read_text():
        raise RepositoryError(f"{config.parent} holds a model of another flavour")
    config.write_text(config_text)
    if version_dir.exists():
        shutil.rmtree(version_dir)
    staging.rename(version_dir)
    return version_dir


def write_echo_version(repository: Path, model_name: str, version: int) -> Path:
    """A version that echoes the last user message: measures everything but the model."""
    version_dir = _check_target(repository, model_name, version)
    version_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(_ENTRY_POINT, version_dir / "model.py")
    spec = ServingSpec(base_model="", engine="echo")
    (version_dir / SERVING_SPEC).write_text(spec.to_json())
    (version_dir.parent / "config.pbtxt").write_text(python_config(model_name))
    return version_dir


def vllm_config(model_name: str, *, every_version: bool = False) -> str:
    """config.pbtxt of the vLLM flavour, complete: Triton runs with auto-complete off, so
    the backend's own tensors (:mod:`spanmill.serving.vllm`) are written out. vLLM
    batches by itself (``max_batch_size: 0``) and answers through a response sender.

    An agent's model is one engine, one version: adapters are its versions
    (multi_lora.json). ``every_version``: each version present is an engine of its own
    (the evaluations' candidate models, one version an evaluation)."""
    policy = "all: {}" if every_version else "latest: { num_versions: 1 }"
    return (
        f'name: "{model_name}"\n'
        'backend: "vllm"\n'
        "max_batch_size: 0\n"
        "model_transaction_policy { decoupled: true }\n"
        f"version_policy: {{ {policy} }}\n"
        + _tensor_block("input", vllm.INPUTS, vllm.REQUIRED_INPUTS)
        + _tensor_block("output", vllm.OUTPUTS)
        + "instance_group [ { count: 1, kind: KIND_MODEL } ]\n"
    )


# The vLLM flavour serves every version of an agent from one engine: Triton version 1
# of the agent's model, whose adapters (multi_lora.json) are the registered versions.
ENGINE_VERSION = 1


def write_vllm_engine(
    repository: Path,
    model_name: str,
    base_model: str,
    adapters: Mapping[str, str],
    *,
    max_lora_rank: int = 64,
    gpu_memory_utilization: float = 0.45,
    tensor_parallel_size: int = 1,
    max_model_len: int = 4096,
    dtype: ServingDtype = "auto",
    version: int = ENGINE_VERSION,
    every_version: bool = False,
) -> Path:
    """Write (or replace) the engine version of a vLLM-backend model; returns its folder.

    ``adapters`` maps the LoRA name a request asks for (``sampling_parameters``'
    ``lora_name``) to where the adapter lies as Triton sees it. No adapters: the base
    model alone serves (an agent's first version). The backend reads both files when
    the model loads, so a changed list takes a reload of the model. ``version`` and
    ``every_version``: see :func:`vllm_config`.
    """
    version_dir = _check_target(repository, model_name, version)
    if not 0 < gpu_memory_utilization <= 1:
        raise RepositoryError(
            f"gpu_memory_utilization must be within (0, 1], got {gpu_memory_utilization}"
        )
    for name in adapters:
        if not _MODEL_NAME.match(name):
            raise RepositoryError(f"LoRA name {name!r} must be letters, digits, '_', '.' or '-'")
    engine: dict[str, Any] = {
        "model": base_model,
        "disable_log_requests": True,
        "gpu_memory_utilization": gpu_memory_utilization,
        "tensor_parallel_size": tensor_parallel_size,
        "max_model_len": max_model_len,
        "dtype": dtype,
        # Always on, so the memory planned for adapters does not change as they come.
        "enable_lora": True,
        "max_lora_rank": max_lora_rank,
        "max_loras": max(1, len(adapters)),
    }
    staging = version_dir.with_name(f".{version}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    (staging / "model.json").write_text(json.dumps(engine, indent=2))
    (staging / "multi_lora.json").write_text(json.dumps(dict(adapters), indent=2))
    config = version_dir.parent / "config.pbtxt"
    if config.exists() and 'backend: "vllm"' not in config.read_text():
        raise RepositoryError(f"{config.parent} holds a model of another flavour")
    config.write_text(vllm_config(model_name, every_version=every_version))
    if version_dir.exists():
        shutil.rmtree(version_dir)
    staging.rename(version_dir)
    return version_dir


def check_vllm_adapter(folder: Path, max_lora_rank: int) -> None:
    """Raise RepositoryError where the PEFT adapter in ``folder`` cannot join a vLLM engine
    whose ``max_lora_rank`` is given: no ``adapter_config.json``, or a rank above it (the
    engine would refuse it only at the first request that asks for it)."""
    path = folder / "adapter_config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise RepositoryError(f"the LoRA adapter {folder} has no adapter_config.json") from None
    except (OSError, ValueError) as exc:
        raise RepositoryError(f"{path} cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise RepositoryError(f"{path} is not a JSON object")
    ranks = [config.get("r", 8), *dict(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(rank, int) and rank > 0 for rank in ranks):
        raise RepositoryError(f"{path}: LoRA ranks must be positive integers, got {ranks}")
    if max(ranks) > max_lora_rank:
        raise RepositoryError(
            f"the LoRA adapter {folder} has rank {max(ranks)}, above the vLLM engine's "
            f"max_lora_rank {max_lora_rank} (SPANMILL_SERVING_VLLM_MAX_LORA_RANK; the chart's "
            "triton.vllm.maxLoraRank)"
        )


def versions(repository: Path, model_name: str) -> list[int]:
    """The versions present for a model, ascending."""
    folder = repository / model_name
    if not folder.exists():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def remove_version(repository: Path, model_name: str, version: int) -> None:
    shutil.rmtree(_check_target(repository, model_name, version), ignore_errors=True)
