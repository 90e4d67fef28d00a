"""The two models of an evaluation, as Triton serves them.

Evaluation generates through the serving path, never in its own process: the
champion is the agent's registered version where Triton serves it, and the
challenger, not registered yet, is staged as a version of the agent's *candidate*
Triton model (:func:`names.triton_candidate_model`), so the agent's own model keeps
holding registered versions only; so is a champion no serving pod holds. A candidate
version is removed again when the evaluation ends, whatever its outcome. It is staged
on one server, the evaluation's own Triton or one serving pod, never on every pod.

A version an evaluation that was killed left behind is removed by the next one to
stage a candidate of the agent: each version holds a record (:data:`RECORD`) its
evaluation renews every minute while it runs, and one not renewed for ten minutes
is a leftover, as is one whose record names the staging evaluation itself (a retry
of the same pipeline task, whose first try was killed). Before, a leftover stayed a
day, loaded beside every later candidate: in the vLLM flavour an engine holding half
the GPU, which no later engine fit beside.

In the vLLM flavour the candidates of one evaluation are LoRA adapters of one engine
(a version of the candidate model), each asked for by name: a GPU holds one engine,
and what is staged runs on the same one (a champion in service answers from the
agent's engine, on the same base model).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spanmill.errors import SpanmillError
from spanmill.registry import names
from spanmill.rollout.deployer import drop_version
from spanmill.rollout.fleet import TritonFleet
from spanmill.rollout.materialize import (
    Flavour,
    MaterializeError,
    ModelRepository,
    ServingOptions,
    adapter_root,
    engine_base,
)
from spanmill.serving.protocol import GenerationParams, GenerationResult
from spanmill.serving.repository import (
    ENGINE_VERSION,
    RepositoryError,
    check_vllm_adapter,
    write_python_version,
    write_vllm_engine,
)

if TYPE_CHECKING:
    from spanmill.gateway.prompts import Tokenizers
    from spanmill.rollout.triton import TritonControl

log = logging.getLogger(__name__)


class ServingError(SpanmillError):
    """A model to evaluate could not be put into Triton or does not answer there."""


@dataclass(frozen=True)
class ServedModel:
    """One version in Triton, generating for evaluation: the ``BatchGenerator`` episodes use.

    A batch's requests are sent together so Triton's dynamic batcher can run them
    as one; ``concurrency`` bounds how many are in flight.
    """

    triton_url: str
    model: str
    version: int
    concurrency: int = 16
    timeout_s: float = 600.0
    # The vLLM flavour: the engine (its Triton version) and the adapter that serve this
    # version (None: the base model itself), and the base model whose tokenizer renders.
    flavour: Flavour = "python"
    engine: int = ENGINE_VERSION
    lora_name: str | None = None
    base_model: str | None = None
    # The agent's registered version this stands for (a champion staged for the
    # evaluation is served under a version of its own); None: none registered.
    registered: int | None = None

    def describe(self) -> str:
        served = f"Triton {self.model} version {self.version}"
        return f"{served} (adapter {self.lora_name})" if self.lora_name else served

    def generate_batch(
        self,
        conversations: list[list[dict[str, Any]]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[GenerationResult]:
        return asyncio.run(self._all(conversations, params, tools))

    async def _all(
        self,
        conversations: list[list[dict[str, Any]]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None,
    ) -> list[GenerationResult]:
        from spanmill.gateway.upstream import Target, TritonUpstream, UpstreamError

        upstream = TritonUpstream(self.triton_url, timeout_s=self.timeout_s,
                                  tokenizers=_tokenizers())  # fmt: skip
        gate = asyncio.Semaphore(self.concurrency)

        async def one(messages: list[dict[str, Any]]) -> GenerationResult:
            async with gate:
                target = Target(self.model, str(self.version), self.flavour, self.lora_name,
                                self.base_model, self.engine)  # fmt: skip
                return await upstream.generate(target, messages, params, tools)

        try:
            return list(await asyncio.gather(*(one(c) for c in conversations)))
        except UpstreamError as exc:
            raise ServingError(f"{self.describe()} failed: {exc}") from None
        finally:
            await upstream.close()


@functools.cache
def _tokenizers() -> Tokenizers:
    """The vLLM flavour's prompt renderers, each base model's loaded once per process (not
    once per batch)."""
    from spanmill.gateway.prompts import Tokenizers

    return Tokenizers()


# In each candidate version: who staged it, and when it last said it still runs.
RECORD = "spanmill-evaluation.json"
# How often a running evaluation renews its record, and how long one not renewed is kept.
HEARTBEAT_S = 60.0
LEFTOVER_AFTER_S = 10 * HEARTBEAT_S
# A version without a record (written before records were) older than this is a leftover
# (its number is when it was staged, in milliseconds).
UNRECORDED_LEFTOVER_AFTER_S = 24 * 3600.0


def candidate_version(taken: list[int]) -> int:
    """A version number no other evaluation picks: milliseconds since the epoch, or past
    the versions ``taken`` already."""
    return max(time.time_ns() // 1_000_000, max(taken, default=0) + 1)


def _new_candidate_version(
    triton: TritonFleet, repository: ModelRepository, model: str, owner: str | None
) -> int:
    """A version number for a candidate of ``model``, once the leftovers of evaluations
    killed before they removed theirs are gone (with ``version_policy: all``, each load of
    the candidate model would load them again): see the module's docstring."""
    taken = repository.versions(model)
    now = time.time()
    for version in taken:
        record = repository.read_json(model, str(version), RECORD)
        if record is None:
            gone = version < (now - UNRECORDED_LEFTOVER_AFTER_S) * 1000
            why = "left by an evaluation that did not end"
        elif owner is not None and record.get("owner") == owner:
            gone, why = True, f"left by an earlier try of this evaluation ({owner})"
        else:
            beat = record.get("beat")
            silent = now - beat if isinstance(beat, int | float) else float("inf")
            gone = silent > LEFTOVER_AFTER_S
            why = f"left by an evaluation silent for {silent:.0f}s ({record.get('owner')})"
        if not gone:
            continue
        log.warning("removing %s version %d, %s", model, version, why)
        try:
            drop_version(triton, repository, model, version)
        except SpanmillError as exc:
            log.warning("removing %s version %d: %s", model, version, exc)
    return candidate_version(taken)


