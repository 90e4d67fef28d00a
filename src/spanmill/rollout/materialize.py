"""Writing a registered version into the Triton model repository, as the matching version.

MLflow version N of an agent becomes Triton version N of the agent's model, in
the configured flavour. A version is written to a staging folder first and moved
into the repository whole, so Triton never sees half a version, and a controller
killed mid-write leaves nothing behind that a later load would trip on. An object
store has no move: there a version's upload is marked (:data:`WRITING`) from its
first object to its last, and the next deploy writes a version that still holds the
mark again (see :meth:`ModelRepository.unfinished`).
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
from spanmill.precision import ServingDtype
from spanmill.registry import names
from spanmill.registry.client import RegisteredVersion
from spanmill.serving.repository import (
    ENGINE_VERSION,
    RepositoryError,
    check_vllm_adapter,
    write_echo_version,
    write_python_version,
    write_vllm_engine,
)

Flavour = Literal["python", "vllm"]
# Written into every version folder: which registered version it was made from, so a
# folder put there by other means is never taken for the registered version.
ORIGIN = "spanmill-registered.json"
# In a version folder on an object store while it is uploaded: put first, removed last.
WRITING = "spanmill-writing"
# In a vLLM engine's folder: the registered versions it serves, by LoRA name.
SERVED = "spanmill-served.json"


class MaterializeError(SpanmillError):
    """A registered version cannot be turned into a Triton version."""


class Downloader(Protocol):
    def download(self, agent: str, version: int, destination: Path) -> Path: ...


@dataclass(frozen=True)
class ServingOptions:
    """How versions are written; one set per controller."""

    flavour: Flavour = "python"
    dtype: ServingDtype = "auto"
    num_threads: int = 0
    copy_base: bool = False
    gpu: bool = False
    # Where Triton sees the repository, when it differs from where the controller
    # writes it (vLLM adapter paths are read by Triton, not by the controller).
    triton_root: str | None = None
    vllm_max_lora_rank: int = 64
    vllm_gpu_memory_utilization: float = 0.45
    vllm_max_model_len: int = 4096
    vllm_tensor_parallel_size: int = 1

    @classmethod
    def from_settings(cls, serving: ServingSettings, triton: TritonSettings) -> ServingOptions:
        """The options every writer of versions shares (the controller, the evaluation)."""
        return cls(
            flavour=serving.flavour,
            dtype=serving.dtype,
            num_threads=serving.num_threads,
            copy_base=serving.copy_base,
            gpu=serving.gpu,
            triton_root=triton.server_repository,
            vllm_max_lora_rank=serving.vllm_max_lora_rank,
            vllm_gpu_memory_utilization=serving.vllm_gpu_memory_utilization,
            vllm_max_model_len=serving.vllm_max_model_len,
            vllm_tensor_parallel_size=serving.vllm_tensor_parallel_size,
        )

    def engine_arguments(self) -> dict[str, Any]:
        """What every vLLM engine is written with (:func:`write_vllm_engine`'s keywords)."""
        return {
            "max_lora_rank": self.vllm_max_lora_rank,
            "gpu_memory_utilization": self.vllm_gpu_memory_utilization,
            "max_model_len": self.vllm_max_model_len,
            "tensor_parallel_size": self.vllm_tensor_parallel_size,
            # As for the Python flavour: a GPU without bfloat16 (before Ampere) needs float16.
            "dtype": self.dtype,
        }


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
            # The pipeline's steps and other controllers write here too (open_store).
            self._fs.invalidate_cache(folder)
            try:
                entries = [
                    p.rstrip("/").rsplit("/", 1)[-1] for p in self._fs.ls(folder, detail=False)
                ]
            except FileNotFoundError:
                entries = []
        return sorted(int(e) for e in entries if e.isdigit())

    def has(self, model: str, version: int) -> bool:
        return version in self.versions(model)

    def install(
        self, staged_model_dir: Path, model: str, version: int, *, keep_failed: bool = False
    ) -> None:
        """Move a staged ``<model>/<version>`` (and its config) into the repository, in
        place of what the version held. Where that fails part way, the version is
        removed again (a load must never find half of it), unless ``keep_failed``, and
        RepositoryError says why."""
        try:
            self._install(staged_model_dir, model, version)
        except Exception as exc:
            if not keep_failed:
                with contextlib.suppress(Exception):  # the cause is what the caller must see
                    self.remove(model, version)
            if isinstance(exc, OSError):
                raise RepositoryError(
                    f"installing {model} version {version} into {self.location} failed: {exc}"
                ) from exc
            raise

    def _install(self, staged_model_dir: Path, model: str, version: int) -> None:
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
        self.remove_folder(model, str(version))
        # The mark goes first and leaves last: a controller killed part way leaves it,
        # and the next deploy writes the version again (a folder without it is someone
        # else's, or whole). Its files one by one, to their own paths: into an existing
        # folder, a put of the folder would nest the staged one inside it.
        marker = self._path(model, str(version), WRITING)
        self._fs.pipe_file(marker, b"")
        files = sorted(p for p in staged_version.rglob("*") if not p.is_dir())
        targets = [f"{remote}/{p.relative_to(staged_version).as_posix()}" for p in files]
        self._fs.put([str(p) for p in files], targets)
        self._fs.put(str(config), self._path(model, "config.pbtxt"))
        self._fs.rm(marker)

    def unfinished(self, model: str, version: int) -> bool:
        """Whether ``version``'s folder is an upload cut short (it still holds its
        :data:`WRITING` mark). A local folder is moved in whole: never."""
        if self.local:
            return False
        marker = self._path(model, str(version), WRITING)
        self._fs.invalidate_cache(self._path(model, str(version)))
        return bool(self._fs.exists(marker))

    def remove(self, model: str, version: int) -> None:
        self.remove_folder(model, str(version))

    def put_folder(self, local: Path, *parts: str) -> None:
        """Copy a local folder to ``parts`` in the repository, replacing what was there."""
        target = self._path(*parts)
        if self.local:
            staged = Path(f"{target}.staging")
            shutil.rmtree(staged, ignore_errors=True)
            shutil.copytree(local, staged)
            shutil.rmtree(target, ignore_errors=True)
            staged.rename(target)
            return
        self.remove_folder(*parts)
        self._fs.put(str(local), target, recursive=True)

    def remove_folder(self, *parts: str) -> None:
        if self.local:
            shutil.rmtree(self._path(*parts), ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm(self._path(*parts), recursive=True)

    def read_json(self, *parts: str) -> dict[str, Any] | None:
        """A JSON object kept in the repository; None when absent or not an object."""
        path = self._path(*parts)
        try:
            if self.local:
                text = Path(path).read_text()
            else:
                self._fs.invalidate_cache(path)
                with self._fs.open(path, "r") as handle:
                    text = handle.read()
            data = json.loads(text)
        except (FileNotFoundError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_json(self, data: dict[str, Any], *parts: str) -> None:
        """Keep a JSON object at ``parts``, in place of what was there (a reader sees the
        old object or the new one, never part of one)."""
        path = self._path(*parts)
        text = json.dumps(data)
        if self.local:
            target = Path(path)
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(text)
            tmp.replace(target)
            return
        self._fs.pipe_file(path, text.encode())

    def origin(self, model: str, version: int) -> dict[str, Any] | None:
        """What :data:`ORIGIN` says about a version folder; None when it has none."""
        return self.read_json(model, str(version), ORIGIN)

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
    """Write ``registered`` into ``repository`` as Triton version ``registered.version``
    (in the vLLM flavour: into the agent's engine, see :func:`add_to_engine`)."""
    if options.flavour == "vllm":
        add_to_engine(registered, downloader, repository, options)
        return
    agent, version = registered.agent, registered.version
    model = names.triton_model(agent)
    lineage = registered.lineage
    with repository.staging() as scratch:
        stage = Path(scratch) / "repository"
        download = Path(scratch) / "download"
        try:
            if lineage.kind == "echo":
                write_echo_version(stage, model, version)
            else:
                base, adapter, downloaded = weights_of(registered, downloader, download)
                write_python_version(stage, model, version, base, adapter=adapter,
                                     dtype=options.dtype, num_threads=options.num_threads,
                                     copy_base=options.copy_base or downloaded,
                                     gpu=options.gpu)  # fmt: skip
        except RepositoryError as exc:
            raise MaterializeError(f"{agent} version {version}: {exc}") from None
        (stage / model / str(version) / ORIGIN).write_text(json.dumps(origin_of(registered)))
        repository.install(stage / model, model, version)


def weights_of(
    registered: RegisteredVersion, downloader: Downloader, download: Path
) -> tuple[str, Path | None, bool]:
    """A registered version (not an echo one) as a Python-flavour version is written
    from it: its base model, its adapter (None for a base or a whole model), and whether
    the base is a download into ``download``, which the version must copy (the folder is
    temporary)."""
    lineage = registered.lineage
    if lineage.kind == "base":
        return resolve_base(lineage.base_model), None, False
    folder = downloader.download(registered.agent, registered.version, download)
    if lineage.kind == "adapter":
        return resolve_base(lineage.base_model), folder, False
    return str(folder), None, True


def origin_of(registered: RegisteredVersion) -> dict[str, Any]:
    return {
        "agent": registered.agent,
        "version": registered.version,
        "source": registered.source,
        "run_id": registered.run_id,
    }


@dataclass(frozen=True)
class Engine:
    """What an agent's vLLM engine serves: registered versions by LoRA name (None: the base
    model itself), the base model as registered, and where each version came from."""

    base_model: str
    versions: dict[int, str | None]
    origins: dict[int, dict[str, Any]]

    def to_json(self) -> str:
        return json.dumps({
            "base_model": self.base_model,
            "versions": {str(v): lora for v, lora in self.versions.items()},
            "origins": {str(v): origin for v, origin in self.origins.items()},
        }, indent=2)  # fmt: skip


def read_engine(repository: ModelRepository, model: str) -> Engine | None:
    """The engine record of a vLLM-flavour model; None when the model has no engine."""
    data = repository.read_json(model, str(ENGINE_VERSION), SERVED)
    if data is None:
        return None
    return Engine(
        base_model=str(data["base_model"]),
        versions={int(v): lora for v, lora in dict(data.get("versions", {})).items()},
        origins={int(v): dict(o) for v, o in dict(data.get("origins", {})).items()},
    )


def engine_base(reference: str) -> str:
    """The base model as vLLM in the Triton pod opens it: a hub id (a catalog name is
    its hub id) or a path Triton sees; never a name only spanmill knows."""
    from spanmill.models.catalog import CATALOG

    entry = CATALOG.get(reference)
    return entry.hf_id if entry is not None else reference


def adapter_root(repository: ModelRepository, options: ServingOptions) -> str:
    """The model repository as Triton sees it, where the vLLM backend opens adapters from."""
    root = (options.triton_root or repository.location).rstrip("/")
    if "://" in root:
        raise MaterializeError(
            f"the vLLM backend opens LoRA adapters from local paths, and Triton reads the model "
            f"repository at {root}: serve the vllm flavour from a repository on a volume "
            "(the chart's triton.modelRepository.type pvc)"
        )
    return root


def write_engine(
    repository: ModelRepository, model: str, engine: Engine, options: ServingOptions
) -> None:
    """Write the engine's version folder for ``engine`` (its model.json, its adapter list
    and its record) in one move; an engine that serves nothing more is removed."""
    if not engine.versions:
        repository.remove(model, ENGINE_VERSION)
        return
    root = adapter_root(repository, options)
    adapters = {
        lora: f"{root}/{model}/adapters/{lora}"
        for lora in sorted(lora for lora in engine.versions.values() if lora)
    }
    with repository.staging() as scratch:
        stage = Path(scratch) / "repository"
        try:
            write_vllm_engine(
                stage, model, engine_base(engine.base_model), adapters,
                **options.engine_arguments(),
            )  # fmt: skip
        except RepositoryError as exc:
            raise MaterializeError(f"{model}: {exc}") from None
        (stage / model / str(ENGINE_VERSION) / SERVED).write_text(engine.to_json())
        # Kept where it fails: Triton keeps serving the engine it holds when a reload
        # cannot load the new one, where a removed engine would unload the agent.
        repository.install(stage / model, model, ENGINE_VERSION, keep_failed=True)


def add_to_engine(
    registered: RegisteredVersion,
    downloader: Downloader,
    repository: ModelRepository,
    options: ServingOptions,
) -> Engine:
    """Serve ``registered`` from its agent's vLLM engine: an adapter joins the engine's
    adapter list under its LoRA name (its files copied where Triton reads them); a base
    version is the engine's base model itself. The engine is written, not loaded."""
    agent, version = registered.agent, registered.version
    lineage = registered.lineage
    if lineage.kind not in ("adapter", "base") or not lineage.base_model:
        raise MaterializeError(
            f"{agent} version {version} is a {lineage.kind!r} version; the vllm flavour serves "
            "a base model and LoRA adapters on it (use SPANMILL_SERVING_FLAVOUR=python for it)"
        )
    model = names.triton_model(agent)
    engine = read_engine(repository, model)
    if engine is None:
        engine = Engine(base_model=lineage.base_model, versions={}, origins={})
    elif engine.versions and engine_base(engine.base_model) != engine_base(lineage.base_model):
        # Compared as the engine opens them: a catalog name and its hub id are one model.
        raise MaterializeError(
            f"{agent} version {version} is on {lineage.base_model!r}, and the agent's vLLM "
            f"engine serves {engine.base_model!r}: one engine serves adapters of one base "
            "model; retire the versions on the other base first"
        )
    lora = None
    if lineage.kind == "adapter":
        lora = names.lora_name(agent, version)
        with tempfile.TemporaryDirectory(prefix="spanmill-adapter-") as scratch:
            adapter = downloader.download(agent, version, Path(scratch) / "download")
            try:
                check_vllm_adapter(adapter, options.vllm_max_lora_rank)
            except RepositoryError as exc:
                raise MaterializeError(f"{agent} version {version}: {exc}") from None
            repository.put_folder(adapter, model, "adapters", lora)
    updated = Engine(
        base_model=lineage.base_model,
        versions={**engine.versions, version: lora},
        origins={**engine.origins, version: origin_of(registered)},
    )
    try:
        write_engine(repository, model, updated, options)
    except Exception:
        # Not listed, the adapter's files would stay for good: removal goes by the record.
        if lora is not None and version not in engine.versions:
            with contextlib.suppress(Exception):
                repository.remove_folder(model, "adapters", lora)
        raise
    return updated


def remove_from_engine(
    repository: ModelRepository, agent: str, version: int, options: ServingOptions
) -> Engine | None:
    """Take ``version`` out of its agent's vLLM engine (written, not loaded); the engine
    as it is now, None when it serves nothing more."""
    model = names.triton_model(agent)
    engine = read_engine(repository, model)
    if engine is None or version not in engine.versions:
        return engine
    lora = engine.versions[version]
    left = Engine(
        base_model=engine.base_model,
        versions={v: n for v, n in engine.versions.items() if v != version},
        origins={v: o for v, o in engine.origins.items() if v != version},
    )
    write_engine(repository, model, left, options)
    if lora:
        repository.remove_folder(model, "adapters", lora)
    return left if left.versions else None
