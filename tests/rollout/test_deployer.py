"""Which failures of a deployment keep a version and which reject it, on stand-in servers:
a version counts as served only where it answers its smoke check."""

from __future__ import annotations

from typing import Any

import pytest

from spanmill.rollout.deployer import Deployer, DeployError, PodDeployError
from spanmill.rollout.triton import TritonError

AGENT = "calculator"


class Server:
    """A Triton server that holds the agent's version ``loaded`` and answers, or not."""

    def __init__(self, name: str, *, loaded: bool, answers: bool) -> None:
        self.name = name
        self.loaded = loaded
        self.answers = answers
        self.loads = 0

    def describe(self) -> str:
        return f"Triton pod {self.name}"

    def versions(self, model: str) -> dict[int, str]:
        return {1: "READY"} if self.loaded else {}

    def load(self, model: str) -> None:
        self.loads += 1
        self.loaded = True

    def reasons(self, model: str) -> dict[int, str]:
        return {}

    def smoke(self, model: str, version: int, **options: Any) -> None:
        if not self.answers:
            raise TritonError(f"{self.describe()}: version {version} answered 500")


class Fleet:
    def __init__(self, servers: list[Server]) -> None:
        self.servers = servers

    def members(self) -> list[Server]:
        return self.servers


class Registry:
    def version(self, agent: str, version: int) -> Any:
        return object()


class Repository:
    """Holds the version's files, written from the registered version."""

    location = "the model repository"

    def has(self, model: str, version: int) -> bool:
        return True

    def origin(self, model: str, version: int) -> str:
        return ORIGIN

    def unfinished(self, model: str, version: int) -> bool:
        return False


ORIGIN = "models:/calculator/1"


@pytest.fixture(autouse=True)
def _origin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("spanmill.rollout.deployer.origin_of", lambda registered: ORIGIN)


def deploy(servers: list[Server]) -> float:
    deployer = Deployer(Registry(), Fleet(servers), Repository())  # type: ignore[arg-type]
    return deployer.deploy(AGENT, 1)


def test_a_version_loaded_everywhere_that_answers_nowhere_is_not_served() -> None:
    # Loaded by an earlier pass, then found not to answer:
    # no server serves it, which is the version's fault, not a pod's.
    servers = [Server("a", loaded=True, answers=False), Server("b", loaded=True, answers=False)]
    with pytest.raises(DeployError) as refused:
        deploy(servers)
    assert not isinstance(refused.value, PodDeployError)
    assert str(refused.value).startswith(
        f"checking {AGENT} version 1 failed on Triton pod a: it does not answer"
    )


def test_a_pod_that_fails_is_the_pods_fault_where_another_answers() -> None:
    servers = [Server("a", loaded=True, answers=True), Server("b", loaded=False, answers=False)]
    with pytest.raises(PodDeployError, match="failed on Triton pod b"):
        deploy(servers)
    assert servers[1].loads == 1  # it was loaded there, and checked


def test_every_server_is_checked_and_all_answering_is_a_deployment() -> None:
    servers = [Server(n, loaded=n == "a", answers=True) for n in ("a", "b", "c")]
    assert deploy(servers) >= 0
    assert [s.loads for s in servers] == [0, 1, 1]
