"""The two models of an evaluation, as Triton serves them.

Evaluation generates through the serving path, never in its own process: the
champion is the agent's registered version where Triton serves it, and the
challenger, not registered yet, is staged as a version of the agent's *candidate*
Triton model (:func:`names.triton_candidate_model`), so the agent's own model keeps
holding registered versions only; so is a champion no serving pod holds. A candidate
version is removed again when the evaluation ends, whatever its outcome. It is staged
on one server, the evaluation's own Triton or one serving pod, never on every pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spanmill.errors import SpanmillError
from spanmill.registry import names
from spanmill.rollout.fleet import TritonFleet
from spanmill.rollout.materialize import ModelRepository, ServingOptions
from spanmill.serving.protocol import GenerationParams, GenerationResult

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

    def describe(self) -> str:
        return f"Triton {self.model} version {self.version}"

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

        upstream = TritonUpstream(self.triton_url, timeout_s=self.timeout_s)
        gate = asyncio.Semaphore(self.concurrency)

        async def one(messages: list[dict[str, Any]]) -> GenerationResult:
            async with gate:
                target = Target(self.model, str(self.version))
                return await upstream.generate(target, messages, params, tools)

        try:
            return list(await asyncio.gather(*(one(c) for c in conversations)))
        except UpstreamError as exc:
            raise ServingError(f"{self.describe()} failed: {exc}") from None
        finally:
            await upstream.close()


def candidate_version(taken: list[int]) -> int:
    """A version number no other evaluation picks: milliseconds since the epoch, or past
    the versions ``taken`` already."""
    return max(time.time_ns() // 1_000_000, max(taken, default=0) + 1)


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
) -> Iterator[ServedModel]:
    """``adapter`` on ``base_model`` (or the base alone) served as a candidate version, for
    the duration of the block; removed from the repository and from Triton afterwards.

    Version numbers are not reserved: two evaluations of one agent staging in the
    same millisecond would collide, and the second one's smoke check fails.
    """
    from spanmill.rollout.deployer import drop_version
    from spanmill.serving.repository import RepositoryError, write_python_version

    if options.flavour != "python":
        raise ServingError(
            f"evaluation stages challengers as python-flavour versions, and this deployment "
            f"serves the {options.flavour!r} flavour (SPANMILL_SERVING_FLAVOUR): evaluating "
            "vLLM-served adapters is not supported yet"
        )
    model = names.triton_candidate_model(agent)
    version = candidate_version(repository.versions(model))
    with repository.staging() as scratch:
        stage = Path(scratch) / "repository"
        try:
            write_python_version(stage, model, version, base_model, adapter=adapter,
                                 dtype=options.dtype, num_threads=options.num_threads,
                                 copy_base=options.copy_base, gpu=options.gpu)  # fmt: skip
        except RepositoryError as exc:
            raise ServingError(f"staging the challenger for evaluation: {exc}") from None
        repository.install(stage / model, model, version)
    try:
        try:
            # Every server of ``triton``: the evaluation's requests may reach any of them.
            for server in triton.members():
                server.load(model)
                server.smoke(model, version, timeout_s=smoke_timeout_s)
        except SpanmillError as exc:
            raise ServingError(f"{model} version {version} does not serve: {exc}") from None
        log.info("challenger staged as %s version %d", model, version)
        yield ServedModel(triton_url, model, version)
    finally:
        try:
            drop_version(triton, repository, model, version)
        except SpanmillError as exc:
            log.warning("removing %s version %d after the evaluation: %s", model, version, exc)
