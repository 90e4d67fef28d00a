"""Where the controller keeps its state and the routing table, and where its events go.

The reconciler is one loop; a backend is the part that differs between one
machine (:mod:`~spanmill.rollout.local_backend`) and Kubernetes
(:mod:`~spanmill.rollout.k8s_backend`).
"""

from __future__ import annotations

from typing import Protocol

from spanmill.errors import SpanmillError
from spanmill.gateway.routing import RoutingTable
from spanmill.rollout.schemas import ControllerState, Decision


class BackendError(SpanmillError):
    """The controller's state or the routing table could not be read or written."""


class RolloutBackend(Protocol):
    def describe(self) -> str:
        """Where state and routes live, for logs."""

    def load(self) -> tuple[ControllerState, RoutingTable]:
        """The persisted state and the routing table the gateway serves."""

    def save(self, state: ControllerState, table: RoutingTable | None) -> None:
        """Persist ``state`` and, when given, publish ``table``.

        The state is written first: the routes follow from it, so a crash in
        between is repaired by the next tick rewriting the routes.
        """

    def event(self, decision: Decision) -> None:
        """Record a decision where people look for what happened."""
