"""Writing registered versions into a model repository, per kind and flavour (no services)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spanmill.registry import Lineage, RegisteredVersion
from spanmill.rollout.materialize import (
    ORIGIN,
    MaterializeError,
    ModelRepository,
    ServingOptions,
    materialize,
)


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


def test_an_unchanged_config_is_not_rewritten(tmp_path: Path) -> None:
    repository = ModelRepository(str(tmp_path / "repo"))
    downloader = FolderDownloader(tmp_path)
    materialize(registered(1, Lineage(kind="echo")), downloader, repository, ServingOptions())
    config = tmp_path / "repo" / "calc" / "config.pbtxt"
    stamp = config.stat().st_mtime_ns
    materialize(registered(2, Lineage(kind="echo")), downloader, repository, ServingOptions())
    assert config.stat().st_mtime_ns == stamp


def test_vllm_flavour_serves_the_adapter_under_a_predictable_name(
    tmp_path: Path, adapter: Path
) -> None:
    repository = ModelRepository(str(tmp_path / "repo"))
    options = ServingOptions(flavour="vllm", triton_root="/models")
    lineage = Lineage(kind="adapter", base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
    materialize(registered(5, lineage), FolderDownloader(adapter), repository, options)
    version = tmp_path / "repo" / "calc" / "5"
    assert json.loads((version / "multi_lora.json").read_text()) == {
        "calc-v5": "/models/calc/5/adapter"
    }
    engine = json.loads((version / "model.json").read_text())
    assert engine["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and engine["enable_lora"]
    assert (version / "adapter" / "adapter_config.json").exists()
    with pytest.raises(MaterializeError, match="vllm flavour serves LoRA adapters"):
        materialize(registered(6, Lineage(kind="echo")), FolderDownloader(adapter), repository,
                    options)  # fmt: skip
    assert repository.versions("calc") == [5]
