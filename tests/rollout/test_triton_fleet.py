"""Several Triton replicas: the controller finds every pod through the EndpointSlices of a
headless Service (kmock's API) and loads each version on all of them, real tritonserver
processes standing in for the pods.

Pods on a cluster share one port; these share one machine, so each is its own
EndpointSlice with its own port, which is how the controller reads any slice (every
address with its slice's port). The processes share one model repository, as the pods
share their volume.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from rollout_helpers import controller, new_agent, rollout_settings
from triton_state import loaded_model

from spanmill.gateway.routing import RoutingFile
from spanmill.registry import CHALLENGER, Lineage, names
from spanmill.rollout.fleet import SERVICE_NAME_LABEL, EndpointSliceFleet
from spanmill.rollout.schemas import AgentState, Phase
from spanmill.rollout.triton import TritonControl
from spanmill.serving.readiness import ReadinessError, check, server
from spanmill.stack.ports import free_port
from spanmill.stack.services import RunningService, TritonServer

pytestmark = pytest.mark.services

NS = "flywheel"
SERVICE = "spanmill-triton-pods"


def start_pod(services_dir: Path, name: str, repository: Path) -> RunningService:
    server = TritonServer("127.0.0.1", services_dir / name, repository, http_port=free_port(),
                          grpc_port=free_port(), metrics_port=free_port())  # fmt: skip
    return server.start()


@pytest.fixture(scope="module")
def pods(triton, services_dir: Path) -> Iterator[dict[str, str]]:  # type: ignore[no-untyped-def]
    """Pod name -> HTTP address: the session's Triton and three more on its repository."""
    started: list[RunningService] = []
    try:
        for name in ("triton-b", "triton-c", "triton-d"):
            started.append(start_pod(services_dir, name, triton.model_repository))
        yield {"triton-a": triton.http_url} | {
            name: running.url for name, running in zip(("triton-b", "triton-c", "triton-d"),
                                                       started, strict=True)
        }  # fmt: skip
    finally:
        # Together: each Triton takes its time to unload its models.
        with ThreadPoolExecutor() as pool:
            list(pool.map(RunningService.stop, started))


def register(kube: Any, pod: str, url: str, *, ready: bool) -> None:
    """The pod as the EndpointSlice controller lists it behind a headless Service that
    publishes unready pods: ``ready`` always true, ``serving`` the pod's readiness."""
    from kubernetes import client

    host, port = url.rsplit(":", 1)
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{SERVICE}-{pod}", "labels": {SERVICE_NAME_LABEL: SERVICE}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": int(port), "protocol": "TCP"}],
        "endpoints": [{
            "addresses": [host],
            "conditions": {"ready": True, "serving": ready, "terminating": False},
            "targetRef": {"kind": "Pod", "name": pod, "namespace": NS},
        }],
    }  # fmt: skip
    api = client.DiscoveryV1Api(kube.api_client())
    with contextlib.suppress(Exception):
        api.delete_namespaced_endpoint_slice(f"{SERVICE}-{pod}", NS)
    api.create_namespaced_endpoint_slice(NS, slice_)


def loaded(url: str, agent: str) -> dict[int, str]:
    control = TritonControl(url)
    try:
        return control.versions(names.triton_model(agent))
    finally:
        control.close()


async def _through_round_robin(backends: list[str], call: Any) -> tuple[Any, list[str]]:
    """Run ``call(url)`` against a proxy that sends each new connection to the next backend,
    as a Service's virtual IP spreads connections over its pods; returns what each
    connection reached."""
    reached: list[str] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend = backends[len(reached) % len(backends)]
        reached.append(backend)
        host, port = backend.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await call(f"127.0.0.1:{port}")
    finally:
        server.close()
    return result, reached


