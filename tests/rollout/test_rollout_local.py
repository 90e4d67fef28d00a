"""The rollout controller on one machine, against real MLflow, tritonserver and the gateway.

Versions are echo models where the model does not matter (fast), small real
models where the fault must be real, and SmolLM2 with a LoRA adapter once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest
from rollout_helpers import (
    HeldClock,
    Traffic,
    controller,
    new_agent,
    rollout_settings,
    version_counts,
)

from spanmill.gateway.routing import RoutingFile, RoutingTable
from spanmill.registry import CHALLENGER, CHAMPION, Lineage, ModelRegistry, names
from spanmill.rollout.schemas import Phase
from spanmill.rollout.triton import TritonControl

pytestmark = pytest.mark.services


def weights(routes: Path, agent: str) -> dict[str, float]:
    table = RoutingFile(routes).current()
    route = table.routes.get(agent)
    return {b.version: b.weight for b in route.backends} if route else {}


def serve_champion(registry: ModelRegistry, agent: str, ctl, routes: Path) -> int:  # type: ignore[no-untyped-def]
    version = registry.register(agent, Lineage(kind="echo")).version
    registry.promote(agent, version)
    ctl.until(lambda: weights(routes, agent) == {str(version): 100.0}, timeout=60)
    return version


def test_challenger_gets_a_growing_share_then_is_promoted(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, tmp_path: Path
) -> None:
    url, routes = gateway
    agent = new_agent()
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url])  # fmt: skip
    ctl = controller(settings)
    v1 = serve_champion(registry, agent, ctl, routes)
    traffic = Traffic(url, agent).start()
    try:
        v2 = registry.register(agent, Lineage(kind="echo")).version
        registry.set_alias(agent, CHALLENGER, v2)
        seen: list[float] = []
        # The gateway's counts as each share was first seen, and at the promotion: what
        # the challenger had served by the end of each step.
        counts_by_end: list[dict[tuple[str, str], float]] = []

        def watch() -> None:
            share = weights(routes, agent).get(str(v2), 0.0)
            if not seen or seen[-1] != share:
                if seen:
                    counts_by_end.append(version_counts(url, agent))
                seen.append(share)

        ctl.until(lambda: registry.aliases(agent).get(CHAMPION) == v2, each=watch, timeout=90)
        counts_by_end.append(version_counts(url, agent))
        after_promotion = ctl.reconciler.state(agent)
        time.sleep(0.5)
    finally:
        outcomes = traffic.stop()

    # The routing table stepped the challenger up, and the gateway's counts followed: each
    # step ended only once the challenger had answered more calls in it.
    assert seen == [20.0, 50.0, 100.0]
    served = [counts.get((str(v2), "200"), 0) for counts in counts_by_end]
    assert 0 < served[0] < served[1] < served[2]
    late = [o for o in outcomes if o.at > outcomes[-1].at - 0.4]
    assert late and all(o.version == str(v2) for o in late)
    assert not traffic.failures()
    # The persisted state says what was done last, and why.
    assert after_promotion is not None and after_promotion.last_action == "promote"
    promote = [d for d in ctl.decisions if d.action == "promote"][-1]
    assert after_promotion.last_reason == promote.reason != ""
    assert [a for a, v in ctl.actions() if v == v2] == [
        "deploy",
        "canary",
        "advance",
        "advance",
        "promote",
    ]

    # The aliases moved; the version carries its history.
    assert registry.aliases(agent) == {CHAMPION: v2}
    promoted = registry.version(agent, v2)
    assert promoted.rollout_status == "promoted"
    assert [e.split(": ", 1)[0].split(" ", 1)[1] for e in promoted.events()] == [
        f"{agent} v{v2}"] * 5  # fmt: skip
    assert any("promote" in e for e in promoted.events())

    # The old champion stays loaded for the grace period, then goes.
    control = TritonControl(triton.http_url)
    assert control.versions(agent).get(v1) == "READY"
    ctl.until(lambda: control.versions(agent).get(v1) != "READY", timeout=30)
    assert not (triton.model_repository / agent / str(v1)).exists()
    assert registry.version(agent, v1).rollout_status == "retired"
    assert ("retire", v1) in ctl.actions()
    # Every decision was also written to the local event log.
    logged = [
        json.loads(line)
        for line in Path(f"{settings.state_file}.events.jsonl").read_text().splitlines()
    ]
    assert [d["action"] for d in logged if d["version"] == v2][-1] == "promote"


def test_a_challenger_that_answers_with_errors_is_rolled_back(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, no_system_model: Path, tmp_path: Path
) -> None:
    url, routes = gateway
    agent = new_agent()
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url], steps=[20, 100], bake_s=5)  # fmt: skip
    ctl = controller(settings)
    v1 = serve_champion(registry, agent, ctl, routes)
    traffic = Traffic(url, agent).start()
    try:
        bad = registry.register(agent, Lineage(kind="model"), no_system_model).version
        registry.set_alias(agent, CHALLENGER, bad)
        ctl.until(lambda: ("rollback", bad) in ctl.actions(), timeout=120)
        routed_back_at = time.time()
        control = TritonControl(triton.http_url)
        ctl.until(lambda: control.versions(agent).get(bad) != "READY", timeout=30)
        time.sleep(0.5)
    finally:
        outcomes = traffic.stop()

    # It passed its smoke check (no system prompt there) and reached traffic ...
    assert ("deploy", bad) in ctl.actions() and ("canary", bad) in ctl.actions()
    rollback = next(d for d in ctl.decisions if d.action == "rollback")
    assert "error rate" in rollback.reason
    # ... where only its share failed: the champion answered every request it got.
    counts = version_counts(url, agent)
    assert {s for (v, s) in counts if v == str(v1)} == {"200"}
    failures = [o for o in outcomes if o.status != 200]
    assert failures and len(failures) <= counts.get((str(bad), "502"), 0)
    assert len(failures) <= 0.2 * len(outcomes) + 5
    assert all(o.status == 200 for o in outcomes if o.at > routed_back_at + 0.2)

    stopped = registry.version(agent, bad)
    assert stopped.rolled_back and "error rate" in stopped.tags[names.TAG_ROLLOUT_REASON]
    assert registry.aliases(agent) == {CHAMPION: v1}
    assert weights(routes, agent) == {str(v1): 100.0}
    assert not (triton.model_repository / agent / str(bad)).exists()
    # A rolled-back version is not tried again.
    ctl.tick()
    assert ctl.reconciler.state(agent).phase == Phase.STABLE  # type: ignore[union-attr]


def test_a_failing_canary_rolls_back_while_mlflow_refuses_writes(  # type: ignore[no-untyped-def]
    mlflow_server,
    triton,
    gateway,
    registry,
    no_system_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MLflow answered reads and refused writes (a full or read-only database, a user that
    may only read): the rollback tagged MLflow first, the tag failed, and the failing
    canary kept its share pass after pass. Now the traffic goes back, MLflow later."""
    from spanmill.registry.client import RegistryError

    url, routes = gateway
    agent = new_agent()
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url], steps=[50, 100], bake_s=3600)  # fmt: skip
    ctl = controller(settings)
    v1 = serve_champion(registry, agent, ctl, routes)
    traffic = Traffic(url, agent).start()
    real = ctl.reconciler.registry.record

    def refused(*args: object, **kwargs: object) -> None:
        raise RegistryError("MLflow answered 503: the database is read-only")

    try:
        bad = registry.register(agent, Lineage(kind="model"), no_system_model).version
        registry.set_alias(agent, CHALLENGER, bad)
        ctl.until(lambda: weights(routes, agent).get(str(bad)) == 50.0, timeout=120)
        monkeypatch.setattr(ctl.reconciler.registry, "record", refused)
        ctl.until(lambda: weights(routes, agent) == {str(v1): 100.0}, timeout=60)
        refusing = ctl.reconciler.state(agent)
        monkeypatch.setattr(ctl.reconciler.registry, "record", real)
        ctl.until(lambda: CHALLENGER not in registry.aliases(agent), timeout=60)
    finally:
        traffic.stop()
    rollback = next(d for d in ctl.decisions if d.action == "rollback")
    assert "error rate" in rollback.reason and "MLflow refused the record" in rollback.reason
    assert refusing is not None and list(refusing.unrecorded_rollbacks) == [bad]
    assert registry.version(agent, bad).rolled_back  # told once it took writes again


