"""Putting a registered version into service in Triton, and taking it out.

Deploying is: write the version into the model repository (unless it is there),
load the agent's model so Triton picks it up, and send the version one request
of its own. Only a version that answers is handed to the gateway.

With several Triton replicas this happens on every one of them (the fleet, see
:mod:`spanmill.rollout.fleet`): the repository is shared, the load and the check
are per server, and a deployment is done only when every server answers. Asking
whether a version is ready asks every server too, so a replica that joins later
is found lacking on the controller's next pass, and the same deployment loads
what it lacks onto it.

In the vLLM flavour every version of an agent is served by one engine (Triton
version 1 of the agent's model): deploying an adapter adds it to the engine's
adapter list and reloads the engine once; from then on a canary between versions,
and a rollback, are routing changes alone (the gateway picks the adapter by name).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from spanmill.errors import SpanmillError
from spanmill.registry import names
from spanmill.registry.client import ModelRegistry
from spanmill.rollout.fleet import TritonFleet
from spanmill.rollout.materialize import (
    ORIGIN,
    Engine,
    ModelRepository,
    ServingOptions,
    add_to_engine,
    materialize,
    origin_of,
    read_engine,
    remove_from_engine,
)
from spanmill.rollout.triton import TritonControl, TritonError, TritonUnreachable
from spanmill.serving.repository import ENGINE_VERSION

log = logging.getLogger(__name__)


class DeployError(SpanmillError):
    """A version could not be put into service; the message says at which stage and why."""


class EngineReloadError(DeployError):
    """No server could reload the agent's vLLM engine with a new version, and each serves
    the engine it had: nothing is said against the version, which may be tried again."""


class ServingUnreachable(DeployError):
    """Triton could not be asked (restarting, its pods not listed, the network): the
    deployment is neither done nor refused, and nothing is said against the version."""


class PodDeployError(DeployError):
    """Some servers serve the version, and one that lacked it could not take it (a pod
    added by a scale-up, say): that pod stays out of traffic (its readiness check waits
    for the version), and the version keeps serving on the others."""


class Deployer:
    def __init__(
        self,
        registry: ModelRegistry,
        triton: TritonFleet,
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
        # Whether this controller still leads (the reconciler's Lease): a deployment that
        # fails after the Lease went elsewhere leaves its clean-up to the new leader, which
        # may be deploying the same version meanwhile.
        self.fence: Callable[[], bool] = lambda: True

    @property
    def vllm(self) -> bool:
        return self.options.flavour == "vllm"

    def ready(self, agent: str, version: int) -> bool:
        """Whether every Triton server has ``version`` loaded and ready. A server that
        cannot be asked (killed, restarting) serves nothing: False, and the pass goes on
        to what that calls for (the champion loaded again, a canary rolled back)."""
        model = names.triton_model(agent)
        if self.vllm:
            engine = read_engine(self.repository, model)
            if engine is None or version not in engine.versions:
                return False
            version = ENGINE_VERSION
        try:
            return all(s.versions(model).get(version) == "READY" for s in self.triton.members())
        except TritonError as exc:
            log.warning("%s version %d: %s", agent, version, exc)
            return False

    def present(self, agent: str) -> list[int]:
        """The registered versions the model repository holds for ``agent``."""
        model = names.triton_model(agent)
        if self.vllm:
            engine = read_engine(self.repository, model)
            return sorted(engine.versions) if engine is not None else []
        return self.repository.versions(model)

    def engine(self, agent: str) -> Engine | None:
        """The agent's vLLM engine as the repository holds it (None: python flavour, or
        no engine yet)."""
        return read_engine(self.repository, names.triton_model(agent)) if self.vllm else None

    def deploy(self, agent: str, version: int, *, serving: bool = False) -> float:
        """Write, load and smoke-check ``version`` on every server; returns the seconds it took.

        On failure DeployError says what went wrong, and on which server. A version that
        no server had before is removed from the repository again (a version that cannot
        load would make every later load of the agent's model fail); one that others
        serve stays with them. So does one ``serving`` (the champion, loaded again after
        every server lost it): no server holding it says nothing of its files. Where its
        files do not load, they are written again from the registry and loaded once more
        (damaged files would otherwise fail every try); kept whatever happens, for the
        next try.
        """
        started = time.perf_counter()
        model = names.triton_model(agent)
        registered = self.registry.version(agent, version)
        if self.vllm:
            return self._deploy_to_engine(agent, version, registered, started)
        if self.repository.has(model, version):
            found = self.repository.origin(model, version)
            if self.repository.unfinished(model, version):
                # An upload cut short (a controller killed or deposed part way): written again.
                log.warning("%s version %d: its upload to %s was cut short; writing it again",
                            agent, version, self.repository.location)  # fmt: skip
                self.repository.remove(model, version)
            elif found != origin_of(registered):
                raise DeployError(
                    f"Triton version {version} of {model} in {self.repository.location} was not "
                    f"written from MLflow version {version} of {agent} (its {ORIGIN} says "
                    f"{found}); Triton versions must match MLflow versions: remove that folder "
                    "(and unload it), or register what it holds"
                )
        try:
            servers = self.triton.members()
            lacking = [s for s in servers if s.versions(model).get(version) != "READY"]
        except TritonError as exc:
            raise _asking_failed(f"finding where {agent} version {version} is loaded failed: "
                                 f"{exc}", exc) from None  # fmt: skip
        written = False
        if lacking and not self.repository.has(model, version):
            self._write(agent, registered, servers, lacking)
            written = True
        try:
            self._load_and_check(agent, version, servers, lacking, version,
                                 new=len(lacking) == len(servers) and not serving)  # fmt: skip
        except PodDeployError:
            raise
        except DeployError as exc:
            if written or not serving or len(lacking) != len(servers):
                raise
            # No server holds the champion and its files do not load: they may be what
            # is wrong (damaged on the volume), so they are written again from the
            # registry and tried once more; if that fails too, the new files stay.
            log.warning("%s version %d: %s; writing it again from the registry", agent,
                        version, exc)  # fmt: skip
            self._write(agent, registered, servers, lacking, keep=True)
            self._load_and_check(agent, version, servers, lacking, version, new=False)
        seconds = time.perf_counter() - started
        if lacking:
            onto = ", ".join(s.describe() for s in lacking)
            log.info("%s version %d deployed in %.1fs onto %s", agent, version, seconds, onto)
        return seconds

    def _write(
        self,
        agent: str,
        registered: Any,
        servers: list[TritonControl],
        lacking: list[TritonControl],
        *,
        keep: bool = False,
    ) -> None:
        """Write ``registered`` into the repository for the servers ``lacking`` it; a
        version no server holds is removed again where that fails, unless ``keep``."""
        try:
            materialize(registered, self.registry, self.repository, self.options)
        except SpanmillError as exc:
            message = (
                f"writing {agent} version {registered.version} failed: {_first_line(str(exc))}"
            )
            if len(lacking) == len(servers):
                if not keep:
                    self._clean_up(agent, registered.version)
                raise DeployError(message) from None
            raise PodDeployError(message) from None

    def _load_and_check(
        self,
        agent: str,
        version: int,
        servers: list[TritonControl],
        lacking: list[TritonControl],
        loaded_as: int,
        *,
        new: bool,
    ) -> None:
        """Load the model onto each server in ``lacking`` and smoke-check ``version`` on
        every server that holds it (``loaded_as``: the Triton version that must be READY).

        Raises, naming what failed first: DeployError where no server answers, or the
        version is ``new`` to every server (it is removed again); PodDeployError where
        some answer and others cannot take it."""
        model = names.triton_model(agent)
        failures: list[str] = []
        unreachable = 0  # failures of servers that could not be asked at all
        holding = [s for s in servers if s not in lacking]
        for server in lacking:
            try:
                server.load(model)
                holding.append(server)
            except SpanmillError as exc:
                unreachable += isinstance(exc, TritonUnreachable)
                try:
                    reason = server.reasons(model).get(loaded_as, "")
                except SpanmillError:
                    reason = ""
                detail = _first_line(reason) or _first_line(
                    str(exc).removeprefix(f"{server.describe()}: ")
                )
                failures.append(
                    f"loading {agent} version {version} failed on {server.describe()}: {detail}"
                )
        answering: list[TritonControl] = []
        for server in holding:
            try:
                self._smoke(server, agent, version)
                answering.append(server)
            except SpanmillError as exc:
                unreachable += isinstance(exc, TritonUnreachable)
                detail = _first_line(str(exc).removeprefix(f"{server.describe()}: "))
                failures.append(
                    f"checking {agent} version {version} failed on {server.describe()}: "
                    f"it does not answer: {detail}"
                )
        if not failures:
            return
        if unreachable == len(failures) and not answering:
            # No server could be asked: a restart or an outage, not the version's fault.
            # What was written stays, for the next try.
            raise ServingUnreachable(failures[0])
        if unreachable == len(failures):
            # Only servers that could not be asked failed (a pod lost mid-load), and others
            # serve it: nothing against the version, new or not. It serves on those, and its
            # files stay for the lost pod, which stays out of traffic until it takes it.
            raise PodDeployError(failures[0])
        if new and self.vllm and not holding and self._engine_serves_on(agent, servers):
            # No server reloaded the engine with the version, and each serves the engine
            # it held (Triton keeps a model whose reload fails): its adapter files are read
            # only at its first request, so the failure says nothing against the version
            # (a GPU still holding a draining engine, a slow start). Out of the record
            # again, with nothing to reload, and to be tried again.
            if self._leading(agent, version):
                try:
                    remove_from_engine(self.repository, agent, version, self.options)
                except SpanmillError as exc:
                    log.warning("%s version %d: taking it out of the engine: %s", agent, version,
                                exc)  # fmt: skip
            raise EngineReloadError(failures[0])
        if new:
            self._clean_up(agent, version)
            raise DeployError(failures[0])
        if not answering:  # loaded somewhere, answering nowhere: nothing serves it
            raise DeployError(failures[0])
        raise PodDeployError(failures[0])

    def _deploy_to_engine(self, agent: str, version: int, registered: Any, started: float) -> float:
        """The vLLM flavour's deploy: the version joins the engine, and every server
        reloads the engine once (a version the engine lists already needs nothing)."""
        model = names.triton_model(agent)
        engine = read_engine(self.repository, model)
        listed = engine is not None and version in engine.versions
        if listed and engine is not None and engine.origins.get(version) != origin_of(registered):
            raise DeployError(
                f"the vLLM engine of {model} in {self.repository.location} serves a version "
                f"{version} that was not written from MLflow version {version} of {agent}: "
                f"retire it first"
            )
        try:
            servers = self.triton.members()
            lacking = [s for s in servers if s.versions(model).get(ENGINE_VERSION) != "READY"]
        except TritonError as exc:
            raise _asking_failed(f"finding where {agent}'s engine is loaded failed: {exc}",
                                 exc) from None  # fmt: skip
        try:
            if not listed:
                add_to_engine(registered, self.registry, self.repository, self.options)
                lacking = servers
        except SpanmillError as exc:
            message = f"writing {agent} version {version} failed: {_first_line(str(exc))}"
            if not listed:
                self._clean_up(agent, version)
            raise DeployError(message) from None
        if listed:
            # A ready engine may be older than its record: the controller stopped between
            # writing the engine and reloading it on every server, and Triton says READY of
            # the engine it loaded before. One that does not answer for the version reloads.
            stale = [
                s for s in servers if s not in lacking and not self._answers(s, agent, version)
            ]
            lacking += stale
        self._load_and_check(agent, version, servers, lacking, ENGINE_VERSION, new=not listed)
        seconds = time.perf_counter() - started
        if not listed:
            log.info("%s version %d added to its vLLM engine in %.1fs", agent, version, seconds)
        return seconds

    def _leading(self, agent: str, version: int) -> bool:
        if self.fence():
            return True
        log.warning("%s version %d: no longer leading; what its failed deployment wrote is "
                    "left to the leader", agent, version)  # fmt: skip
        return False

    def _clean_up(self, agent: str, version: int) -> None:
        if not self._leading(agent, version):
            return
        try:
            self._drop(agent, version)
        except SpanmillError as cleanup:
            log.warning("%s version %d: cleaning up after the failure: %s", agent, version, cleanup)

    def _engine_serves_on(self, agent: str, servers: list[TritonControl]) -> bool:
        model = names.triton_model(agent)
        try:
            return all(s.versions(model).get(ENGINE_VERSION) == "READY" for s in servers)
        except TritonError:
            return False

    def _answers(self, server: TritonControl, agent: str, version: int) -> bool:
        try:
            self._smoke(server, agent, version)
        except SpanmillError as exc:
            log.info("%s version %d does not answer on %s (%s): reloading its engine there",
                     agent, version, server.describe(), _first_line(str(exc)))  # fmt: skip
            return False
        return True

    def _smoke(self, server: TritonControl, agent: str, version: int) -> None:
        model = names.triton_model(agent)
        if self.vllm:
            engine = read_engine(self.repository, model)
            lora = engine.versions.get(version) if engine is not None else None
            server.smoke(model, ENGINE_VERSION, flavour="vllm", lora=lora,
                         timeout_s=self.smoke_timeout_s)  # fmt: skip
            return
        server.smoke(model, version, flavour="python", timeout_s=self.smoke_timeout_s)

    def retire(self, agent: str, version: int) -> None:
        """Take ``version`` out of every Triton server and out of the repository."""
        self._drop(agent, version)
        log.info("%s version %d retired", agent, version)

    def _drop(self, agent: str, version: int) -> None:
        model = names.triton_model(agent)
        if not self.vllm:
            drop_version(self.triton, self.repository, model, version)
            return
        engine = read_engine(self.repository, model)
        if engine is None or version not in engine.versions:
            return  # never joined the engine (or left it already): nothing to reload
        left = remove_from_engine(self.repository, agent, version, self.options)
        failures: list[TritonError] = []
        for server in self.triton.members():
            try:
                if server.versions(model).get(ENGINE_VERSION) not in ("READY", "LOADING"):
                    continue
                # The engine reloads without the adapter; one serving nothing goes.
                if left is not None:
                    server.load(model)
                else:
                    server.unload(model)
            except TritonError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]


def drop_version(
    triton: TritonFleet, repository: ModelRepository, model: str, version: int
) -> None:
    """Remove one version from the repository and from every server; the model's others stay.

    Every server is tried even when one fails; the first failure is raised after.
    """
    repository.remove(model, version)
    others = repository.versions(model)
    failures: list[TritonError] = []
    for server in triton.members():
        try:
            if server.versions(model).get(version) not in ("READY", "LOADING"):
                continue  # never loaded here, or failed to: nothing to unload
            if others:
                server.load(model)
            else:
                server.unload(model)
        except TritonError as exc:
            failures.append(exc)
    if failures:
        raise failures[0]


def _asking_failed(message: str, cause: TritonError) -> DeployError:
    """ServingUnreachable where Triton could not be asked at all, else DeployError."""
    return (ServingUnreachable if isinstance(cause, TritonUnreachable) else DeployError)(message)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return ""