def test_every_pod_holds_each_version_and_a_new_pod_gets_them_before_it_is_ready(  # type: ignore[no-untyped-def]
    kube, triton, pods, mlflow_server, registry, tmp_path: Path
) -> None:
    routes = tmp_path / "routes.json"  # what each Triton pod's readiness probe reads
    agent = new_agent()
    model = names.triton_model(agent)
    first = ("triton-a", "triton-b", "triton-c")
    for pod in first:
        register(kube, pod, pods[pod], ready=True)
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                signals="spans", store_url=str(tmp_path / "spans"),
                                steps=[20, 100], bake_s=600,
                                namespace=NS)  # fmt: skip
    fleet = EndpointSliceFleet(NS, SERVICE, api_client=kube.api_client())
    ctl = controller(settings, fleet=fleet)

    v1 = registry.register(agent, Lineage(kind="echo")).version
    registry.promote(agent, v1)
    ctl.until(lambda: model in RoutingFile(routes).current().routes, timeout=60)
    for pod in first:
        assert loaded(pods[pod], agent) == {v1: "READY"}, pod
        check(pods[pod], RoutingFile(routes).current())
    # Nothing reached the pod the Service does not list yet.
    assert loaded(pods["triton-d"], agent) == {}

    v2 = registry.register(agent, Lineage(kind="echo")).version
    registry.set_alias(agent, CHALLENGER, v2)
    ctl.until(lambda: ctl.reconciler.state(agent).phase == Phase.CANARY, timeout=60)  # type: ignore[union-attr]
    canary = RoutingFile(routes).current()
    assert {b.version for b in canary.routes[model].backends} == {str(v1), str(v2)}
    for pod in first:
        assert loaded(pods[pod], agent) == {v1: "READY", v2: "READY"}, pod
        check(pods[pod], canary)

    # A fourth pod starts: listed, not ready, and its readiness says what it lacks, as the
    # container beside it answers the pod's probe (spanmill triton ready --serve).
    register(kube, "triton-d", pods["triton-d"], ready=False)
    with pytest.raises(ReadinessError, match=f"{model} version {v1}: the model is not loaded"):
        check(pods["triton-d"], canary)
    probe = server(pods["triton-d"], routes, free_port(), host="127.0.0.1")
    threading.Thread(target=probe.serve_forever, daemon=True).start()
    ready_url = f"http://127.0.0.1:{probe.server_address[1]}/ready"
    answer = httpx.get(ready_url, timeout=30)
    assert answer.status_code == 503, answer.text
    assert f"{model} version {v1}: the model is not loaded" in answer.text

    # Meanwhile a call the Service sends there is tried once more on a fresh connection,
    # which reaches a pod that holds the version.
    from spanmill.gateway.upstream import Target, TritonUpstream
    from spanmill.serving.protocol import GenerationParams

    retries: list[int] = []

    async def call(url: str) -> Any:
        upstream = TritonUpstream(url, timeout_s=30, on_retry=lambda: retries.append(1))
        try:
            return await upstream.generate(Target(model, str(v2)),
                                           [{"role": "user", "content": "hi"}],
                                           GenerationParams(max_tokens=2), None)  # fmt: skip
        finally:
            await upstream.close()

    backends = [pods["triton-d"], pods["triton-a"]]
    result, reached = asyncio.run(_through_round_robin(backends, call))
    assert result.model_version == str(v2)
    assert reached == backends and retries == [1]

    # The controller's next pass loads both routed versions onto it; then it is ready.
    made = ctl.tick()
    assert not [d for d in made if d.action in ("error", "rollback")], made
    assert loaded(pods["triton-d"], agent) == {v1: "READY", v2: "READY"}
    check(pods["triton-d"], canary)
    answer = httpx.get(ready_url, timeout=30)
    assert answer.status_code == 200 and f"revision {canary.revision}" in answer.text
    probe.shutdown()
    probe.server_close()

    # Rolled back: the challenger leaves every pod. A probe reading a table that still
    # routes to it (the kubelet's copy lags the ConfigMap) keeps every pod ready.
    registry.delete_alias(agent, CHALLENGER)
    ctl.until(lambda: all(loaded(url, agent).get(v2) != "READY" for url in pods.values()),
              timeout=60)  # fmt: skip
    for pod, url in pods.items():
        assert loaded(url, agent).get(v1) == "READY", pod
        check(url, canary)
    assert not (Path(settings.triton.model_repository) / model / str(v2)).exists()


def test_a_pod_that_cannot_load_a_version_fails_its_deploy_by_name(  # type: ignore[no-untyped-def]
    kube, triton, services_dir: Path, mlflow_server, registry, tmp_path: Path
) -> None:
    # A pod whose volume holds another repository: the version is not there to load.
    elsewhere = start_pod(services_dir, "triton-e", tmp_path / "other-repository")
    try:
        register(kube, "triton-a", triton.http_url, ready=True)
        register(kube, "triton-e", elsewhere.url, ready=True)
        agent = new_agent()
        model = names.triton_model(agent)
        routes = tmp_path / "routes.json"
        settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                    signals="spans", store_url=str(tmp_path / "spans"),
                                    namespace=NS)  # fmt: skip
        fleet = EndpointSliceFleet(NS, SERVICE, api_client=kube.api_client())
        ctl = controller(settings, fleet=fleet)
        v1 = registry.register(agent, Lineage(kind="echo")).version
        registry.promote(agent, v1)
        (error,) = [d for d in ctl.tick() if d.action == "error"]
        assert error.version == v1
        assert f"loading {agent} version {v1} failed on Triton pod triton-e at {elsewhere.url}" in (
            error.reason
        )
        # Nothing serves it, so nothing routes to it, and it left the pod that had loaded it.
        assert model not in RoutingFile(routes).current().routes
        assert loaded(triton.http_url, agent).get(v1) != "READY"
        assert not (triton.model_repository / model / str(v1)).exists()

        # Served on pod a alone, the champion and then a challenger: pod e, which cannot take
        # them, is that pod's fault, not the versions'. Nothing is rolled back; pod e stays
        # out of traffic (its readiness check waits for them).
        from kubernetes import client

        client.DiscoveryV1Api(kube.api_client()).delete_namespaced_endpoint_slice(
            f"{SERVICE}-triton-e", NS
        )
        ctl.until(lambda: model in RoutingFile(routes).current().routes, timeout=60)
        v2 = registry.register(agent, Lineage(kind="echo")).version
        registry.set_alias(agent, CHALLENGER, v2)
        ctl.until(lambda: (ctl.reconciler.state(agent) or AgentState(agent=agent)).phase
                  == Phase.CANARY, timeout=60)  # fmt: skip
        register(kube, "triton-e", elsewhere.url, ready=True)
        made = ctl.tick()
        errors = [d for d in made if d.action == "error"]
        assert errors and all("triton-e" in d.reason for d in errors), made
        assert not [d for d in made if d.action == "rollback"]
        state = ctl.reconciler.state(agent)
        assert state is not None and state.phase == Phase.CANARY and state.challenger == v2
        assert registry.aliases(agent).get(CHALLENGER) == v2
        assert loaded(triton.http_url, agent) == {v1: "READY", v2: "READY"}
    finally:
        elsewhere.stop()


