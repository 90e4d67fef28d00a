"""Writing a registered version into the Triton model repository, as the matching version.

MLflow version N of an agent becomes Triton version N of the agent's model, in
the configured flavour. A version is written to a staging folder first and moved
into the repository whole, so Triton never sees half a version, and a controller
killed mid-write leaves nothing behind that a later load would trip on.
"""

from __future__ import annotations

import contextlib
import filecmp
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from spanmill.config import ServingSettings, TritonSettings
from spanmill.errors import SpanmillError
from spanmill.registry import names
from spanmill.registry.client import RegisteredVersion
from spanmill.serving.generation import Dtype
from spanmill.serving.repository import (
    RepositoryError,
    write_echo_version,
    write_python_version,
    write_vllm_version,
)

Flavour = Literal["python", "vllm"]
# Written into every version folder: which registered version it was made from, so a
# folder put there by other means is never taken for the registered version.
ORIGIN = "spanmill-registered.json"


class MaterializeError(SpanmillError):
    """A registered version cannot be turned into a Triton version."""


class Downloader(Protocol):
    def download(self, agent: str, version: int, destination: Path) -> Path: ...


@dataclass(frozen=True)
class ServingOptions:
    """How versions are written; one set per controller."""

    flavour: Flavour = "python"
    dtype: Dtype = "bfloat16"
    num_threads: int = 0
    copy_base: bool = False
    gpu: bool = False
    # Where Triton sees the repository, when it differs from where the controller
    # writes it (vLLM adapter paths are read by Triton, not by the controller).
    triton_root: str | None = None
    vllm_max_lora_rank: int = 64
    vllm_gpu_memory_utilization: float = 0.9
    vllm_max_model_len: int = 4096

    @classmethod
    def from_settings(cls, serving: ServingSettings, triton: TritonSettings) -> ServingOptions:
        """The options every writer of versions shares (controller, evaluation, deploy step)."""
        return cls(
            flavour=serving.flavour,
            dtype=serving.dtype,
            num_threads=serving.num_threads,
            copy_base=serving.copy_base,
            gpu=serving.gpu,
            triton_root=triton.server_repository,
        )


