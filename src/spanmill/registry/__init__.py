"""The model registry: one MLflow registered model per agent, versions with lineage.

``champion`` is the version in service, ``challenger`` the one the gate let
through. :class:`ModelRegistry` registers versions and moves aliases; the rollout
controller (:mod:`spanmill.rollout`) makes Triton and the gateway follow them.
"""

from spanmill.registry.client import (
    Desired,
    ModelRegistry,
    RegisteredVersion,
    Registration,
)
from spanmill.registry.lineage import Lineage, lineage_from_outputs, with_evaluation
from spanmill.registry.names import CHALLENGER, CHAMPION, RegistryError

__all__ = [
    "CHALLENGER",
    "CHAMPION",
    "Desired",
    "Lineage",
    "ModelRegistry",
    "RegisteredVersion",
    "Registration",
    "RegistryError",
    "lineage_from_outputs",
    "with_evaluation",
]
