"""Which failures of a deployment keep a version and which reject it, on stand-in servers:
a version counts as served only where it answers its smoke check."""

from __future__ import annotations

from typing import Any

import pytest

from spanmill.rollout.deployer import Deployer, DeployError, PodDeployError
from spanmill.rollout.triton import TritonError, TritonUnreachable

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

    def unload(self, model: str) -> None:
        self.loaded = False

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

    def __init__(self) -> None:
        self.removed: list[int] = []

    def remove(self, model: str, version: int) -> None:
        self.removed.append(version)

    def versions(self, model: str) -> list[int]:
        return []


ORIGIN = "models:/calculator/1"


@pytest.fixture(autouse=True)
def _origin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("spanmill.rollout.deployer.origin_of", lambda registered: ORIGIN)


def deploy(servers: list[Server], repository: Repository | None = None, *,
           leading: bool = True) -> float:  # fmt: skip
    deployer = Deployer(Registry(), Fleet(servers), repository or Repository())  # type: ignore[arg-type]
    deployer.fence = lambda: leading
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


def test_a_pod_lost_while_it_loads_a_new_version_is_the_pods_fault() -> None:
    # A version new to every pod; one pod dies mid-load (its connection is reset), the
    # other loads it and answers. Nothing is said against the version: it serves on the
    # other pod, and stays in the repository for the lost pod's return. Before, it was
    # removed and rejected for good, as a version that does not load.
    class Lost(Server):
        def load(self, model: str) -> None:
            self.loads += 1
            raise TritonUnreachable(
                f"cannot reach {self.describe()} (loading {model}): ConnectionResetError"
            )

        def reasons(self, model: str) -> dict[int, str]:
            raise TritonUnreachable(f"cannot reach {self.describe()}")

    servers = [Server("a", loaded=False, answers=True), Lost("b", loaded=False, answers=False)]
    repository = Repository()
    with pytest.raises(PodDeployError, match="loading calculator version 1 failed on Triton pod b"):
        deploy(servers, repository)
    assert servers[0].loaded and [s.loads for s in servers] == [1, 1]
    assert repository.removed == []


@pytest.mark.parametrize("leading", [True, False])
def test_a_failed_deployments_clean_up_is_the_leaders(leading: bool) -> None:
    # A new version loads everywhere and answers nowhere: the leader removes it again. A
    # controller whose Lease went elsewhere during the deployment (minutes for a real
    # model) leaves it: the new leader may be deploying that version meanwhile.
    servers = [Server("a", loaded=False, answers=False), Server("b", loaded=False, answers=False)]
    repository = Repository()
    with pytest.raises(DeployError, match="checking calculator version 1 failed on Triton pod a"):
        deploy(servers, repository, leading=leading)
    assert repository.removed == ([1] if leading else [])