class _Heartbeat:
    """Renews a staged version's :data:`RECORD` every :data:`HEARTBEAT_S` until stopped."""

    def __init__(self, repository: ModelRepository, model: str, version: int,
                 record: dict[str, Any]) -> None:  # fmt: skip
        self.repository, self.parts, self.record = repository, (model, str(version), RECORD), record
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="spanmill-candidate-heartbeat",
                                       daemon=True)  # fmt: skip
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(HEARTBEAT_S):
            try:
                self.repository.write_json({**self.record, "beat": time.time()}, *self.parts)
            except Exception as exc:  # the next beat tries again; ten missed, it is a leftover
                log.warning("renewing %s: %s", "/".join(self.parts), exc)

    def stop(self) -> None:
        """Stopped, its last write done: a beat after the version's removal would leave a
        folder Triton reads as a version."""
        self.stopping.set()
        self.thread.join()


@dataclass(frozen=True)
class Candidate:
    """What an evaluation stages: a base model, and an adapter on it (None: the base
    itself); ``copy_base``: the base is a download the version must take with it;
    ``named``: the base as it was named before it was resolved to this machine's files
    (a catalog name, a hub id), which a vLLM engine opens."""

    base_model: str
    adapter: Path | None = None
    copy_base: bool = False
    named: str = ""

    def engine_base(self) -> str:
        """The base model as a vLLM engine in Triton's pod opens it."""
        return engine_base(self.named or self.base_model)


def same_engine(base_model: str, candidate: Candidate) -> None:
    """Refuse ``candidate`` where an engine on ``base_model`` cannot serve it."""
    if engine_base(base_model) != candidate.engine_base():
        raise ServingError(
            f"the vllm flavour serves adapters of one base model in one engine, and the "
            f"models to compare are on different base models ({engine_base(base_model)}, "
            f"{candidate.engine_base()})"
        )


@contextmanager
def staged_candidates(
    triton: TritonFleet,
    repository: ModelRepository,
    agent: str,
    candidates: Mapping[str, Candidate],
    options: ServingOptions,
    *,
    triton_url: str,
    owner: str | None = None,
) -> Iterator[dict[str, ServedModel]]:
    """Each of ``candidates`` served, by its name, for the duration of the block: a
    version of its own each in the Python flavour, adapters of one engine in the vLLM
    flavour. ``owner``: who stages them (a pipeline run's id and task), in their
    records."""
    if options.flavour == "vllm":
        with staged_engine(triton, repository, agent, candidates, options,
                           triton_url=triton_url, owner=owner) as served:  # fmt: skip
            yield served
        return
    with ExitStack() as stack:
        yield {
            name: stack.enter_context(
                staged_candidate(
                    triton,
                    repository,
                    agent,
                    candidate.base_model,
                    candidate.adapter,
                    replace(options, copy_base=True) if candidate.copy_base else options,
                    triton_url=triton_url,
                    owner=owner,
                )
            )
            for name, candidate in candidates.items()
        }