def test_one_agents_slow_deployment_does_not_hold_another_agents_rollback(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, no_system_model: Path, tmp_path: Path
) -> None:
    """A large model's load takes minutes. The controller deployed inside its pass, one
    agent after another, so while one agent's challenger loaded, a failing canary of
    another kept its traffic. Now the load runs on a deploy thread: the slow agent holds,
    the other's canary is judged and rolled back meanwhile, and the slow one's canary
    begins in a pass after its load has ended."""
    url, routes = gateway
    slow, fast = new_agent(), new_agent()
    settings = rollout_settings(mlflow_server, triton, tmp_path, slow, routing_file=routes,
                                gateway_urls=[url], agents=[slow, fast], steps=[20, 100],
                                bake_s=5, deploy_wait_s=0.2)  # fmt: skip
    ctl = controller(settings)

    def taken(agent: str, version: int) -> list[str]:
        return [d.action for d in ctl.decisions if (d.agent, d.version) == (agent, version)]

    firsts = {}
    for agent in (slow, fast):
        firsts[agent] = registry.register(agent, Lineage(kind="echo")).version
        registry.promote(agent, firsts[agent])
    ctl.until(lambda: all(weights(routes, a) == {str(firsts[a]): 100.0} for a in firsts),
              timeout=120)  # fmt: skip
    # The slow agent's challenger loads only once the test lets it: a load that long.
    loading, let_go = threading.Event(), threading.Event()
    deploy = ctl.reconciler.deployer.deploy

    def held(agent: str, version: int, **options: object) -> float:
        if agent == slow:
            loading.set()
            assert let_go.wait(timeout=300), "the test never let the load end"
        return deploy(agent, version, **options)  # type: ignore[arg-type]

    ctl.reconciler.deployer.deploy = held  # type: ignore[method-assign]
    traffic = Traffic(url, fast).start()
    try:
        bad = registry.register(fast, Lineage(kind="model"), no_system_model).version
        registry.set_alias(fast, CHALLENGER, bad)
        ctl.until(lambda: "canary" in taken(fast, bad), timeout=120)
        waiting = registry.register(slow, Lineage(kind="echo")).version
        registry.set_alias(slow, CHALLENGER, waiting)
        ctl.until(loading.is_set, timeout=60)
        # The slow agent's pass comes first in every tick, and it is still loading.
        ctl.until(lambda: "rollback" in taken(fast, bad), timeout=120)
        held_state = ctl.reconciler.state(slow)
        holds = [d for d in ctl.tick() if d.agent == slow]
    finally:
        let_go.set()
        traffic.stop()
    assert weights(routes, fast) == {str(firsts[fast]): 100.0}
    assert held_state is not None and held_state.phase == Phase.DEPLOYING
    assert [d.action for d in holds] == ["hold"]
    assert f"deploying version {waiting}" in holds[0].reason
    assert taken(slow, waiting) == []
    # Its load ended: a later pass takes it up and begins the canary.
    ctl.until(lambda: "canary" in taken(slow, waiting), timeout=120)
    assert taken(slow, waiting) == ["deploy", "canary"]
    assert not [d for d in ctl.decisions if d.action == "error"]
    ctl.reconciler.close()