class ModelRepository:
    """A Triton model repository on a local folder or an fsspec URL (s3://...)."""

    @classmethod
    def from_settings(cls, triton: TritonSettings) -> ModelRepository:
        return cls(triton.model_repository, triton.repository_options)

    def __init__(self, location: str, storage_options: dict[str, Any] | None = None) -> None:
        self.location = location.rstrip("/")
        self.local = "://" not in location
        self._fs: Any = None
        if not self.local:
            import fsspec

            self._fs, self._root = fsspec.core.url_to_fs(location, **(storage_options or {}))
        else:
            Path(location).mkdir(parents=True, exist_ok=True)

    def _path(self, *parts: str) -> str:
        base = self.location if self.local else self._root.rstrip("/")
        return "/".join([base, *parts])

    def versions(self, model: str) -> list[int]:
        folder = self._path(model)
        if self.local:
            path = Path(folder)
            entries = [p.name for p in path.iterdir() if p.is_dir()] if path.is_dir() else []
        else:
            try:
                entries = [
                    p.rstrip("/").rsplit("/", 1)[-1] for p in self._fs.ls(folder, detail=False)
                ]
            except FileNotFoundError:
                entries = []
        return sorted(int(e) for e in entries if e.isdigit())

    def has(self, model: str, version: int) -> bool:
        return version in self.versions(model)

    def install(self, staged_model_dir: Path, model: str, version: int) -> None:
        """Move a staged ``<model>/<version>`` (and its config) into the repository."""
        staged_version = staged_model_dir / str(version)
        config = staged_model_dir / "config.pbtxt"
        if self.local:
            target = Path(self._path(model))
            target.mkdir(parents=True, exist_ok=True)
            final = target / str(version)
            if final.exists():
                shutil.rmtree(final)
            # Same filesystem when staged beside it: the version appears at once.
            shutil.move(str(staged_version), str(final))
            current = target / "config.pbtxt"
            # An unchanged config stays untouched: Triton reads a changed one as a new model.
            if not current.exists() or not filecmp.cmp(config, current, shallow=False):
                tmp = target / ".config.pbtxt.tmp"
                shutil.copyfile(config, tmp)
                tmp.replace(current)
            return
        remote = self._path(model, str(version))
        self._fs.put(str(staged_version), remote, recursive=True)
        self._fs.put(str(config), self._path(model, "config.pbtxt"))

    def remove(self, model: str, version: int) -> None:
        if self.local:
            shutil.rmtree(self._path(model, str(version)), ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm(self._path(model, str(version)), recursive=True)

    def origin(self, model: str, version: int) -> dict[str, Any] | None:
        """What :data:`ORIGIN` says about a version folder; None when it has none."""
        path = self._path(model, str(version), ORIGIN)
        try:
            if self.local:
                text = Path(path).read_text()
            else:
                with self._fs.open(path, "r") as handle:
                    text = handle.read()
            data = json.loads(text)
        except (FileNotFoundError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def staging(self) -> tempfile.TemporaryDirectory[str]:
        """A scratch folder, beside the repository when it is local (for an atomic move)."""
        if self.local:
            return tempfile.TemporaryDirectory(prefix=".staging-", dir=self.location)
        return tempfile.TemporaryDirectory(prefix="spanmill-staging-")


def resolve_base(base_model: str) -> str:
    """A base model reference Triton can load: a folder, a catalog name, or a hub id."""
    from spanmill.models.resolve import resolve_model

    return resolve_model(base_model)


def materialize(
    registered: RegisteredVersion,
    downloader: Downloader,
    repository: ModelRepository,
    options: ServingOptions,
) -> None:
    """Write ``registered`` into ``repository`` as Triton version ``registered.version``."""
    agent, version = registered.agent, registered.version
    model = names.triton_model(agent)
    lineage = registered.lineage
    with repository.staging() as scratch:
        stage = Path(scratch) / "repository"
        download = Path(scratch) / "download"
        try:
            if options.flavour == "vllm":
                _vllm(registered, downloader, stage, options, download, repository)
            elif lineage.kind == "echo":
                write_echo_version(stage, model, version)
            elif lineage.kind == "base":
                write_python_version(stage, model, version, resolve_base(lineage.base_model),
                                     dtype=options.dtype, num_threads=options.num_threads,
                                     copy_base=options.copy_base, gpu=options.gpu)  # fmt: skip
            elif lineage.kind == "adapter":
                adapter = downloader.download(agent, version, download)
                write_python_version(stage, model, version, resolve_base(lineage.base_model),
                                     adapter=adapter, dtype=options.dtype,
                                     num_threads=options.num_threads,
                                     copy_base=options.copy_base, gpu=options.gpu)  # fmt: skip
            else:
                folder = downloader.download(agent, version, download)
                # The downloaded folder is temporary: the version keeps its own copy.
                write_python_version(stage, model, version, folder, dtype=options.dtype,
                                     num_threads=options.num_threads, copy_base=True,
                                     gpu=options.gpu)  # fmt: skip
        except RepositoryError as exc:
            raise MaterializeError(f"{agent} version {version}: {exc}") from None
        (stage / model / str(version) / ORIGIN).write_text(json.dumps(origin_of(registered)))
        repository.install(stage / model, model, version)


def origin_of(registered: RegisteredVersion) -> dict[str, Any]:
    return {
        "agent": registered.agent,
        "version": registered.version,
        "source": registered.source,
        "run_id": registered.run_id,
    }


def _vllm(
    registered: RegisteredVersion,
    downloader: Downloader,
    stage: Path,
    options: ServingOptions,
    download: Path,
    repository: ModelRepository,
) -> None:
    agent, version = registered.agent, registered.version
    lineage = registered.lineage
    if lineage.kind != "adapter":
        raise MaterializeError(
            f"{agent} version {version} is a {lineage.kind!r} version; the vllm flavour serves "
            "LoRA adapters on a base model (use SPANMILL_SERVING_FLAVOUR=python for it)"
        )
    model = names.triton_model(agent)
    adapter = downloader.download(agent, version, download)
    version_dir = stage / model / str(version)
    shutil.copytree(adapter, version_dir / "adapter")
    root = (options.triton_root or repository.location).rstrip("/")
    seen_by_triton = f"{root}/{model}/{version}/adapter"
    write_vllm_version(
        stage,
        model,
        version,
        lineage.base_model,
        {names.lora_name(agent, version): seen_by_triton},
        max_lora_rank=options.vllm_max_lora_rank,
        gpu_memory_utilization=options.vllm_gpu_memory_utilization,
        max_model_len=options.vllm_max_model_len,
    )
