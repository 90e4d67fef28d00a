"""The vLLM flavour's deployments on stand-in servers that behave as Triton's vLLM backend
does: an engine answers for the adapters its ``multi_lora.json`` listed when it loaded,
and Triton says READY of the engine it holds, whatever the repository now lists."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from spanmill.registry import Lineage, RegisteredVersion
from spanmill.rollout.deployer import Deployer
from spanmill.rollout.materialize import ModelRepository, ServingOptions, add_to_engine
from spanmill.rollout.triton import TritonError

AGENT = "calc"
BASE = "smollm2-135m"


class Registry:
    """Version 1 is the base model, every later one an adapter on it."""

    def __init__(self, adapter: Path) -> None:
        self.adapter = adapter

    def version(self, agent: str, version: int) -> RegisteredVersion:
        kind = "base" if version == 1 else "adapter"
        return RegisteredVersion(agent=agent, version=version, source=f"models:/{version}",
                                 run_id=f"run-{version}",
                                 tags=Lineage(kind=kind, base_model=BASE).tags())  # fmt: skip

    def download(self, agent: str, version: int, destination: Path) -> Path:
        target = destination / "adapter"
        shutil.copytree(self.adapter, target)
        return target


class Engine:
    """A Triton server with the agent's vLLM engine."""

    def __init__(self, name: str, repository: ModelRepository) -> None:
        self.name = name
        self.repository = repository
        self.loras: set[str] | None = None  # None: no engine loaded
        self.loads = 0

    def describe(self) -> str:
        return f"Triton pod {self.name}"

    def versions(self, model: str) -> dict[int, str]:
        return {1: "READY"} if self.loras is not None else {}

    def reasons(self, model: str) -> dict[int, str]:
        return {}

    def load(self, model: str) -> None:
        self.loads += 1
        listed = Path(self.repository.location) / model / "1" / "multi_lora.json"
        self.loras = set(json.loads(listed.read_text()))

    def unload(self, model: str) -> None:
        self.loras = None

    def smoke(self, model: str, version: int, *, lora: str | None = None, **options: Any) -> None:
        if self.loras is None or (lora is not None and lora not in self.loras):
            raise TritonError(f"{self.describe()}: LoRA {lora} is not supported")


class Fleet:
    def __init__(self, servers: list[Engine]) -> None:
        self.servers = servers

    def members(self) -> list[Engine]:
        return self.servers


@pytest.fixture
def setting(tmp_path: Path) -> tuple[Registry, ModelRepository, list[Engine], Deployer]:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    repository = ModelRepository(str(tmp_path / "repository"))
    options = ServingOptions(flavour="vllm")
    registry = Registry(adapter)
    servers = [Engine("a", repository), Engine("b", repository)]
    deployer = Deployer(registry, Fleet(servers), repository, options)  # type: ignore[arg-type]
    deployer.deploy(AGENT, 1)
    return registry, repository, servers, deployer


@pytest.mark.parametrize("reloaded_before_the_stop", [0, 1])
def test_a_deployment_stopped_between_writing_and_reloading_the_engine_is_finished(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
    reloaded_before_the_stop: int,
) -> None:
    """The controller stopped (a rollout of its own Deployment, say) after the version
    joined the engine's record and before every server reloaded it: the next pass finds
    the version listed and the old engines READY. The servers whose engine does not
    answer for it reload, and the version is served, not rejected."""
    registry, repository, servers, deployer = setting
    add_to_engine(registry.version(AGENT, 2), registry, repository, ServingOptions(flavour="vllm"))
    for server in servers[:reloaded_before_the_stop]:
        server.load(AGENT)
    loads = [server.loads for server in servers]
    deployer.deploy(AGENT, 2)
    assert all(server.loras == {"calc-v2"} for server in servers)
    # Only the servers whose engine was older than the record reloaded.
    reloads = [server.loads - before for server, before in zip(servers, loads, strict=True)]
    assert reloads == [0] * reloaded_before_the_stop + [1] * (2 - reloaded_before_the_stop)
    assert deployer.ready(AGENT, 2)


def test_a_listed_version_that_every_engine_answers_reloads_nothing(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    _, _, servers, deployer = setting
    deployer.deploy(AGENT, 2)
    loads = [server.loads for server in servers]
    deployer.deploy(AGENT, 2)  # the champion checked again (it is listed and answers)
    assert [server.loads for server in servers] == loads
