"""Finding the Triton pods from the EndpointSlices of a headless Service (kmock's API through
the official client); loading onto them runs in test_triton_fleet.py."""

from __future__ import annotations

from typing import Any

import pytest

from spanmill.config import TritonSettings
from spanmill.rollout.fleet import SERVICE_NAME_LABEL, EndpointSliceFleet, PodEndpoint, fleet_of
from spanmill.rollout.triton import TritonControl, TritonError
from spanmill.stack.ports import free_port

NS = "flywheel"
SERVICE = "spanmill-triton-pods"


def endpoint(address: str, pod: str | None, **conditions: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"addresses": [address], "conditions": conditions}
    if pod is not None:
        entry["targetRef"] = {"kind": "Pod", "name": pod, "namespace": NS}
    return entry


def create_slice(kube: Any, name: str, service: str, ports: dict[str, int],
                 endpoints: list[dict[str, Any]], address_type: str = "IPv4") -> None:  # fmt: skip
    from kubernetes import client

    client.DiscoveryV1Api(kube.api_client()).create_namespaced_endpoint_slice(NS, {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {SERVICE_NAME_LABEL: service}},
        "addressType": address_type,
        "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports.items()],
        "endpoints": endpoints,
    })  # fmt: skip


def test_every_pod_ready_or_not_with_its_slices_port(kube) -> None:  # type: ignore[no-untyped-def]
    create_slice(kube, f"{SERVICE}-abc", SERVICE, {"http": 8000, "grpc": 8001}, [
        endpoint("10.0.0.1", "triton-0", ready=True, serving=True, terminating=False),
        # Not ready: exactly the pod that still needs the routed versions.
        endpoint("10.0.0.2", "triton-1", ready=True, serving=False, terminating=False),
        # Going away: nothing more to load there.
        endpoint("10.0.0.3", "triton-2", ready=False, serving=True, terminating=True),
    ])  # fmt: skip
    create_slice(kube, f"{SERVICE}-v6", SERVICE, {"http": 8000},
                 [endpoint("fd00::4", None, ready=True)], address_type="IPv6")  # fmt: skip
    # Another Service's pods, and a slice without the port the controller uses.
    create_slice(kube, "gateway-xyz", "spanmill-gateway", {"http": 8080},
                 [endpoint("10.0.0.9", "gateway-0", ready=True)])  # fmt: skip
    create_slice(kube, f"{SERVICE}-grpc-only", SERVICE, {"grpc": 8001},
                 [endpoint("10.0.0.5", "triton-5", ready=True)])  # fmt: skip

    fleet = EndpointSliceFleet(NS, SERVICE, api_client=kube.api_client())
    assert fleet.endpoints() == [
        PodEndpoint(pod="fd00::4", url="[fd00::4]:8000"),
        PodEndpoint(pod="triton-0", url="10.0.0.1:8000"),
        PodEndpoint(pod="triton-1", url="10.0.0.2:8000"),
    ]


def test_no_pod_that_answers_is_an_error_that_names_the_service(kube) -> None:  # type: ignore[no-untyped-def]
    # Other Services have pods; this one none yet.
    create_slice(kube, "gateway-xyz", "spanmill-gateway", {"http": 8080},
                 [endpoint("10.0.0.9", "gateway-0", ready=True)])  # fmt: skip
    fleet = EndpointSliceFleet(NS, SERVICE, api_client=kube.api_client(), load_timeout_s=5)
    with pytest.raises(TritonError, match=r"no Triton pod answers .*\(none listed\)"):
        fleet.members()
    # Listed, but nothing listens there yet (the pod is starting): left for a later pass.
    create_slice(kube, f"{SERVICE}-a", SERVICE, {"http": free_port()},
                 [endpoint("127.0.0.1", "triton-0", ready=True)])  # fmt: skip
    with pytest.raises(TritonError, match=r"flywheel/spanmill-triton-pods \(triton-0\)"):
        fleet.members()


def test_one_server_without_discovery_every_pod_with_it(  # type: ignore[no-untyped-def]
    kube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    single = fleet_of(TritonSettings())
    assert isinstance(single, TritonControl) and single.members() == [single]
    assert single.describe() == f"Triton at {single.url}"
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig", "ns")))
    every = fleet_of(TritonSettings(discovery="endpointslices", namespace="ns", pods_service="t"))
    assert isinstance(every, EndpointSliceFleet)
    assert (every.pods.namespace, every.pods.service, every.pods.port_name) == ("ns", "t", "http")


def test_a_pod_that_accepts_and_never_answers_is_not_live() -> None:
    """Its connections are accepted (the kernel's backlog) and never answered: the check
    gives up on its own short timeout rather than a load's."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        control = TritonControl(f"127.0.0.1:{port}")
        try:
            assert control.live(timeout_s=0.5) is False
        finally:
            control.close()
