"""Run a task's episodes against any OpenAI-compatible endpoint, traced and rewarded.

Each episode is an SDK :func:`~spanmill.sdk.episode` span with the instance id as
``spanmill.task.id``; tool calls are ``execute_tool`` spans; the verifier's
rewards are ``gen_ai.evaluation.result`` events on the episode. The OpenAI
client should send the trace context (:func:`~spanmill.sdk.traced_http_client`,
which :func:`run_agent` uses) so the gateway's LLM spans join the episode's trace.

What the gateway can record from each request, beyond the chat itself:

- ``extra_body={"metadata": {...}}`` carries the prompt's identity and the
  episode's ids under their semconv names: ``spanmill.prompt.name``,
  ``spanmill.prompt.version``, ``spanmill.task.id`` and ``spanmill.episode.id``;
- a few-shot example message carries ``"spanmill.message.example": true`` as a
  key of the message object itself; kept in ``gen_ai.input.messages``, it lets
  the dataset builder drop example turns (see :mod:`spanmill.semconv`).

Few-shot examples call the tool in the JSON-content form, and their ``tool``
messages name a ``tool_call_id`` (``example-N``) that no ``tool_calls`` entry
declares: servers that insist on that pairing take zero-shot prompts only.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any, cast

import openai

from spanmill import semconv as sc
from spanmill.errors import SpanmillError
from spanmill.sdk import emit_reward, episode, tool_call, traced_http_client
from spanmill.tasks.base import (
    Message,
    PromptStyle,
    Split,
    Task,
    TaskInstance,
    Verdict,
    get_task,
)
from spanmill.tasks.loop import DEFAULT_MAX_TURNS, EpisodeLoop

DEFAULT_MAX_TOKENS = 128


class AgentRunError(SpanmillError):
    """Episodes could not be run at all: the model endpoint is unreachable or refuses us."""


@dataclass(frozen=True)
class EpisodeResult:
    """One finished episode: what was said, how it was judged, what it cost."""

    instance: TaskInstance
    episode_id: str
    trace_id: str
    transcript: list[Message]
    verdict: Verdict | None
    response_ids: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None

    @property
    def reward(self) -> float:
        return self.verdict.primary.value if self.verdict else 0.0

    def score(self, name: str) -> float:
        return self.verdict.rewards.get(name, 0.0) if self.verdict else 0.0


@dataclass(frozen=True)
class RunReport:
    """Rates over all episodes; an episode that errored counts as a failure."""

    task: str
    model: str
    split: Split
    prompt_style: PromptStyle
    episodes: list[EpisodeResult]

    @property
    def n(self) -> int:
        return len(self.episodes)

    def _mean(self, values: list[float]) -> float:
        return fmean(values) if values else 0.0

    @property
    def success_rate(self) -> float:
        return self._mean([e.score("success") for e in self.episodes])

    @property
    def valid_call_rate(self) -> float:
        return self._mean([e.score("valid_call") for e in self.episodes])

    @property
    def mean_reward(self) -> float:
        return self._mean([e.reward for e in self.episodes])

    @property
    def mean_completion_tokens(self) -> float:
        return self._mean([float(e.completion_tokens) for e in self.episodes if e.error is None])

    @property
    def errors(self) -> int:
        return sum(e.error is not None for e in self.episodes)


def _request_metadata(
    task: Task, instance: TaskInstance, style: PromptStyle, episode_id: str
) -> dict[str, str]:
    return {
        sc.SPANMILL_PROMPT_NAME: task.prompt_name(style),
        sc.SPANMILL_PROMPT_VERSION: task.prompt_version,
        sc.SPANMILL_TASK_ID: instance.id,
        sc.SPANMILL_EPISODE_ID: episode_id,
    }


def _assistant_message(response: Any) -> Message:
    """The reply as a message to send back: only what the chat API defines for one.

    Whatever else a server adds to its reply stays out of the next request.
    """
    reply = response.choices[0].message
    message: Message = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in reply.tool_calls
            if getattr(call, "function", None) is not None
        ]
    elif message["content"] is None:
        message["content"] = ""
    return message


def run_episode(
    client: openai.OpenAI,
    model: str,
    task: Task,
    instance: TaskInstance,
    *,
    prompt_style: PromptStyle = "zero_shot",
    temperature: float = 0.0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int | None = None,
    max_turns: int = DEFAULT_MAX_TURNS,
) -> EpisodeResult:
    """Run one episode of ``task`` on ``instance`` and reward it.

    Turns go on while the model calls tools, at most ``max_turns`` LLM calls.
    ``seed`` is the sampling seed sent to the endpoint.
    Errors of the endpoint (``openai.APIError``) propagate, the episode span
    marked as failed and no reward given: a broken server says nothing of the policy.
    """
    loop = EpisodeLoop(task, instance, prompt_style, max_turns)
    response_ids: list[str | None] = []
    prompt_tokens = completion_tokens = 0
    with episode(task.agent_name, task_id=instance.id) as current:
        metadata = _request_metadata(task, instance, prompt_style, current.episode_id)
        options: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens}
        if seed is not None:
            options["seed"] = seed
        while not loop.done:
            response = client.chat.completions.create(
                model=model,
                messages=loop.messages,  # type: ignore[arg-type]
                tools=task.tools(),  # type: ignore[arg-type]
                extra_body={"metadata": metadata},
                **options,
            )
            response_ids.append(response.id or None)
            if response.usage is not None:
                prompt_tokens += response.usage.prompt_tokens or 0
                completion_tokens += response.usage.completion_tokens or 0
            call = loop.add_reply(_assistant_message(response))
            if call is None:
                break
            call_id = call.id or f"call_{uuid.uuid4().hex[:24]}"
            with tool_call(call.name, call_id, json.dumps(call.arguments)) as running:
                outcome = loop.run_tool(call)
                if outcome.error is not None:
                    running.set_error(outcome.error)
                running.set_result(outcome.content)
            loop.add_tool_result(call_id, outcome.content)
        verdict = loop.verdict()
        for score in verdict.scores:
            linked = (
                response_ids[score.turn]
                if score.turn is not None and score.turn < len(response_ids)
                else None
            )
            emit_reward(
                score.name,
                score.value,
                response_id=linked,
                primary=score.primary,
                explanation=verdict.explanation if score.primary else None,
            )
    return EpisodeResult(
        instance=instance,
        episode_id=current.episode_id,
        trace_id=current.trace_id,
        transcript=loop.transcript,
        verdict=verdict,
        response_ids=[rid for rid in response_ids if rid],
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )


Progress = Callable[[int, int, EpisodeResult], None]


def make_client(
    base_url: str, api_key: str | None = None, timeout_s: float = 120.0
) -> openai.OpenAI:
    """An OpenAI client for ``base_url`` that sends the trace context with every request."""
    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key or os.environ.get("OPENAI_API_KEY") or "spanmill",
        # openai>=3 is typed for httpx2 clients yet takes httpx ones, which it wraps.
        http_client=cast(Any, traced_http_client(timeout=timeout_s)),
        max_retries=1,
    )


def run_agent(
    task: Task | str,
    n: int,
    base_url: str,
    model: str,
    *,
    split: Split = "heldout",
    prompt_style: PromptStyle = "zero_shot",
    temperature: float = 0.0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int = 0,
    concurrency: int = 1,
    sampling_seed: int | None = None,
    api_key: str | None = None,
    progress: Progress | None = None,
    client: openai.OpenAI | None = None,
) -> RunReport:
    """Run ``n`` episodes of ``task`` (instances of ``split`` drawn with ``seed``).

    ``sampling_seed``, when given, goes to the endpoint with every request.

    ``progress(done, total, result)`` is called after each episode. An episode the
    endpoint fails is reported with its error and counts as a failure; when the
    endpoint cannot be reached or refuses the credentials, the run stops with an
    AgentRunError.
    """
    resolved = get_task(task) if isinstance(task, str) else task
    if concurrency < 1:
        raise AgentRunError(f"concurrency must be at least 1, got {concurrency}")
    instances = resolved.instances(split, n, seed)
    own_client = client is None
    active = client or make_client(base_url, api_key)

    def one(instance: TaskInstance) -> EpisodeResult:
        try:
            return run_episode(
                active,
                model,
                resolved,
                instance,
                prompt_style=prompt_style,
                temperature=temperature,
                max_tokens=max_tokens,
                seed=sampling_seed,
            )
        except (openai.APIConnectionError, openai.AuthenticationError, openai.NotFoundError) as exc:
            raise AgentRunError(_unusable(exc, base_url, model)) from None
        except openai.APIError as exc:
            return EpisodeResult(
                instance=instance,
                episode_id="",
                trace_id="",
                transcript=[],
                verdict=None,
                error=f"{type(exc).__name__}: {exc}",
            )

    results: dict[str, EpisodeResult] = {}
    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="episode") as pool:
            futures = [pool.submit(one, instance) for instance in instances]
            try:
                for done, future in enumerate(as_completed(futures), 1):
                    result = future.result()
                    results[result.instance.id] = result
                    if progress is not None:
                        progress(done, len(instances), result)
            except BaseException:
                for pending in futures:
                    pending.cancel()
                raise
    finally:
        if own_client:
            active.close()
    return RunReport(
        task=resolved.name,
        model=model,
        split=split,
        prompt_style=prompt_style,
        episodes=[results[instance.id] for instance in instances],
    )


def _unusable(exc: openai.APIError, base_url: str, model: str) -> str:
    if isinstance(exc, openai.APIConnectionError):
        return (
            f"cannot reach the model endpoint at {base_url}: {exc}; start the gateway "
            "(or the local stack) or pass the right --base-url"
        )
    if isinstance(exc, openai.AuthenticationError):
        return (
            f"the endpoint at {base_url} refused the API key ({exc.status_code}); set "
            "SPANMILL_GATEWAY_API_KEY or OPENAI_API_KEY to the gateway's key"
        )
    return (
        f"the endpoint at {base_url} answered 404 for model {model!r}: {exc}; check that "
        "the base URL ends in /v1 and that the model is served (--model)"
    )