def test_a_challenger_promoted_by_hand_mid_deployment_takes_traffic_once_served(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The champion alias moved onto a challenger still being deployed (Triton out of
    reach, its retry pending): the next pass routed it every request while no pod held
    it, and retired the champion after the grace. Now it is deployed first."""
    from spanmill.rollout.deployer import ServingUnreachable

    url, routes = gateway
    agent = new_agent()
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url], retry_after_s=0.5)  # fmt: skip
    ctl = controller(settings)
    v1 = serve_champion(registry, agent, ctl, routes)
    deploy, unreachable = ctl.reconciler.deployer.deploy, {"on": True}

    def flaky(name: str, version: int, **kwargs: object) -> float:
        if unreachable["on"] and version != v1:
            raise ServingUnreachable("no Triton pod answered")
        return deploy(name, version, **kwargs)

    monkeypatch.setattr(ctl.reconciler.deployer, "deploy", flaky)
    v2 = registry.register(agent, Lineage(kind="echo")).version
    registry.set_alias(agent, CHALLENGER, v2)
    ctl.tick()
    assert ctl.reconciler.state(agent).phase == Phase.DEPLOYING  # type: ignore[union-attr]
    registry.promote(agent, v2)
    for _ in range(3):  # its retries come and fail: the champion keeps every request
        time.sleep(0.6)
        ctl.tick()
        assert weights(routes, agent) == {str(v1): 100.0}
    assert ("promote", v2) not in ctl.actions()
    unreachable["on"] = False
    ctl.until(lambda: weights(routes, agent) == {str(v2): 100.0}, timeout=60)
    assert TritonControl(triton.http_url).versions(agent).get(v2) == "READY"


def test_a_canary_waiting_on_traffic_says_so_in_the_log_now_and_then(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, tmp_path: Path, caplog, monkeypatch
) -> None:
    from spanmill.rollout import reconciler as reconciler_module

    url, routes = gateway
    agent = new_agent()
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url], bake_s=0)  # fmt: skip
    ctl = controller(settings)
    serve_champion(registry, agent, ctl, routes)
    v2 = registry.register(agent, Lineage(kind="echo")).version
    registry.set_alias(agent, CHALLENGER, v2)
    ctl.until(lambda: ("canary", v2) in ctl.actions(), timeout=60)

    def holds() -> list[str]:
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        return [m for m in said if f"{agent} v{v2}: hold" in m]

    # No traffic: the canary holds; the first hold is logged, with what it waits for ...
    with caplog.at_level(logging.INFO, logger="spanmill.rollout.reconciler"):
        for _ in range(3):
            ctl.tick()
        assert len(holds()) == 1 and "waiting for 0/5 requests" in holds()[0]
        # ... and again once the interval has passed, not on every tick.
        monkeypatch.setattr(reconciler_module, "HOLD_LOG_EVERY_S", 0.0)
        ctl.tick()
        assert len(holds()) == 2


def test_a_challenger_that_fails_to_load_never_gets_traffic(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, unloadable_model: Path, tmp_path: Path
) -> None:
    url, routes = gateway
    agent = new_agent()
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url])  # fmt: skip
    ctl = controller(settings)
    v1 = serve_champion(registry, agent, ctl, routes)
    traffic = Traffic(url, agent).start()
    tables: set[str] = set()
    try:
        broken = registry.register(agent, Lineage(kind="model"), unloadable_model).version
        registry.set_alias(agent, CHALLENGER, broken)
        ctl.until(lambda: ("rollback", broken) in ctl.actions(), timeout=120,
                  each=lambda: tables.add(json.dumps(weights(routes, agent))))  # fmt: skip
        time.sleep(0.3)
    finally:
        outcomes = traffic.stop()
    assert tables == {json.dumps({str(v1): 100.0})}
    assert outcomes and not traffic.failures()
    rollback = next(d for d in ctl.decisions if d.action == "rollback")
    assert rollback.reason.startswith(f"loading {agent} version {broken} failed")
    assert registry.version(agent, broken).rolled_back
    assert not (triton.model_repository / agent / str(broken)).exists()
    # Triton keeps serving the champion, and later loads of the model still work.
    assert TritonControl(triton.http_url).versions(agent).get(v1) == "READY"


def test_a_challenger_waits_while_the_registrys_champion_cannot_be_served(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, unloadable_model: Path, tmp_path: Path
) -> None:
    """A controller with no state of its own (new, or its state lost) finds a champion in
    the registry that it cannot load: a challenger is not thereby a first version, to be
    promoted with all traffic and no canary."""
    url, routes = gateway
    agent = new_agent()
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url])  # fmt: skip
    ctl = controller(settings)
    v1 = registry.register(agent, Lineage(kind="model"), unloadable_model).version
    registry.promote(agent, v1)
    v2 = registry.register(agent, Lineage(kind="echo")).version
    registry.set_alias(agent, CHALLENGER, v2)
    made = [(d.action, d.version) for d in ctl.tick() + ctl.tick()]
    assert ("error", v1) in made and ("hold", v2) in made
    assert not [m for m in made if m[0] in ("deploy", "promote", "serve", "canary")], made
    assert registry.aliases(agent) == {CHAMPION: v1, CHALLENGER: v2}
    assert weights(routes, agent) == {}


def test_restarting_the_controller_resumes_the_rollout(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, tmp_path: Path
) -> None:
    url, routes = gateway
    agent = new_agent()
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url], bake_s=3.0)  # fmt: skip
    clock = HeldClock()
    first = controller(settings, clock=clock)
    v1 = serve_champion(registry, agent, first, routes)
    traffic = Traffic(url, agent).start()
    try:
        v2 = registry.register(agent, Lineage(kind="echo")).version
        registry.set_alias(agent, CHALLENGER, v2)
        first.until(lambda: weights(routes, agent).get(str(v2)) == 50.0, timeout=60)
        before = first.reconciler.state(agent)
        assert before is not None and before.step == 1
        table_before = RoutingFile(routes).current()
        # The controller process ends two seconds into the three-second bake; the clock
        # stands still while the test rewrites the routes and starts the next one.
        assert before.step_started_at is not None
        restarted_at = clock.hold(before.step_started_at + 2.0)
        del first

        # The routes write of the last step was lost (say, the crash came between
        # saving the state and writing the routes): the next controller repairs it.
        stale = table_before.model_copy(deep=True)
        stale.routes[agent].backends[0].weight, stale.routes[agent].backends[1].weight = 80, 20
        RoutingFile(routes).write(RoutingTable(revision=table_before.revision, routes=stale.routes))

        second = controller(settings, clock=clock)
        made = second.tick()
        after = second.reconciler.state(agent)
        assert after is not None
        assert (after.phase, after.step, after.step_started_at) == (
            Phase.CANARY, 1, before.step_started_at)  # fmt: skip
        assert after.baseline == before.baseline
        assert not [d for d in made if d.action in ("deploy", "canary")]
        assert weights(routes, agent) == {str(v1): 50.0, str(v2): 50.0}
        assert RoutingFile(routes).current().revision == table_before.revision + 1

        clock.release()
        second.until(lambda: weights(routes, agent).get(str(v2)) == 100.0, timeout=60)
        advanced = next(d for d in second.decisions if d.action == "advance")
        # The bake clock kept running across the restart.
        assert advanced.at - before.step_started_at >= 3.0
        assert advanced.at < restarted_at + 3.0
        second.until(lambda: registry.aliases(agent).get(CHAMPION) == v2, timeout=60)
    finally:
        traffic.stop()
    assert not traffic.failures()


def test_a_triton_version_not_made_from_mlflow_is_never_taken_for_one(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, tmp_path: Path
) -> None:
    from spanmill.serving.repository import write_echo_version

    url, routes = gateway
    agent = new_agent()
    # Version 1 written by hand, as a quick demo might, before anything was registered.
    write_echo_version(triton.model_repository, agent, 1)
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url])  # fmt: skip
    ctl = controller(settings)
    v1 = registry.register(agent, Lineage(kind="echo")).version
    registry.promote(agent, v1)
    ctl.tick()
    error = next(d for d in ctl.decisions if d.action == "error")
    assert "was not written from MLflow version 1" in error.reason
    assert "remove that folder" in error.reason
    assert agent not in RoutingFile(routes).current().routes
