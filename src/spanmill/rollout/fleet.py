"""The Triton servers every version is loaded on: one, or every pod of a headless Service.

On one machine the fleet is the one server at ``SPANMILL_TRITON_HTTP_URL`` (a
:class:`~spanmill.rollout.triton.TritonControl` is a fleet of one). On Kubernetes,
with several Triton replicas, the ClusterIP Service the gateway calls sends each
connection to one ready pod, so a load through it reaches one pod only. The
controller therefore finds the pods through the EndpointSlices of a headless
Service that publishes pods before they are ready (``publishNotReadyAddresses``):
a new pod is listed while its readiness check still waits for the versions the
routing table names (``spanmill triton ready``), and the controller loads them
onto it (see :mod:`spanmill.rollout.deployer`).

The slices are listed afresh on each call, so a pod that appears or goes is seen
on the controller's next tick.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from spanmill.config import TritonSettings
from spanmill.errors import SpanmillError
from spanmill.kube import request_timeout
from spanmill.rollout.triton import TritonControl, TritonUnreachable

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class TritonFleet(Protocol):
    def members(self) -> list[TritonControl]:
        """The servers a version must be loaded on, now; raises TritonError when none is."""
        ...


@dataclass(frozen=True)
class PodEndpoint:
    """One Triton pod as an EndpointSlice lists it."""

    pod: str
    url: str


def pod_endpoints(slices: list[Any], service: str, port_name: str) -> list[PodEndpoint]:
    """The pods of ``service`` from its EndpointSlices (``V1EndpointSlice`` objects).

    Every endpoint counts whether or not it is ready: an unready pod is the one that
    still needs the routed versions. Terminating pods do not, and an endpoint's
    address is paired with the port its own slice names ``port_name``.
    """
    found: dict[str, PodEndpoint] = {}
    for item in slices:
        labels = (item.metadata.labels or {}) if item.metadata else {}
        if labels.get(SERVICE_NAME_LABEL) != service:
            continue
        ports = [p.port for p in item.ports or [] if p.name == port_name and p.port]
        if not ports:
            log.warning(
                "EndpointSlice %s of Service %s has no port named %r; its pods are skipped",
                item.metadata.name, service, port_name,
            )  # fmt: skip
            continue
        for endpoint in item.endpoints or []:
            conditions = endpoint.conditions
            if conditions is not None and conditions.terminating:
                continue
            if not endpoint.addresses:
                continue
            address = endpoint.addresses[0]
            host = f"[{address}]" if ":" in address else address
            url = f"{host}:{ports[0]}"
            target = endpoint.target_ref
            pod = (target.name if target is not None else None) or endpoint.hostname or address
            found.setdefault(url, PodEndpoint(pod=pod, url=url))
    return sorted(found.values(), key=lambda e: (e.pod, e.url))


def fleet_of(triton: TritonSettings, *, load_timeout_s: float = 600.0) -> TritonFleet:
    """The Triton servers each version goes onto: the one configured, or every pod."""
    if triton.discovery == "endpointslices":
        return EndpointSliceFleet(
            triton.namespace,
            triton.pods_service,
            port_name=triton.port_name,
            load_timeout_s=load_timeout_s,
        )
    return TritonControl(triton.http_url, load_timeout_s=load_timeout_s)


class ServiceUnlisted(SpanmillError):
    """A Service's EndpointSlices could not be listed."""


class ServicePods:
    """The live pods behind a Service, from its EndpointSlices: where each pod of the Triton
    fleet is loaded, and where each gateway replica's metrics are read."""

    def __init__(
        self, namespace: str, service: str, *, port_name: str = "http", api_client: Any = None
    ) -> None:
        from kubernetes import client

        from spanmill.kube import kube_api_client

        self.namespace = namespace
        self.service = service
        self.port_name = port_name
        self.discovery = client.DiscoveryV1Api(api_client or kube_api_client())

    def describe(self) -> str:
        return f"the pods of Service {self.namespace}/{self.service}"

    def endpoints(self) -> list[PodEndpoint]:
        """Every pod listed and not terminating, ready or not, at its port ``port_name``."""
        try:
            listed = self.discovery.list_namespaced_endpoint_slice(
                self.namespace,
                label_selector=f"{SERVICE_NAME_LABEL}={self.service}",
                _request_timeout=request_timeout(),
            )
        except Exception as exc:
            status = getattr(exc, "status", None)
            hint = (
                "; this pod's service account needs list on endpointslices "
                "(discovery.k8s.io) in that namespace"
                if status == 403
                else ""
            )
            reason = getattr(exc, "reason", None) or exc
            raise ServiceUnlisted(
                f"listing the EndpointSlices of {self.describe()} failed: {reason}{hint}"
            ) from None
        return pod_endpoints(listed.items, self.service, self.port_name)


class EndpointSliceFleet:
    """Every live pod behind a headless Service, from its EndpointSlices."""

    def __init__(
        self,
        namespace: str,
        service: str,
        *,
        port_name: str = "http",
        load_timeout_s: float = 600.0,
        api_client: Any = None,
    ) -> None:
        self.pods = ServicePods(namespace, service, port_name=port_name, api_client=api_client)
        self.load_timeout_s = load_timeout_s
        self._controls: dict[PodEndpoint, TritonControl] = {}
        self._silent: set[PodEndpoint] = set()
        # The controller's pass and its deploy threads ask for the members at once.
        self._lock = threading.Lock()

    def describe(self) -> str:
        return self.pods.describe()

    def endpoints(self) -> list[PodEndpoint]:
        try:
            return self.pods.endpoints()
        except ServiceUnlisted as exc:
            raise TritonUnreachable(str(exc)) from None

    def members(self) -> list[TritonControl]:
        """The listed pods whose Triton answers; one still starting is left for a later tick.

        A pod that does not answer yet cannot take a load, and takes no traffic either:
        it is not ready before it holds the routed versions.
        """
        endpoints = self.endpoints()
        with self._lock:
            # A gone pod's control is dropped, not closed: a deploy thread may still be
            # asking it something; its clients close once nothing holds it.
            for gone in set(self._controls) - set(endpoints):
                self._controls.pop(gone, None)
                self._silent.discard(gone)
            controls = []
            for endpoint in endpoints:
                control = self._controls.get(endpoint)
                if control is None:
                    control = TritonControl(endpoint.url, load_timeout_s=self.load_timeout_s,
                                            pod=endpoint.pod)  # fmt: skip
                    self._controls[endpoint] = control
                controls.append((endpoint, control))
        live: list[TritonControl] = []
        for endpoint, control in controls:
            if control.live():
                live.append(control)
                with self._lock:
                    self._silent.discard(endpoint)
                continue
            with self._lock:
                first_silence = endpoint not in self._silent
                self._silent.add(endpoint)
            if first_silence:
                log.info("%s does not answer yet; it gets its versions once it does",
                         control.describe())  # fmt: skip
        if not live:
            listed = ", ".join(e.pod for e in endpoints) or "none listed"
            raise TritonUnreachable(
                f"no Triton pod answers among {self.describe()} ({listed}); check that Triton "
                "runs and that SPANMILL_TRITON_PODS_SERVICE names its headless Service"
            )
        return live
