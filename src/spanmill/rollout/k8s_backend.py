"""The controller's backend on Kubernetes: one ConfigMap holds the routing table (key
``routes.json``, watched by every gateway replica) and the rollout state (annotation
``spanmill.io/rollout-state``); each decision becomes a Kubernetes Event on it.

Routes and state change in one merge patch, so a gateway never sees a table the
stored state does not explain, and a restarted controller finds both together.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from typing import Any

from pydantic import ValidationError

from spanmill.gateway.configmap import ROUTES_KEY, write_configmap_routes
from spanmill.gateway.routing import RoutingTable
from spanmill.kube import kube_api_client, request_timeout
from spanmill.rollout.backend import BackendError
from spanmill.rollout.schemas import ControllerState, Decision

log = logging.getLogger(__name__)

STATE_ANNOTATION = "spanmill.io/rollout-state"
COMPONENT = "spanmill-rollout"
_REASONS = {
    "serve": "Serving", "deploy": "Deployed", "canary": "CanaryStarted",
    "advance": "StepAdvanced", "hold": "Holding", "promote": "Promoted",
    "rollback": "RolledBack", "retire": "Retired", "error": "Failed",
}  # fmt: skip
_WARNINGS = frozenset({"rollback", "error"})


def event_name(configmap: str, decision: Decision) -> str:
    """A name a reader can predict: the ConfigMap, agent, version, action and share."""
    share = "" if decision.weight is None else f".{int(decision.weight)}"
    version = "" if decision.version is None else f".v{decision.version}"
    raw = f"{configmap}.{decision.agent}{version}.{decision.action}{share}"
    return re.sub(r"[^a-z0-9.-]", "-", raw.lower())[:253].strip(".-")


class KubernetesBackend:
    def __init__(
        self,
        namespace: str,
        configmap: str,
        *,
        initial: RoutingTable | None = None,
        api_client: Any = None,
    ) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.configmap = configmap
        # Written into the ConfigMap while it holds no table: the chart renders none where
        # this controller runs, so that a GitOps sync never resets live traffic.
        self.initial = initial or RoutingTable()
        self.core = client.CoreV1Api(api_client or kube_api_client())
        # The ConfigMap's version as last read or written: every write is conditional on
        # it, so a controller that lost its Lease cannot overwrite its successor's work.
        self._version: str | None = None

    def describe(self) -> str:
        return f"ConfigMap {self.namespace}/{self.configmap}"

    def _fail(self, what: str, exc: Exception) -> BackendError:
        status = getattr(exc, "status", None)
        hint = (
            "; the controller's service account needs get/create/patch on configmaps and "
            "create/patch on events in this namespace"
            if status == 403
            else ""
        )
        reason = getattr(exc, "reason", None) or exc
        return BackendError(f"{what} {self.describe()} failed: {reason}{hint}")

    def load(self) -> tuple[ControllerState, RoutingTable]:
        from kubernetes.client.exceptions import ApiException

        try:
            configmap = self.core.read_namespaced_config_map(
                self.configmap, self.namespace, _request_timeout=request_timeout()
            )
        except ApiException as exc:
            if exc.status == 404:
                self._version = None
                return ControllerState(), self._seeded(ControllerState())
            raise self._fail("reading", exc) from None
        except Exception as exc:  # connection refused, timeouts
            raise self._fail("reading", exc) from None
        self._version = configmap.metadata.resource_version
        annotations = configmap.metadata.annotations or {}
        raw_state = annotations.get(STATE_ANNOTATION)
        try:
            state = (
                ControllerState.model_validate_json(raw_state) if raw_state else ControllerState()
            )
        except ValidationError as exc:
            raise BackendError(
                f"annotation {STATE_ANNOTATION} of {self.describe()} is unreadable "
                f"({exc.errors()[0]['msg']}); fix it, or remove it to start over from the MLflow "
                "aliases"
            ) from None
        text = (configmap.data or {}).get(ROUTES_KEY)
        if not text:
            return state, self._seeded(state)
        return state, RoutingTable.parse(text, f"{self.describe()} key {ROUTES_KEY}")

    def _seeded(self, state: ControllerState) -> RoutingTable:
        """The initial table, written into a ConfigMap that holds none (where it routes
        anything), so that the gateway serves it before any rollout step changes it."""
        if self.initial.routes:
            log.info("the routing ConfigMap holds no table: writing the initial one")
            self.save(state, self.initial)
        return self.initial

    def save(self, state: ControllerState, table: RoutingTable | None) -> None:
        annotations = {STATE_ANNOTATION: state.model_dump_json()}
        try:
            if table is None:
                self._patch_state(annotations)
            else:
                self._version = write_configmap_routes(
                    self.core, self.namespace, self.configmap, table,
                    annotations=annotations, resource_version=self._version,
                )  # fmt: skip
        except Exception as exc:
            if getattr(exc, "status", None) == 409:
                raise BackendError(
                    f"{self.describe()} changed since this controller read it (another "
                    "controller wrote it: this one no longer leads); nothing written"
                ) from None
            raise self._fail("writing", exc) from None

    def _patch_state(self, annotations: dict[str, str]) -> None:
        from kubernetes.client.exceptions import ApiException

        metadata: dict[str, Any] = {"annotations": annotations}
        if self._version:
            metadata["resourceVersion"] = self._version
        try:
            written = self.core.patch_namespaced_config_map(
                self.configmap,
                self.namespace,
                {"metadata": metadata},
                _request_timeout=request_timeout(),
            )
            self._version = written.metadata.resource_version
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._version = write_configmap_routes(
                self.core, self.namespace, self.configmap, RoutingTable(), annotations=annotations
            )

    def event(self, decision: Decision) -> None:
        from kubernetes.client.exceptions import ApiException

        name = event_name(self.configmap, decision)
        now = dt.datetime.fromtimestamp(decision.at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": {"spanmill.io/agent": _label(decision.agent)}},
            "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap",
                               "name": self.configmap, "namespace": self.namespace},
            "reason": _REASONS[decision.action],
            "message": decision.message()[:1024],
            "type": "Warning" if decision.action in _WARNINGS else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }  # fmt: skip
        try:
            self.core.create_namespaced_event(
                self.namespace, body, _request_timeout=request_timeout()
            )
        except ApiException as exc:
            if exc.status != 409:
                raise self._fail(f"recording event {name} on", exc) from None
            # The same decision again (a version retired twice): count it on the same event.
            try:
                current = self.core.read_namespaced_event(
                    name, self.namespace, _request_timeout=request_timeout()
                )
                self.core.patch_namespaced_event(
                    name,
                    self.namespace,
                    {"count": (current.count or 1) + 1, "lastTimestamp": now,
                     "message": body["message"]},
                    _request_timeout=request_timeout(),
                )  # fmt: skip
            except Exception as again:  # as any failure to record: the backend's error
                raise self._fail(f"recording event {name} on", again) from None
        except Exception as exc:
            raise self._fail(f"recording event {name} on", exc) from None


def _label(value: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", value)[:63]
    return cleaned.strip("-_.") or "agent"