def test_the_evaluation_stages_its_candidate_on_one_pod_or_its_own_triton(  # type: ignore[no-untyped-def]
    kube, triton, pods, no_system_model: Path
) -> None:
    """The evaluation's candidate is loaded on one serving pod, not on every one (a large
    or broken candidate took memory from every pod's models), and its requests go to that
    pod alone; with a Triton of the evaluation's own (``candidates_url``), on no serving
    pod at all. Gone from each when the evaluation ends."""
    from spanmill.evaluate.run import candidates_server
    from spanmill.evaluate.served import staged_candidate
    from spanmill.evaluate.settings import EvalSettings
    from spanmill.rollout.materialize import ModelRepository, ServingOptions
    from spanmill.serving.protocol import GenerationParams

    every = ("triton-a", "triton-b", "triton-c")
    for pod in every:
        register(kube, pod, pods[pod], ready=True)
    fleet = EndpointSliceFleet(NS, SERVICE, api_client=kube.api_client())
    repository = ModelRepository(str(triton.model_repository))
    options = ServingOptions(dtype="float32", num_threads=1)
    question = [[{"role": "user", "content": "What is 2 + 3?"}]]
    for own, expected in ((None, "triton-a"), (pods["triton-d"], "triton-d")):
        agent = new_agent()
        model = names.triton_candidate_model(agent)
        settings = EvalSettings(track=False, candidates_url=own)
        with (
            candidates_server(settings, fleet) as server,
            staged_candidate(server, repository, agent, str(no_system_model), None, options,
                             triton_url=server.url) as served,
        ):  # fmt: skip
            holding = [pod for pod in pods if served.version in loaded_model(pods[pod], model)]
            assert holding == [expected]
            assert served.triton_url == pods[expected]
            (answer,) = served.generate_batch(question, GenerationParams(max_tokens=4))
            assert answer.completion_tokens > 0
        assert not [pod for pod in pods if served.version in loaded_model(pods[pod], model)]
        assert not repository.versions(model)


def test_an_evaluation_stages_a_champion_not_in_service_and_never_loads_it_there(  # type: ignore[no-untyped-def]
    triton, pods, mlflow_server, no_system_model: Path
) -> None:
    """The registry's champion, which no serving Triton holds yet: the evaluation deployed
    it onto the serving Triton, the controller's alone. It is staged on the evaluation's
    server as the challenger is, answers there, and is gone from it after."""
    from spanmill.config import MLflowSettings, ServingSettings, TritonSettings
    from spanmill.evaluate.comparison import ModelRef
    from spanmill.evaluate.run import serve_models
    from spanmill.evaluate.settings import EvalSettings
    from spanmill.registry import ModelRegistry
    from spanmill.serving.protocol import GenerationParams

    agent = new_agent()
    registry = ModelRegistry(mlflow_server.tracking_uri)
    v1 = registry.register(agent, Lineage(kind="base", base_model=str(no_system_model))).version
    registry.promote(agent, v1)
    settings = EvalSettings(
        track=False,
        candidates_url=pods["triton-b"],
        mlflow=MLflowSettings(tracking_uri=mlflow_server.tracking_uri),
        triton=TritonSettings(
            http_url=triton.http_url, model_repository=str(triton.model_repository)
        ),
        serving=ServingSettings(dtype="float32", num_threads=1),
    )
    candidate = names.triton_candidate_model(agent)
    with serve_models(settings, agent, ModelRef("challenger", str(no_system_model))) as served:
        champion = served["champion"]
        assert (champion.triton_url, champion.model) == (pods["triton-b"], candidate)
        question = [[{"role": "user", "content": "What is 2 + 3?"}]]
        (answer,) = champion.generate_batch(question, GenerationParams(max_tokens=4))
        assert answer.completion_tokens > 0
        assert len(loaded_model(pods["triton-b"], candidate)) == 2  # and the challenger
    assert loaded_model(triton.http_url, names.triton_model(agent)) == {}
    assert loaded_model(pods["triton-b"], candidate) == {}
    assert not (triton.model_repository / names.triton_model(agent)).exists()
