"""The rollout controller: make Triton and the gateway serve what the MLflow aliases say.

A challenger is deployed (written to the model repository, loaded, smoke-checked),
then takes a growing share of traffic while its errors, latency and rewards are
watched; it is promoted (``champion`` moves) or rolled back (tagged with why).
One loop (:class:`Reconciler`) with two backends: a state file and routing file
(or the gateway's admin API) on one machine, a ConfigMap and Events on Kubernetes.
"""

from spanmill.rollout.decide import judge, next_move, route_for
from spanmill.rollout.deployer import Deployer, DeployError
from spanmill.rollout.local_backend import LocalBackend
from spanmill.rollout.materialize import ModelRepository, ServingOptions, materialize
from spanmill.rollout.reconciler import Reconciler
from spanmill.rollout.schemas import (
    AgentState,
    ControllerState,
    Decision,
    Health,
    Phase,
    RolloutPolicy,
)
from spanmill.rollout.signals import GatewayMetricsSignals, Signals, SpanStoreSignals
from spanmill.rollout.triton import TritonControl, TritonError

__all__ = [
    "AgentState",
    "ControllerState",
    "Decision",
    "DeployError",
    "Deployer",
    "GatewayMetricsSignals",
    "Health",
    "LocalBackend",
    "ModelRepository",
    "Phase",
    "Reconciler",
    "RolloutPolicy",
    "ServingOptions",
    "Signals",
    "SpanStoreSignals",
    "TritonControl",
    "TritonError",
    "judge",
    "materialize",
    "next_move",
    "route_for",
]
