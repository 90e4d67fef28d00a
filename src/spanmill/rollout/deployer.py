"""Putting a registered version into service in Triton, and taking it out.

Deploying is: write the version into the model repository (unless it is there),
load the agent's model so Triton picks it up, and send the version one request
of its own. Only a version that answers is handed to the gateway.
"""

from __future__ import annotations

import logging
import time

from spanmill.errors import SpanmillError
from spanmill.registry import names
from spanmill.registry.client import ModelRegistry
from spanmill.rollout.materialize import (
    ORIGIN,
    ModelRepository,
    ServingOptions,
    materialize,
    origin_of,
)
from spanmill.rollout.triton import TritonControl, TritonError

log = logging.getLogger(__name__)


class DeployError(SpanmillError):
    """A version could not be put into service; the message says at which stage and why."""


class Deployer:
    def __init__(
        self,
        registry: ModelRegistry,
        triton: TritonControl,
        repository: ModelRepository,
        options: ServingOptions | None = None,
        *,
        smoke_timeout_s: float = 120.0,
    ) -> None:
        self.registry = registry
        self.triton = triton
        self.repository = repository
        self.options = options or ServingOptions()
        self.smoke_timeout_s = smoke_timeout_s

    def loaded(self, agent: str) -> dict[int, str]:
        """Version -> Triton state for the agent's model."""
        return self.triton.versions(names.triton_model(agent))

    def ready(self, agent: str, version: int) -> bool:
        return self.loaded(agent).get(version) == "READY"

    def deploy(self, agent: str, version: int) -> float:
        """Write, load and smoke-check ``version``; returns the seconds it took.

        On failure the version is removed from the repository again (a version that
        cannot load would make every later load of the agent's model fail) and
        DeployError says what went wrong.
        """
        started = time.perf_counter()
        model = names.triton_model(agent)
        registered = self.registry.version(agent, version)
        if self.repository.has(model, version):
            found = self.repository.origin(model, version)
            if found != origin_of(registered):
                raise DeployError(
                    f"Triton version {version} of {model} in {self.repository.location} was not "
                    f"written from MLflow version {version} of {agent} (its {ORIGIN} says "
                    f"{found}); Triton versions must match MLflow versions: remove that folder "
                    "(and unload it), or register what it holds"
                )
        if self.ready(agent, version):
            self._smoke(agent, version)
            return time.perf_counter() - started
        stage = "writing"
        try:
            if not self.repository.has(model, version):
                materialize(registered, self.registry, self.repository, self.options)
            stage = "loading"
            self.triton.load(model)
            stage = "checking"
            self._smoke(agent, version)
        except SpanmillError as exc:
            detail = str(exc)
            if stage == "loading":
                try:
                    reason = self.triton.reasons(model).get(version, "")
                except SpanmillError:
                    reason = ""
                detail = _first_line(reason) or _first_line(detail)
            try:
                self._drop(agent, version)
            except SpanmillError as cleanup:
                log.warning(
                    "%s version %d: cleaning up after the failure: %s", agent, version, cleanup
                )
            raise DeployError(f"{stage} {agent} version {version} failed: {detail}") from None
        seconds = time.perf_counter() - started
        log.info("%s version %d deployed in %.1fs", agent, version, seconds)
        return seconds

    def _smoke(self, agent: str, version: int) -> None:
        lora = names.lora_name(agent, version) if self.options.flavour == "vllm" else None
        try:
            self.triton.smoke(names.triton_model(agent), version, flavour=self.options.flavour,
                              lora=lora, timeout_s=self.smoke_timeout_s)  # fmt: skip
        except TritonError as exc:
            raise DeployError(f"{agent} version {version} does not answer: {exc}") from None

    def retire(self, agent: str, version: int) -> None:
        """Take ``version`` out of Triton and out of the repository."""
        self._drop(agent, version)
        log.info("%s version %d retired", agent, version)

    def _drop(self, agent: str, version: int) -> None:
        drop_version(self.triton, self.repository, names.triton_model(agent), version)


def drop_version(
    triton: TritonControl, repository: ModelRepository, model: str, version: int
) -> None:
    """Remove one version from the repository and from Triton; the model's others stay."""
    repository.remove(model, version)
    if triton.versions(model).get(version) not in ("READY", "LOADING"):
        return  # never loaded, or failed to: nothing to unload
    if repository.versions(model):
        triton.load(model)
    else:
        triton.unload(model)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return ""
