"""The controller's deployments in the vLLM flavour, and its faults, on stand-in servers
that behave as Triton's vLLM backend does: an engine answers for the adapters its
``multi_lora.json`` listed when it loaded, and Triton says READY of the engine it holds,
whatever the repository now lists. The registry, the state's store and the signals are
stand-ins too: what is checked is what the controller decides."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from spanmill.registry import Lineage, RegisteredVersion, names
from spanmill.rollout.deployer import Deployer, DeployError, EngineReloadError
from spanmill.rollout.materialize import ModelRepository, ServingOptions, add_to_engine, read_engine
from spanmill.rollout.triton import TritonError, TritonUnreachable

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
        self.reload_fails = False
        self.down = False
        self.refuses: set[str] = set()  # adapters its engine cannot run

    def describe(self) -> str:
        return f"Triton pod {self.name}"

    def versions(self, model: str) -> dict[int, str]:
        self._reachable()
        return {1: "READY"} if self.loras is not None else {}

    def _reachable(self) -> None:
        if self.down:  # restarting: connections refused
            raise TritonUnreachable(f"cannot reach {self.describe()}: ConnectionRefusedError")

    def reasons(self, model: str) -> dict[int, str]:
        return {}

    def load(self, model: str) -> None:
        self._reachable()
        self.loads += 1
        if self.reload_fails and self.loras is not None:
            # Triton keeps a model whose reload fails: the engine it had serves on.
            raise TritonError(f"{self.describe()}: failed to load '{model}': CUDA out of memory")
        listed = Path(self.repository.location) / model / "1" / "multi_lora.json"
        self.loras = set(json.loads(listed.read_text()))

    def unload(self, model: str) -> None:
        self.loras = None

    def smoke(self, model: str, version: int, *, lora: str | None = None, **options: Any) -> None:
        self._reachable()
        if self.loras is None or (lora is not None and lora not in self.loras):
            raise TritonError(f"{self.describe()}: LoRA {lora} is not supported")
        if lora in self.refuses:
            raise TritonError(f"{self.describe()}: LoRA {lora} targets modules vLLM lacks")


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


def test_an_engine_that_does_not_reload_says_nothing_against_the_version(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    """No server could reload the engine with the version, and each serves the engine it
    had: the version leaves the record and its files, nothing is reloaded to undo it, and
    the error is one to try again (the reconciler does, a few times)."""
    _, repository, servers, deployer = setting
    for server in servers:
        server.reload_fails = True
    with pytest.raises(EngineReloadError, match="CUDA out of memory"):
        deployer.deploy(AGENT, 2)
    assert [server.loads for server in servers] == [2, 2]  # the first deploy's and the try
    assert deployer.present(AGENT) == [1] and all(s.loras == set() for s in servers)
    assert not (Path(repository.location) / AGENT / "adapters" / "calc-v2").exists()

    # An engine that reloads and then does not answer for the version is the version's
    # fault: it is taken out and the engine reloaded without it.
    for server in servers:
        server.reload_fails = False
        server.refuses = {"calc-v3"}
    with pytest.raises(DeployError, match="does not answer") as refused:
        deployer.deploy(AGENT, 3)
    assert not isinstance(refused.value, EngineReloadError)
    assert deployer.present(AGENT) == [1] and all(s.loras == set() for s in servers)


class Aliases:
    """The registry as the controller reads it: version 1 the champion, 2 the challenger,
    and what the controller records of them."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.named = {"champion": 1, "challenger": 2}
        self.rolled_back: dict[int, str] = {}

    def agents(self) -> list[str]:
        return ["broken", AGENT]  # sorted first, as the controller takes them

    def desired(self, agent: str) -> Any:
        from spanmill.registry.client import Desired

        if agent == "broken":  # an error no step names, as a full disk's would be
            raise OSError(28, "No space left on device")
        return Desired(champion=self.named.get("champion"), challenger=self.named.get("challenger"))

    def aliases(self, agent: str) -> dict[str, int]:
        return dict(self.named)

    def delete_alias(self, agent: str, alias: str) -> None:
        self.named.pop(alias, None)

    def version(self, agent: str, version: int) -> Any:
        registered = self.registry.version(agent, version)
        if version in self.rolled_back:
            tags = {**registered.tags, "spanmill.rollout.status": "rolled_back"}
            registered = dataclasses.replace(registered, tags=tags)
        return registered

    def roll_back_by_hand(self, version: int) -> None:
        self.rolled_back[version] = "rolled back by hand"
        self.named.pop("challenger", None)

    def record(self, agent: str, version: int, message: str, **tags: Any) -> None:
        if tags.get("status") == "rolled_back":
            self.rolled_back[version] = tags["reason"]

    def promote(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing is promoted here")


class Memory:
    """The controller's state and routes, kept in memory."""

    def __init__(self) -> None:
        from spanmill.gateway.routing import RoutingTable
        from spanmill.rollout.schemas import ControllerState

        self.state, self.table = ControllerState(), RoutingTable()

    def describe(self) -> str:
        return "memory"

    def load(self) -> Any:
        return self.state.model_copy(deep=True), self.table

    def save(self, state: Any, table: Any) -> None:
        self.state = state.model_copy(deep=True)
        self.table = table or self.table

    def event(self, decision: Any) -> None:
        pass


class Quiet:
    def snapshot(self, route: str, versions: Any) -> dict[str, Any]:
        return {}

    def health(self, *args: Any, **kwargs: Any) -> Any:
        from spanmill.rollout.schemas import Health

        return Health()  # no traffic: the canary holds


def controller(aliases: Aliases, deployer: Deployer, clock: list[float]) -> Any:
    from spanmill.rollout.metrics import RolloutMetrics
    from spanmill.rollout.reconciler import Reconciler

    return Reconciler(aliases, deployer, Quiet(), Memory(),  # type: ignore[arg-type]
                      metrics=RolloutMetrics(), clock=lambda: clock[0],
                      retry_after_s=60)  # fmt: skip


def champion_served(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> tuple[Aliases, list[float], Any]:
    """A controller that served version 1 in its first pass (the agent before it failing
    its own, whatever happened); version 2 is then named the challenger, for its next."""
    registry, _, _, deployer = setting
    aliases, clock = Aliases(registry), [0.0]
    reconciler = controller(aliases, deployer, clock)
    del aliases.named["challenger"]
    decisions = reconciler.tick()
    assert any(d.agent == "broken" and "No space left" in d.reason for d in decisions)
    state = reconciler.state(AGENT)
    assert state is not None and state.champion == 1
    aliases.named["challenger"] = 2
    return aliases, clock, reconciler


@pytest.mark.parametrize("recovers", [False, True])
def test_the_controller_tries_a_challenger_whose_engine_did_not_reload_again(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer], recovers: bool
) -> None:
    """A few times, one retry interval apart, before it rolls the challenger back; one
    that deploys meanwhile goes on to its canary."""
    from spanmill.rollout import decide
    from spanmill.rollout.schemas import Phase

    registry, _, servers, deployer = setting
    aliases, clock = Aliases(registry), [0.0]
    reconciler = controller(aliases, deployer, clock)
    for server in servers:
        server.reload_fails = True
    reconciler.tick()
    state = reconciler.state(AGENT)
    assert state is not None and state.phase == Phase.DEPLOYING and state.champion == 1
    assert state.reload_failures == {2: 1} and not aliases.rolled_back
    loads = [server.loads for server in servers]
    clock[0] = 30.0  # before the retry is due: nothing is tried
    reconciler.tick()
    assert [server.loads for server in servers] == loads
    if recovers:
        for server in servers:
            server.reload_fails = False
    for tries in range(2, decide.ENGINE_RELOAD_TRIES + 1):
        clock[0] += 61.0
        reconciler.tick()
        state = reconciler.state(AGENT)
        assert state is not None
        if recovers:
            assert state.phase == Phase.CANARY and state.reload_failures == {}
            assert all(server.loras == {"calc-v2"} for server in servers)
            return
        assert [server.loads for server in servers] == [n + tries - 1 for n in loads]
    assert state.phase == Phase.STABLE and state.champion == 1
    assert f"({decide.ENGINE_RELOAD_TRIES} tries)" in aliases.rolled_back[2]
    # Retired without a reload: it never joined the engine.
    clock[0] += 1.0
    reconciler.tick()
    tried = [n + decide.ENGINE_RELOAD_TRIES - 1 for n in loads]
    assert [server.loads for server in servers] == tried
    assert "challenger" not in aliases.named


def test_triton_out_of_reach_says_nothing_against_a_challenger(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    """Triton restarting (connections refused) while a challenger is staged: it is tried
    again, not rolled back. (Triton lost mid-canary still rolls the canary back: its share
    of traffic would fail until the challenger is loaded again, counted against it;
    tests/rollout/test_rollout_triton_fault.py.) And an agent whose pass fails with an
    error no step names (a full disk) does not keep the agents after it from theirs."""
    from spanmill.rollout.schemas import Phase

    servers = setting[2]
    aliases, clock, reconciler = champion_served(setting)
    for server in servers:
        server.down = True
    clock[0] += 1.0
    reconciler.tick()
    state = reconciler.state(AGENT)
    assert state is not None and state.phase == Phase.DEPLOYING and not aliases.rolled_back
    for server in servers:
        server.down = False
    clock[0] += 61.0
    reconciler.tick()
    state = reconciler.state(AGENT)
    assert state is not None and state.phase == Phase.CANARY
    assert all(server.loras == {"calc-v2"} for server in servers)


def test_a_challenger_rolled_back_by_hand_while_it_deploys_gets_no_traffic(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    """A person rolls the challenger back while its deployment (minutes for a real model)
    runs: once it is done, the controller asks the registry again before the canary's
    first traffic, and the next pass stops it."""
    from spanmill.rollout.schemas import Phase

    servers = setting[2]
    aliases, clock, reconciler = champion_served(setting)
    loading = servers[0].load

    def load_while_a_person_rolls_back(model: str) -> None:
        aliases.roll_back_by_hand(2)
        loading(model)

    servers[0].load = load_while_a_person_rolls_back  # type: ignore[method-assign]
    clock[0] += 1.0
    decisions = reconciler.tick()
    assert not [d for d in decisions if d.action == "canary"]
    state = reconciler.state(AGENT)
    assert state is not None and state.phase == Phase.DEPLOYING
    route = reconciler.backend.table.routes[AGENT]
    assert [(b.version, b.weight) for b in route.backends] == [("1", 100.0)]
    clock[0] += 1.0
    reconciler.tick()
    state = reconciler.state(AGENT)
    assert state is not None and state.phase == Phase.STABLE and state.challenger is None
    assert aliases.rolled_back[2] == "rolled back by hand"


def test_a_controller_that_lost_its_lease_mid_deployment_records_nothing(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    """The Lease went to another replica while a deployment ran (minutes for a real
    model), and the deployment then failed: the rollback is the new leader's to decide,
    so this replica tags nothing in MLflow and writes no state."""
    from spanmill.rollout.schemas import Phase

    servers = setting[2]
    aliases, clock, reconciler = champion_served(setting)
    leading = [True]
    reconciler.active = lambda: leading[0]
    loading = servers[0].load

    def load_and_lose_the_lease(model: str) -> None:
        leading[0] = False
        loading(model)

    servers[0].load = load_and_lose_the_lease  # type: ignore[method-assign]
    for server in servers:
        server.refuses = {"calc-v2"}  # the deployment fails: a rollback, were it leading
    saved = reconciler.backend.state.model_copy(deep=True)
    clock[0] += 1.0
    reconciler.tick()
    assert not aliases.rolled_back and aliases.named["challenger"] == 2
    state = reconciler.backend.state.agents[AGENT]
    assert state.phase == Phase.DEPLOYING  # saved before the deployment began, left so
    assert saved.agents[AGENT].phase == Phase.STABLE


def test_a_controller_that_lost_its_lease_mid_pass_retires_nothing(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    """A version due to go (rolled back, its grace over) stays loaded where the Lease went
    to another replica during the pass: the leader may route to it. The leader retires it."""
    from spanmill.rollout.schemas import Phase

    _, repository, servers, deployer = setting
    aliases, clock, reconciler = champion_served(setting)
    clock[0] += 1.0
    reconciler.tick()
    state = reconciler.state(AGENT)
    assert state is not None and state.phase == Phase.CANARY
    aliases.roll_back_by_hand(2)
    clock[0] += 1.0
    reconciler.tick()
    state = reconciler.state(AGENT)
    assert state is not None and state.phase == Phase.STABLE and 2 in state.retiring
    leading = [True]
    reconciler.active = lambda: leading[0]
    checking = deployer.ready

    def check_and_lose_the_lease(agent: str, version: int) -> bool:
        if agent == AGENT:
            leading[0] = False
        return checking(agent, version)

    deployer.ready = check_and_lose_the_lease  # type: ignore[method-assign]
    clock[0] += state.retiring[2] + 1.0
    reconciler.tick()
    engine = read_engine(repository, names.triton_model(AGENT))
    assert engine is not None and 2 in engine.versions
    assert all("calc-v2" in server.loras for server in servers)
    leading[0] = True
    deployer.ready = checking  # type: ignore[method-assign]
    reconciler.tick()
    engine = read_engine(repository, names.triton_model(AGENT))
    assert engine is not None and 2 not in engine.versions


def first_deployment_held(
    deployer: Deployer,
) -> tuple[threading.Event, threading.Event, list[int]]:
    """The deployer's first deployment waits for the test's word, as a long load would:
    (the word, set once a deployment ends, the versions each deployment was of)."""
    deploy, let_go, ended, tries = deployer.deploy, threading.Event(), threading.Event(), []

    def slow(agent: str, version: int, **options: Any) -> float:
        tries.append(version)
        if len(tries) == 1:
            assert let_go.wait(timeout=60)
        try:
            return deploy(agent, version, **options)
        finally:
            ended.set()

    deployer.deploy = slow  # type: ignore[method-assign]
    return let_go, ended, tries


def test_a_deployment_a_deposed_leader_began_is_not_taken_up_when_it_leads_again(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    """Deployments run on the controller's deploy threads, past the pass that began them.
    One that a replica began before it lost its Lease says nothing once it leads again
    (the leader meanwhile may have retired the version): while it still runs the agent
    holds (never two deployments of one agent at once), and once it has ended the version
    is deployed afresh."""
    from spanmill.rollout.schemas import Phase

    _, _, _, deployer = setting
    _, clock, reconciler = champion_served(setting)
    reconciler.deploy_wait_s = 0.05
    let_go, ended, tries = first_deployment_held(deployer)
    clock[0] += 1.0
    (hold,) = [d for d in reconciler.tick() if d.agent == AGENT]
    assert hold.action == "hold" and "deploying version 2" in hold.reason
    state = reconciler.state(AGENT)
    assert state is not None and state.phase == Phase.DEPLOYING and tries == [2]
    # Another tick while it loads: the agent holds, nothing is deployed twice.
    (again,) = [d for d in reconciler.tick() if d.agent == AGENT]
    assert again.action == "hold" and tries == [2]
    leading = [False]
    reconciler.active = lambda: leading[0]
    reconciler.tick()  # deposed: the pass stops, its deployment's outcome is forgotten
    leading[0] = True  # leads again while that deployment still runs: the agent holds
    (orphaned,) = [d for d in reconciler.tick() if d.agent == AGENT]
    assert orphaned.action == "hold" and tries == [2]
    let_go.set()
    assert ended.wait(timeout=60)
    deadline = time.monotonic() + 60
    while not any(d.action == "canary" for d in reconciler.tick() if d.agent == AGENT):
        assert time.monotonic() < deadline, "the challenger never reached its canary"
        time.sleep(0.05)
    assert tries == [2, 2]  # deployed afresh, not taken from the deposed replica's try
    state = reconciler.state(AGENT)
    assert state is not None and state.phase == Phase.CANARY
    reconciler.close()


def challenger_loaded_past_its_pass(deployer: Deployer, reconciler: Any) -> list[int]:
    """The challenger's deployment outlasts the pass that began it (the agent holds), then
    ends before the next pass; the versions each deployment was of."""
    reconciler.deploy_wait_s = 0.05
    let_go, _, tries = first_deployment_held(deployer)
    assert [d.action for d in reconciler.tick() if d.agent == AGENT] == ["hold"]
    let_go.set()
    # Ended as the pool sees it (its future done), not only as the deployer does.
    concurrent.futures.wait([reconciler._deploying[AGENT].future], timeout=60)
    # What the next pass deploys anew, it waits for: the test asserts on that pass.
    reconciler.deploy_wait_s = None
    return tries


def test_a_deployment_that_ended_is_checked_again_before_its_version_gets_traffic(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    """A deployment is taken up by a pass after the one that began it: Triton may have
    lost the version between (a restart), and it is deployed again rather than given a
    canary it cannot answer."""
    _, _, servers, deployer = setting
    _, _, reconciler = champion_served(setting)
    tries = challenger_loaded_past_its_pass(deployer, reconciler)
    # Lost after the load: Triton's index says it is not ready, once.
    ready, lost = deployer.ready, [2]

    def gone_once(agent: str, version: int) -> bool:
        if version in lost:
            lost.remove(version)
            return False
        return ready(agent, version)

    deployer.ready = gone_once  # type: ignore[method-assign]
    taken = [d.action for d in reconciler.tick() if d.agent == AGENT]
    assert tries == [2, 2] and not lost and taken == ["deploy", "canary"]
    assert all(server.loras is not None and "calc-v2" in server.loras for server in servers)
    reconciler.close()


def test_a_deployment_that_times_out_by_itself_is_an_error_not_a_wait(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    """A deployment's own TimeoutError (a slow volume, a socket) is its outcome: said as
    an error, not taken for the pass's wait running out (which held the agent forever)."""
    _, _, _, deployer = setting
    _, clock, reconciler = champion_served(setting)
    reconciler.deploy_wait_s = 5.0

    def timed_out(agent: str, version: int, **options: Any) -> float:
        raise TimeoutError("reading the model repository timed out")

    deployer.deploy = timed_out  # type: ignore[method-assign]
    clock[0] += 1.0
    (decision,) = [d for d in reconciler.tick() if d.agent == AGENT]
    assert decision.action == "error" and "timed out" in decision.reason
    reconciler.close()


def test_a_deployment_that_ended_outlives_a_pass_cut_short(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    """MLflow out of reach for one pass, just as a long load ended: the next pass takes
    the load up, not loading the version all over again."""
    from spanmill.registry.client import RegistryError

    _, _, _, deployer = setting
    aliases, _, reconciler = champion_served(setting)
    tries = challenger_loaded_past_its_pass(deployer, reconciler)
    desired = aliases.desired

    def unreachable(agent: str) -> Any:
        raise RegistryError("MLflow cannot be reached")

    aliases.desired = unreachable  # type: ignore[method-assign]
    assert [d.action for d in reconciler.tick() if d.agent == AGENT] == ["error"]
    aliases.desired = desired  # type: ignore[method-assign]
    assert [d.action for d in reconciler.tick() if d.agent == AGENT] == ["deploy", "canary"]
    assert tries == [2]
    reconciler.close()


def test_a_deployment_that_ends_between_two_steps_of_a_pass_is_taken_up_not_thrown_away(
    setting: tuple[Registry, ModelRepository, list[Engine], Deployer],
) -> None:
    """The champion alias moved (its load outlasts the pass's wait) and a challenger is
    named too: the load ending before the challenger's step of the same pass is taken up
    by the next pass, not dropped for the challenger's deployment."""
    _, _, _, deployer = setting
    aliases, _, reconciler = champion_served(setting)
    aliases.named["champion"] = 3
    reconciler.deploy_wait_s = 0.05
    let_go, _, tries = first_deployment_held(deployer)
    held = reconciler._held

    def held_then_ended(agent: str, waiting: Any, st: Any) -> Any:
        let_go.set()  # the load ends before the pass's next step
        concurrent.futures.wait([waiting.deployment.future], timeout=60)
        return held(agent, waiting, st)

    reconciler._held = held_then_ended
    holds = [d for d in reconciler.tick() if d.agent == AGENT]
    assert tries == [3] and [d.action for d in holds] == ["hold"]
    reconciler._held = held
    reconciler.deploy_wait_s = None
    taken = [(d.action, d.version) for d in reconciler.tick() if d.agent == AGENT]
    assert ("serve", 3) in taken and tries.count(3) == 1
    reconciler.close()
