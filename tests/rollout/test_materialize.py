"""Writing registered versions into a model repository, per kind and flavour (no services)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from spanmill.registry import Lineage, RegisteredVersion
from spanmill.rollout.materialize import (
    ORIGIN,
    MaterializeError,
    ModelRepository,
    ServingOptions,
    materialize,
    origin_of,
    read_engine,
    remove_from_engine,
)
from spanmill.serving.repository import RepositoryError


class FolderDownloader:
    """Hands out a local folder as the version's artifacts."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def download(self, agent: str, version: int, destination: Path) -> Path:
        target = destination / "model"
        shutil.copytree(self.folder, target)
        return target


def registered(version: int, lineage: Lineage, agent: str = "calc") -> RegisteredVersion:
    return RegisteredVersion(agent=agent, version=version, source="mlflow-artifacts:/x",
                             run_id="r", tags=lineage.tags())  # fmt: skip


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    return folder


@pytest.fixture
def base(tmp_path: Path) -> Path:
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_python_flavour_writes_each_kind(tmp_path: Path, adapter: Path, base: Path) -> None:
    repository = ModelRepository(str(tmp_path / "repo"))
    downloader = FolderDownloader(adapter)
    options = ServingOptions()
    materialize(registered(1, Lineage(kind="echo")), downloader, repository, options)
    materialize(registered(2, Lineage(kind="base", base_model=str(base))), downloader,
                repository, options)  # fmt: skip
    materialize(registered(3, Lineage(kind="adapter", base_model=str(base))), downloader,
                repository, options)  # fmt: skip
    materialize(registered(4, Lineage(kind="model")), FolderDownloader(base), repository, options)
    assert repository.versions("calc") == [1, 2, 3, 4]
    root = tmp_path / "repo" / "calc"
    spec = {
        v: json.loads((root / str(v) / "spanmill-serving.json").read_text()) for v in (1, 2, 3, 4)
    }
    assert spec[1]["engine"] == "echo"
    assert spec[2]["base_model"] == str(base.resolve()) and spec[2]["adapter"] is None
    assert spec[3]["adapter"] == "adapter"
    assert (root / "3" / "adapter" / "adapter_model.safetensors").read_bytes() == b"weights"
    # Each version says which registered version it was written from.
    assert json.loads((root / "3" / ORIGIN).read_text())["version"] == 3
    origin = {"agent": "calc", "version": 3, "source": "mlflow-artifacts:/x", "run_id": "r"}
    assert repository.origin("calc", 3) == origin
    # A full model is copied in: the downloaded folder does not outlive the call.
    assert spec[4]["base_model"] == "base" and (root / "4" / "base" / "config.json").exists()
    assert 'backend: "python"' in (root / "config.pbtxt").read_text()
    # Nothing is left behind in the repository but the model.
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["calc"]
    repository.remove("calc", 2)
    assert repository.versions("calc") == [1, 3, 4]


def _staged_version(root: Path, files: dict[str, bytes | None]) -> Path:
    """A staged ``calc`` model with version 2 holding ``files`` (a None value: a link to
    nothing, which cannot be read when the version is copied), and its config."""
    model = root / "calc"
    (model / "2").mkdir(parents=True)
    for name, data in files.items():
        if data is None:
            (model / "2" / name).symlink_to(root / "gone")
        else:
            (model / "2" / name).write_bytes(data)
    (model / "config.pbtxt").write_text('backend: "python"\n')
    return model


@pytest.mark.parametrize("location", ["local", "memory://repository"])
def test_an_install_that_fails_part_way_leaves_no_version(tmp_path: Path, location: str) -> None:
    # A version Triton could load half of is worse than none: a failed copy (an object
    # store gone mid-upload, a full disk) takes away what it wrote, and says why.
    repository = ModelRepository(str(tmp_path / "repo") if location == "local" else location)
    good = _staged_version(tmp_path / "good", {"model.py": b"1"})
    repository.install(good, "calc", 2)
    assert repository.versions("calc") == [2]

    def broken(name: str) -> Path:
        # One file that copies and one that cannot be read.
        staged = _staged_version(tmp_path / name, {"a.py": b"2", "b.bin": None})
        if location == "local":  # a move within one disk cannot fail half way: its config can
            (staged / "config.pbtxt").unlink()
        return staged

    with pytest.raises(RepositoryError, match=r"installing calc version 2 into .* failed"):
        repository.install(broken("broken"), "calc", 2)
    assert repository.versions("calc") == []
    # A vLLM engine's version is kept (Triton keeps serving the engine it holds when it
    # cannot load a broken one; a removed engine would unload the agent).
    repository.install(_staged_version(tmp_path / "again", {"model.py": b"1"}), "calc", 2)
    with pytest.raises(RepositoryError):
        repository.install(broken("broken again"), "calc", 2, keep_failed=True)
    assert repository.versions("calc") == [2]


