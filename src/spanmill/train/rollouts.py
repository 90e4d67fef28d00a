"""Rollouts for RL: groups of episodes of the agent's own code, read back from their spans.

:func:`run_groups` runs a task's episode code (:func:`spanmill.tasks.runner.run_episode`,
the code ``spanmill agent run`` uses) ``group_size`` times on each instance,
concurrently, against the rollout gateway. The episodes' own spans (the episode,
its tool calls and rewards) and the gateway's call spans go to the rollout topic.

:class:`RolloutReader` reads them back from that topic and
:func:`trajectories` turns them into what GRPO trains on, with the dataset
builder's own code (:func:`spanmill.dataset.episodes.read_llm_calls` and
:func:`~spanmill.dataset.episodes.read_rewards` over a store-shaped table): the
token ids trained on are the ones the gateway recorded, never re-tokenised text.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import wait
from dataclasses import dataclass
from typing import Any

import openai
import pyarrow as pa

from spanmill import semconv as sc
from spanmill.config import KafkaSettings
from spanmill.daemons import on_daemon_threads
from spanmill.dataset.episodes import read_llm_calls, read_rewards
from spanmill.spans import Span
from spanmill.spans.codec import detect_and_decode
from spanmill.spans.errors import SpanDecodeError
from spanmill.store.rows import table_from_spans
from spanmill.tasks.base import Task, TaskInstance
from spanmill.tasks.runner import EpisodeResult, run_episode
from spanmill.topic import partitions_of
from spanmill.train.errors import RewardError, TrainError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallTokens:
    """One LLM call of an episode, as the gateway recorded it."""

    response_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: str | None


@dataclass(frozen=True)
class Trajectory:
    """One episode: its group (the task instance), its rewards and its calls in order."""

    episode_id: str
    trace_id: str
    group: str
    rewards: Mapping[str, float]
    primary: str | None  # the reward marked primary in the window's spans
    calls: list[CallTokens]


def run_groups(
    client: openai.OpenAI,
    model: str,
    task: Task,
    instances: Sequence[TaskInstance],
    group_size: int,
    *,
    temperature: float,
    max_tokens: int,
    concurrency: int,
    timeout_s: float = 900.0,
) -> list[EpisodeResult]:
    """``group_size`` episodes of each instance, sampled, ``concurrency`` at a time.

    An episode is the agent's own code: one that raises (a tool's bug, a verifier's) or
    that has not ended within ``timeout_s`` of the step's start is a failed episode, with
    its error, never the end of the run; the others are trained on. A thread stuck in
    code that never returns cannot be stopped: it is left behind (a daemon thread, which
    the process does not wait for at its exit), and what it may still send is not read
    (its trace is not asked for).
    """
    if group_size < 2:
        raise TrainError(f"a group needs at least 2 episodes to compare, got {group_size}")
    jobs = [instance for instance in instances for _ in range(group_size)]

    def failed(instance: TaskInstance, error: str) -> EpisodeResult:
        return EpisodeResult(
            instance=instance, episode_id="", trace_id="", transcript=[], verdict=None,
            error=error,
        )  # fmt: skip

    def one(instance: TaskInstance) -> EpisodeResult:
        try:
            return run_episode(
                client, model, task, instance, temperature=temperature, max_tokens=max_tokens
            )
        except Exception as exc:
            if not isinstance(exc, openai.APIError):  # the server's errors say why already
                log.warning("an episode of %s failed", instance.id, exc_info=True)
            return failed(instance, f"{type(exc).__name__}: {exc}")

    futures = on_daemon_threads(one, jobs, concurrency)
    try:
        _, late = wait(futures, timeout=timeout_s)
        if late:
            log.error("%d of %d episodes had not ended after %g s; counted as failed",
                      len(late), len(futures), timeout_s)  # fmt: skip
        return [
            failed(instance, f"TimeoutError: the episode had not ended after {timeout_s:g} s")
            if future in late
            else future.result()
            for instance, future in zip(jobs, futures, strict=True)
        ]
    finally:
        for future in futures:
            future.cancel()  # those not begun yet are not begun


class RolloutReader:
    """Reads the rollout topic from where :meth:`mark` left it, keeping given traces' spans."""

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.topic = topic
        self._consumer = KafkaConsumer(
            **kafka.client_options(),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            allow_auto_create_topics=False,
        )
        partitions = partitions_of(self._consumer, topic)
        if partitions is None:
            raise TrainError(
                f"Kafka at {kafka.bootstrap_servers} did not say within 15 s which partitions "
                f"the topic {topic!r} has; is it up?"
            )
        if not partitions:
            self._consumer.close()
            raise TrainError(
                f"Kafka topic {topic!r} does not exist at {kafka.bootstrap_servers}; the "
                "rollouts are written there (the chart and `spanmill up` create it)"
            )
        self._partitions = [TopicPartition(topic, p) for p in sorted(partitions)]
        self._consumer.assign(self._partitions)
        self.mark()

    def mark(self) -> None:
        """From here: what is on the topic now is not read."""
        self._consumer.seek_to_end(*self._partitions)
        for partition in self._partitions:
            self._consumer.position(partition)

    def read(self, episodes: Sequence[EpisodeResult], timeout_s: float = 120.0) -> pa.Table:
        """The spans of ``episodes`` as a store table, once every call and reward is in.

        Waits until each episode's calls (by response id) and its episode span (which
        carries its rewards) have arrived; raises TrainError naming what is missing.
        """
        wanted = {e.trace_id for e in episodes}
        responses = {r for e in episodes for r in e.response_ids}
        episode_ids = {e.episode_id for e in episodes}
        spans: list[Span] = []
        seen_responses: set[str] = set()
        seen_episodes: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while responses - seen_responses or episode_ids - seen_episodes:
            if time.monotonic() > deadline:
                raise TrainError(
                    f"the rollout topic {self.topic!r} lacks {len(responses - seen_responses)} "
                    f"calls and {len(episode_ids - seen_episodes)} episodes after {timeout_s:.0f}s"
                )
            for records in self._consumer.poll(timeout_ms=500).values():
                for record in records:
                    try:
                        decoded = detect_and_decode(record.value, _content_type(record.headers))
                    except SpanDecodeError as exc:  # not this run's: its writers are spanmill's
                        log.warning("skipping an undecodable rollout record: %s", exc)
                        continue
                    for span in decoded:
                        if span.trace_id not in wanted:
                            continue
                        spans.append(span)
                        attributes = span.attributes
                        response = attributes.get(sc.GEN_AI_RESPONSE_ID)
                        if response is not None and sc.SPANMILL_COMPLETION_TOKEN_IDS in attributes:
                            seen_responses.add(str(response))
                        if attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT:
                            seen_episodes.add(str(attributes.get(sc.SPANMILL_EPISODE_ID, "")))
        return table_from_spans(spans, topic=self.topic)

    def close(self) -> None:
        self._consumer.close()