@contextmanager
def _staged(
    triton: TritonFleet,
    repository: ModelRepository,
    model: str,
    write: Callable[[Path, int], None],
    smoke: Callable[[TritonControl, int], None],
    *,
    what: str,
    owner: str | None = None,
) -> Iterator[int]:
    """A new version of the candidate ``model`` for the duration of the block: ``write``
    puts it in a staging repository (its root, the version), the version is installed,
    with its :data:`RECORD` (``owner``: who stages it), then loaded onto every server of
    ``triton`` (the evaluation's requests may reach any of them) and checked there by
    ``smoke``; removed from the repository and from Triton afterwards, whatever the
    outcome."""
    version = _new_candidate_version(triton, repository, model, owner)
    record = {"owner": owner, "host": socket.gethostname(), "staged": time.time()}
    with repository.staging() as scratch:
        stage = Path(scratch) / "repository"
        write(stage, version)
        (stage / model / str(version) / RECORD).write_text(
            json.dumps({**record, "beat": time.time()})
        )
        repository.install(stage / model, model, version)
    heartbeat = _Heartbeat(repository, model, version, record)
    try:
        try:
            for server in triton.members():
                server.load(model)
                smoke(server, version)
        except SpanmillError as exc:
            raise ServingError(f"{model} version {version} does not serve: {exc}") from None
        log.info("%s staged as %s version %d", what, model, version)
        yield version
    finally:
        heartbeat.stop()
        try:
            drop_version(triton, repository, model, version)
        except SpanmillError as exc:
            log.warning("removing %s version %d after the evaluation: %s", model, version, exc)


@contextmanager
def staged_engine(
    triton: TritonFleet,
    repository: ModelRepository,
    agent: str,
    candidates: Mapping[str, Candidate],
    options: ServingOptions,
    *,
    triton_url: str,
    smoke_timeout_s: float = 300.0,
    owner: str | None = None,
) -> Iterator[dict[str, ServedModel]]:
    """``candidates`` as LoRA adapters of one vLLM engine on their common base model, a
    version of the agent's candidate model, each asked for by its name (None for the base
    model itself); removed from the repository and from Triton afterwards."""
    whole = [name for name, candidate in candidates.items() if candidate.copy_base]
    if whole:
        raise ServingError(
            f"the {', '.join(whole)} is a whole model, and the vllm flavour serves a base "
            "model and LoRA adapters on it"
        )
    first, *others = candidates.values()
    base = first.engine_base()
    for other in others:
        same_engine(base, other)
    model = names.triton_candidate_model(agent)
    try:
        root = adapter_root(repository, options)
    except MaterializeError as exc:
        raise ServingError(str(exc)) from None
    loras = {name: c.adapter for name, c in candidates.items() if c.adapter is not None}

    def write(stage: Path, version: int) -> None:
        adapters = {name: f"{root}/{model}/{version}/adapters/{name}" for name in loras}
        try:
            folder = write_vllm_engine(
                stage, model, base, adapters, **options.engine_arguments(), version=version,
                every_version=True,
            )  # fmt: skip
            for name, adapter in loras.items():
                check_vllm_adapter(adapter, options.vllm_max_lora_rank)
                shutil.copytree(adapter, folder / "adapters" / name)
        except (RepositoryError, OSError) as exc:
            raise ServingError(f"staging the candidates for evaluation: {exc}") from None

    def smoke(server: TritonControl, version: int) -> None:
        for name in candidates:
            server.smoke(model, version, flavour="vllm", lora=name if name in loras else None,
                         timeout_s=smoke_timeout_s)  # fmt: skip

    what = f"{', '.join(candidates)} (adapters of one engine)"
    with _staged(triton, repository, model, write, smoke, what=what, owner=owner) as version:
        yield {
            name: ServedModel(triton_url, model, version, flavour="vllm", engine=version,
                              lora_name=name if name in loras else None, base_model=base)
            for name in candidates
        }  # fmt: skip


@contextmanager
def staged_candidate(
    triton: TritonFleet,
    repository: ModelRepository,
    agent: str,
    base_model: str,
    adapter: Path | None,
    options: ServingOptions,
    *,
    triton_url: str,
    smoke_timeout_s: float = 300.0,
    owner: str | None = None,
) -> Iterator[ServedModel]:
    """``adapter`` on ``base_model`` (or the base alone) served as a candidate version, for
    the duration of the block; removed from the repository and from Triton afterwards.

    Version numbers are not reserved: two evaluations of one agent staging in the
    same millisecond would collide, and the second one's smoke check fails.
    """
    if options.flavour != "python":
        raise ServingError(
            f"a {options.flavour!r}-flavour candidate is staged by staged_candidates, not "
            "as a version of its own"
        )
    model = names.triton_candidate_model(agent)

    def write(stage: Path, version: int) -> None:
        try:
            write_python_version(stage, model, version, base_model, adapter=adapter,
                                 dtype=options.dtype, num_threads=options.num_threads,
                                 copy_base=options.copy_base, gpu=options.gpu)  # fmt: skip
        except RepositoryError as exc:
            raise ServingError(f"staging the challenger for evaluation: {exc}") from None

    def smoke(server: TritonControl, version: int) -> None:
        server.smoke(model, version, timeout_s=smoke_timeout_s)

    with _staged(triton, repository, model, write, smoke, what="a candidate",
                 owner=owner) as version:  # fmt: skip
        yield ServedModel(triton_url, model, version)