def test_an_unchanged_config_is_not_rewritten(tmp_path: Path) -> None:
    repository = ModelRepository(str(tmp_path / "repo"))
    downloader = FolderDownloader(tmp_path)
    materialize(registered(1, Lineage(kind="echo")), downloader, repository, ServingOptions())
    config = tmp_path / "repo" / "calc" / "config.pbtxt"
    stamp = config.stat().st_mtime_ns
    materialize(registered(2, Lineage(kind="echo")), downloader, repository, ServingOptions())
    assert config.stat().st_mtime_ns == stamp


def test_vllm_flavour_serves_every_version_from_one_engine(tmp_path: Path, adapter: Path) -> None:
    repository = ModelRepository(str(tmp_path / "repo"))
    options = ServingOptions(flavour="vllm", triton_root="/models")
    base = "smollm2-135m"
    downloader = FolderDownloader(adapter)
    materialize(registered(1, Lineage(kind="base", base_model=base)), downloader, repository,
                options)  # fmt: skip
    # One base, whether named by the catalog or by its hub id (as a pipeline may record it).
    for version, named in ((5, base), (6, "HuggingFaceTB/SmolLM2-135M-Instruct")):
        materialize(registered(version, Lineage(kind="adapter", base_model=named)), downloader,
                    repository, options)  # fmt: skip
    engine_dir = tmp_path / "repo" / "calc" / "1"
    # Adapters by name on one engine, read by Triton where it mounts the repository.
    assert json.loads((engine_dir / "multi_lora.json").read_text()) == {
        "calc-v5": "/models/calc/adapters/calc-v5",
        "calc-v6": "/models/calc/adapters/calc-v6",
    }
    args = json.loads((engine_dir / "model.json").read_text())
    # The catalog name becomes the hub id vLLM can open.
    assert args["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and args["enable_lora"]
    assert (tmp_path / "repo" / "calc" / "adapters" / "calc-v5" / "adapter_config.json").exists()
    engine = read_engine(repository, "calc")
    assert engine is not None and engine.versions == {1: None, 5: "calc-v5", 6: "calc-v6"}
    assert engine.origins[5]["version"] == 5
    assert repository.versions("calc") == [1]  # one Triton version: the engine

    with pytest.raises(MaterializeError, match="a base model and LoRA adapters"):
        materialize(registered(7, Lineage(kind="echo")), downloader, repository, options)
    # An adapter above the engine's max_lora_rank is refused before the engine changes
    # (vLLM would refuse it only at the first request that asked for it).
    wide = tmp_path / "wide"
    shutil.copytree(adapter, wide)
    (wide / "adapter_config.json").write_text(json.dumps({"r": 16, "rank_pattern": {"q": 128}}))
    with pytest.raises(MaterializeError, match="rank 128, above the vLLM engine's max_lora_rank"):
        materialize(registered(9, Lineage(kind="adapter", base_model=base)),
                    FolderDownloader(wide), repository, options)  # fmt: skip
    (wide / "adapter_config.json").unlink()
    with pytest.raises(MaterializeError, match=r"has no adapter_config\.json"):
        materialize(registered(9, Lineage(kind="adapter", base_model=base)),
                    FolderDownloader(wide), repository, options)  # fmt: skip
    assert read_engine(repository, "calc") == engine
    assert not (tmp_path / "repo" / "calc" / "adapters" / "calc-v9").exists()
    with pytest.raises(MaterializeError, match="one engine serves adapters of one base"):
        materialize(registered(8, Lineage(kind="adapter", base_model="org/other")), downloader,
                    repository, options)  # fmt: skip

    left = remove_from_engine(repository, "calc", 5, options)
    assert left is not None and left.versions == {1: None, 6: "calc-v6"}
    assert json.loads((engine_dir / "multi_lora.json").read_text()) == {
        "calc-v6": "/models/calc/adapters/calc-v6"
    }
    assert not (tmp_path / "repo" / "calc" / "adapters" / "calc-v5").exists()
    remove_from_engine(repository, "calc", 6, options)
    assert remove_from_engine(repository, "calc", 1, options) is None
    assert repository.versions("calc") == [] and read_engine(repository, "calc") is None


def test_an_adapter_whose_engine_cannot_be_written_leaves_no_files(
    tmp_path: Path, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adapters are removed by the engine's record: one it never listed must not stay."""
    repository = ModelRepository(str(tmp_path / "repo"))
    options = ServingOptions(flavour="vllm", triton_root="/models")
    lineage = Lineage(kind="adapter", base_model="smollm2-135m")
    materialize(registered(2, lineage), FolderDownloader(adapter), repository, options)

    def full(*args: object, **kwargs: object) -> None:
        raise RepositoryError("No space left on device")

    module = sys.modules[ModelRepository.__module__]  # the package names a function so
    monkeypatch.setattr(module, "write_vllm_engine", full)
    with pytest.raises(MaterializeError, match="No space left"):
        materialize(registered(3, lineage), FolderDownloader(adapter), repository, options)
    adapters = tmp_path / "repo" / "calc" / "adapters"
    assert sorted(p.name for p in adapters.iterdir()) == ["calc-v2"]
    engine = read_engine(repository, "calc")
    assert engine is not None and engine.versions == {2: "calc-v2"}


def test_the_vllm_engine_is_written_as_the_serving_settings_say(
    tmp_path: Path, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's arguments come from SPANMILL_SERVING_VLLM_* (the chart sets them from
    triton.vllm and the pod's GPUs); by default an engine takes at most half a GPU, so
    that Triton can load the reloaded engine beside it when an adapter joins."""
    from spanmill.config import ServingSettings, TritonSettings, load_settings

    assert ServingSettings().vllm_gpu_memory_utilization <= 0.5
    # A rank vLLM's engine does not take is refused where the settings are read.
    monkeypatch.setenv("SPANMILL_SERVING_VLLM_MAX_LORA_RANK", "100")
    with pytest.raises(ValueError, match="must be one of 8, 16, 32, 64, 128, 256, 320, 512"):
        ServingSettings()
    for name, value in {"GPU_MEMORY_UTILIZATION": "0.4", "MAX_MODEL_LEN": "8192",
                        "MAX_LORA_RANK": "128", "TENSOR_PARALLEL_SIZE": "2"}.items():  # fmt: skip
        monkeypatch.setenv(f"SPANMILL_SERVING_VLLM_{name}", value)
    monkeypatch.setenv("SPANMILL_SERVING_DTYPE", "float16")  # a GPU without bfloat16
    monkeypatch.setenv("SPANMILL_SERVING_FLAVOUR", "vllm")
    triton = TritonSettings(model_repository=str(tmp_path / "repo"), server_repository="/models")
    options = ServingOptions.from_settings(load_settings(ServingSettings), triton)
    repository = ModelRepository.from_settings(triton)
    materialize(registered(2, Lineage(kind="adapter", base_model="org/base")),
                FolderDownloader(adapter), repository, options)  # fmt: skip
    args = json.loads((tmp_path / "repo" / "calc" / "1" / "model.json").read_text())
    assert (args["gpu_memory_utilization"], args["max_model_len"]) == (0.4, 8192)
    assert (args["max_lora_rank"], args["tensor_parallel_size"]) == (128, 2)
    assert args["dtype"] == "float16"


class _Registry:
    """MLflow's versions of the agent, as the deployer reads them: echo versions."""

    def version(self, agent: str, version: int) -> RegisteredVersion:
        return registered(version, Lineage(kind="echo"), agent=agent)

    def download(self, agent: str, version: int, destination: Path) -> Path:
        raise AssertionError("an echo version has nothing to download")


class _Fleet:
    """One Triton server reading the repository: a load fails on a version not whole."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.loaded: dict[int, str] = {}

    def members(self) -> list[_Fleet]:
        return [self]

    def describe(self) -> str:
        return "Triton pod a"

    def versions(self, model: str) -> dict[int, str]:
        return dict(self.loaded)

    def reasons(self, model: str) -> dict[int, str]:
        return {}

    def load(self, model: str) -> None:
        from spanmill.rollout.materialize import WRITING
        from spanmill.rollout.triton import TritonError

        for version in self.repository.versions(model):
            found = self.repository._fs.find(self.repository._path(model, str(version)))
            names = {path.rsplit("/", 1)[-1] for path in found}
            if not {"model.py", "spanmill-serving.json", ORIGIN} <= names or WRITING in names:
                raise TritonError(f"version {version} of {model} is not whole: {sorted(names)}")
            self.loaded[version] = "READY"

    def smoke(self, model: str, version: int, **options: object) -> None:
        pass


def test_an_upload_cut_short_is_written_again_by_the_next_deploy(
    s3: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A controller killed (or deposed) mid-upload to an object store leaves half a
    # version: the next deploy must write it again, where it refused the folder for good
    # as one someone else put there. A folder someone else put there is still refused.
    from object_store import s3_bucket

    from spanmill.rollout.deployer import Deployer, DeployError

    repository = ModelRepository(s3_bucket(dict(s3)), dict(s3))
    fs = repository._fs
    put = fs.put

    def killed(lpath: object, rpath: object, *args: object, **kwargs: object) -> None:
        if isinstance(lpath, list) and isinstance(rpath, list):  # the version's files
            put(lpath[:1], rpath[:1], *args, **kwargs)
            raise KeyboardInterrupt  # not an Exception: nothing cleans up, as after a kill
        put(lpath, rpath, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(fs, "put", killed)
        with pytest.raises(KeyboardInterrupt):
            materialize(registered(1, Lineage(kind="echo")), _Registry(), repository,
                        ServingOptions())  # fmt: skip
    assert repository.has("calc", 1) and repository.unfinished("calc", 1)

    fleet = _Fleet(repository)
    Deployer(_Registry(), fleet, repository).deploy("calc", 1)  # type: ignore[arg-type]
    assert fleet.loaded == {1: "READY"}
    assert not repository.unfinished("calc", 1)
    assert repository.origin("calc", 1) == origin_of(_Registry().version("calc", 1))
    # A version folder someone else put there, without the mark: refused, as before.
    fs.pipe_file(repository._path("calc", "2", "model.py"), b"print('not ours')")
    assert repository.has("calc", 2) and not repository.unfinished("calc", 2)
    with pytest.raises(DeployError, match="was not written from MLflow version 2"):
        Deployer(_Registry(), fleet, repository).deploy("calc", 2)  # type: ignore[arg-type]