def _content_type(headers: Sequence[tuple[str, bytes]] | None) -> str | None:
    for key, value in headers or ():
        if key == sc.CONTENT_TYPE_HEADER:
            return value.decode(errors="replace")
    return None


def trajectories(table: pa.Table, episodes: Sequence[EpisodeResult]) -> list[Trajectory]:
    """Each finished episode's calls (token ids, logprobs, version) and rewards, from its spans.

    An episode missing the token record of one of its calls is refused: training
    on part of an episode would credit its reward to the wrong tokens.
    """
    calls = read_llm_calls(table)
    rewards = read_rewards(table)
    primary = rewards.primary(None)
    by_episode: dict[str, list[Any]] = defaultdict(list)
    for call in calls:
        by_episode[call.episode_id].append(call)
    found = []
    for result in episodes:
        # The calls whose answers the agent received, in its order. The gateway may have
        # answered a call the client gave up on and sent again (a dropped connection):
        # the agent never saw that answer, so it is no part of the episode.
        answered = {c.response_id: c for c in by_episode.get(result.episode_id, [])}
        missing = [r for r in result.response_ids if r not in answered]
        if missing:
            raise TrainError(
                f"episode {result.episode_id}: the agent received {missing}, which the "
                f"gateway did not record (it recorded {sorted(map(str, answered))})"
            )
        recorded = [answered[r] for r in result.response_ids]
        tokens = []
        for call in recorded:
            if call.prompt_token_ids is None or call.completion_token_ids is None:
                raise TrainError(f"call {call.response_id} was recorded without its token ids")
            logprobs = call.completion_logprobs or []
            if len(logprobs) != len(call.completion_token_ids):
                raise TrainError(
                    f"call {call.response_id} has {len(call.completion_token_ids)} tokens and "
                    f"{len(logprobs)} logprobs"
                )
            tokens.append(
                CallTokens(
                    response_id=str(call.response_id),
                    prompt_ids=list(call.prompt_token_ids),
                    completion_ids=list(call.completion_token_ids),
                    logprobs=[float(v) for v in logprobs],
                    version=call.model_version,
                )
            )
        # The episode's own rewards first; a call's score only where it is the episode's one.
        scored = rewards.episode_values(result.episode_id)
        if not scored:
            raise RewardError(f"episode {result.episode_id} was recorded without rewards")
        found.append(
            Trajectory(
                episode_id=result.episode_id,
                trace_id=result.trace_id,
                group=result.instance.id,
                rewards=scored,
                primary=primary,
                calls=tokens,
            )
        )
    return found
