"""The Kubernetes backend and the gateway's ConfigMap watch, against kmock's in-memory API
through the official ``kubernetes`` client; then a whole rollout on it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rollout_helpers import Traffic, controller, gateway_settings, new_agent, rollout_settings

from spanmill.gateway.app import create_app
from spanmill.gateway.configmap import ConfigMapRoutes, write_configmap_routes
from spanmill.gateway.routing import RoutingTable
from spanmill.registry import CHALLENGER, CHAMPION, Lineage
from spanmill.rollout.k8s_backend import STATE_ANNOTATION, KubernetesBackend, event_name
from spanmill.rollout.schemas import AgentState, ControllerState, Decision, Phase

NS = "flywheel"


def table(revision: int, weights: dict[str, float]) -> RoutingTable:
    return RoutingTable.model_validate({"revision": revision, "routes": {"calc": {
        "triton_model": "calc",
        "backends": [{"version": v, "weight": w} for v, w in weights.items()],
    }}})  # fmt: skip


def test_state_and_routes_live_in_one_configmap(kube) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    backend = KubernetesBackend(NS, "spanmill-routing", api_client=kube.api_client())
    assert backend.load() == (ControllerState(), RoutingTable())
    state = ControllerState(agents={"calc": AgentState(
        agent="calc", phase=Phase.CANARY, champion=1, challenger=2, step=1, step_started_at=5.0,
        baseline={"requests": {"2": {"200": 7.0}}})})  # fmt: skip
    backend.save(state, table(3, {"1": 75, "2": 25}))
    core = client.CoreV1Api(kube.api_client())
    stored = core.read_namespaced_config_map("spanmill-routing", NS)
    assert stored.metadata.labels["app.kubernetes.io/component"] == "routing"
    assert json.loads(stored.data["routes.json"])["revision"] == 3
    assert json.loads(stored.metadata.annotations[STATE_ANNOTATION])["agents"]["calc"]["step"] == 1
    assert backend.load() == (state, table(3, {"1": 75, "2": 25}))

    # A state-only save leaves the routes alone; a later save updates both.
    moved = ControllerState(agents={"calc": state.agents["calc"].model_copy(update={"step": 2})})
    backend.save(moved, None)
    assert backend.load() == (moved, table(3, {"1": 75, "2": 25}))
    backend.save(moved, table(4, {"1": 50, "2": 50}))
    assert backend.load()[1].revision == 4

    decision = Decision(agent="calc", action="advance", version=2, reason="healthy", weight=50.0)
    backend.event(decision)
    backend.event(decision)  # the same decision again counts on the same event
    rollback = Decision(agent="calc", action="rollback", version=2, reason="error rate 3/4")
    backend.event(rollback)
    events = {e.metadata.name: e for e in core.list_namespaced_event(NS).items}
    advanced = events[event_name("spanmill-routing", decision)]
    assert advanced.metadata.name == "spanmill-routing.calc.v2.advance.50"
    assert (advanced.reason, advanced.type, advanced.count) == ("StepAdvanced", "Normal", 2)
    assert advanced.involved_object.kind == "ConfigMap"
    failed = events["spanmill-routing.calc.v2.rollback"]
    assert failed.type == "Warning" and "error rate 3/4" in failed.message

    broken = {"metadata": {"annotations": {STATE_ANNOTATION: "{"}}}
    core.patch_namespaced_config_map("spanmill-routing", NS, broken)
    with pytest.raises(Exception, match="unreadable"):
        backend.load()


def test_the_initial_table_is_written_into_a_configmap_that_holds_none(kube) -> None:  # type: ignore[no-untyped-def]
    """Where the controller runs, the chart renders the routing ConfigMap without a table
    (a GitOps sync, rendering without the cluster, rendered the initial one over live
    traffic on every sync): the controller writes the initial table into it, once."""
    from kubernetes import client

    core = client.CoreV1Api(kube.api_client())
    core.create_namespaced_config_map(NS, {"metadata": {"name": "rendered"}})
    initial = table(1, {"1": 100})
    backend = KubernetesBackend(NS, "rendered", initial=initial, api_client=kube.api_client())
    assert backend.load() == (ControllerState(), initial)
    stored = core.read_namespaced_config_map("rendered", NS)
    assert RoutingTable.parse(stored.data["routes.json"], "stored") == initial
    # A table in place, the controller's own, is never replaced by the initial one.
    backend.save(ControllerState(), table(2, {"1": 50, "2": 50}))
    again = KubernetesBackend(NS, "rendered", initial=initial, api_client=kube.api_client())
    assert again.load()[1] == table(2, {"1": 50, "2": 50})
    # Absent altogether (outside the chart): created with it.
    fresh = KubernetesBackend(NS, "absent", initial=initial, api_client=kube.api_client())
    assert fresh.load()[1] == initial
    assert "routes.json" in core.read_namespaced_config_map("absent", NS).data
    # An empty initial table writes nothing.
    KubernetesBackend(NS, "untouched", api_client=kube.api_client()).load()
    assert "untouched" not in {c.metadata.name for c in core.list_namespaced_config_map(NS).items}


def test_the_gateway_watch_follows_the_configmap(kube) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    core = client.CoreV1Api(kube.api_client())
    routes = ConfigMapRoutes(NS, "routes", api_client=kube.api_client(), resync_s=30)
    try:
        assert routes.wait_synced(10) and routes.current() == RoutingTable()
        write_configmap_routes(core, NS, "routes", table(1, {"1": 100}))
        _eventually(lambda: routes.current().revision == 1)
        core.patch_namespaced_config_map(
            "routes", NS, {"data": {"routes.json": table(2, {"1": 80, "2": 20}).dumps()}}
        )
        _eventually(lambda: routes.current().revision == 2)
        # A broken edit keeps the last good table serving.
        core.patch_namespaced_config_map("routes", NS, {"data": {"routes.json": "{not json"}})
        time.sleep(0.5)
        assert routes.current() == table(2, {"1": 80, "2": 20})
        # Another ConfigMap in the namespace is none of its business.
        write_configmap_routes(core, NS, "other", table(9, {"3": 100}))
        time.sleep(0.5)
        assert routes.current().revision == 2
    finally:
        routes.close()


def _eventually(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.services
def test_a_rollout_on_kubernetes(  # type: ignore[no-untyped-def]
    kube, kafka, triton, mlflow_server, registry, serve_app, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from kubernetes import client

    # The gateway finds the API the way it does in a pod without a service account token:
    # through a kubeconfig.
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig", NS)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    app = create_app(gateway_settings(kafka, triton, routing_configmap=f"{NS}/spanmill-routing"))
    agent = new_agent()
    with serve_app(app) as url:
        settings = rollout_settings(mlflow_server, triton, tmp_path, agent, backend="kubernetes",
                                    namespace=NS, gateway_urls=[url])  # fmt: skip
        backend = KubernetesBackend(NS, "spanmill-routing", api_client=kube.api_client())
        ctl = controller(settings, backend=backend)
        v1 = registry.register(agent, Lineage(kind="echo")).version
        registry.promote(agent, v1)
        ctl.until(lambda: _served(url, agent) == str(v1), timeout=60)
        traffic = Traffic(url, agent).start()
        try:
            v2 = registry.register(agent, Lineage(kind="echo")).version
            registry.set_alias(agent, CHALLENGER, v2)
            ctl.until(lambda: registry.aliases(agent).get(CHAMPION) == v2, timeout=90)
            _eventually(lambda: bool(traffic.outcomes) and traffic.outcomes[-1].version == str(v2))
        finally:
            traffic.stop()
    assert not traffic.failures()
    assert {o.version for o in traffic.outcomes} == {str(v1), str(v2)}
    core = client.CoreV1Api(kube.api_client())
    stored = core.read_namespaced_config_map("spanmill-routing", NS)
    state = json.loads(stored.metadata.annotations[STATE_ANNOTATION])["agents"][agent]
    assert (state["phase"], state["champion"], state["challenger"]) == ("stable", v2, None)
    route = json.loads(stored.data["routes.json"])["routes"][agent]
    assert [(b["version"], b["weight"]) for b in route["backends"]] == [(str(v2), 100.0)]
    reasons = [e.reason for e in core.list_namespaced_event(NS).items
               if e.metadata.labels.get("spanmill.io/agent") == agent]  # fmt: skip
    for expected in ("Serving", "Deployed", "CanaryStarted", "StepAdvanced", "Promoted"):
        assert expected in reasons


def _served(url: str, agent: str) -> str | None:
    import httpx

    body = {"model": agent, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = httpx.post(f"{url}/v1/chat/completions", timeout=30, json=body)
    return response.headers.get("x-spanmill-model-version")


def test_a_controller_that_no_longer_leads_cannot_overwrite(kube) -> None:  # type: ignore[no-untyped-def]
    """Every write is conditional on the ConfigMap's version as this controller read it:
    after another controller wrote (it took the Lease), the old one's write is refused."""
    old = KubernetesBackend(NS, "fenced", api_client=kube.api_client())
    new = KubernetesBackend(NS, "fenced", api_client=kube.api_client())
    old.save(ControllerState(), table(1, {"1": 100}))
    old.load()
    new.load()
    state = ControllerState(agents={"calc": AgentState(agent="calc", champion=2)})
    new.save(state, table(2, {"2": 100}))
    with pytest.raises(Exception, match="changed since this controller read it"):
        old.save(ControllerState(), table(3, {"1": 100}))
    with pytest.raises(Exception, match="changed since this controller read it"):
        old.save(ControllerState(), None)
    assert new.load() == (state, table(2, {"2": 100}))
    # Read again, it may write (it leads once more).
    old.load()
    old.save(state, table(3, {"2": 100}))
    assert new.load()[1].revision == 3
