"""Episodes from a table of stored spans: the LLM calls in time order, and the rewards.

Works on the span store's columns directly (no per-span objects), so a million
spans take seconds. LLM calls are found by ``gen_ai.operation.name``, never by
span names; rewards come from the store's ``rewards`` column, which holds each
span's own reward and its ``gen_ai.evaluation.result`` events.

A reward reaches the call whose ``gen_ai.response.id`` it names, wherever that call
sits (feedback on a foreign response id lands in a trace of its own); otherwise its
episode. A reward span without an episode id of its own judges the episode of the
calls in its trace (feedback given by trace id, when the agent's calls carry a
``spanmill.episode.id``).
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from spanmill import semconv as sc
from spanmill.errors import SpanmillError
from spanmill.store.links import content_digest
from spanmill.store.queries import linked_rewards

# The store columns a build reads.
COLUMNS = (
    "trace_id",
    "span_id",
    "episode_id",
    "start_time",
    "operation_name",
    "status_code",
    "service_name",
    "agent_name",
    "model",
    "model_version",
    "task_id",
    "conversation_id",
    "response_id",
    "prompt_name",
    "prompt_version",
    "input_messages",
    "output_messages",
    "system_instructions",
    "input_tokens",
    "output_tokens",
    "completion_token_ids",
    "attributes",
    "rewards",
    "scope_name",
    "resource_attributes",
)
# Read besides COLUMNS by an RL trainer, which needs every token the model saw.
TOKEN_COLUMNS = ("prompt_token_ids", "completion_logprobs")
# The columns rewards are read from: enough for spans read only for their rewards (those
# after the calls' window, where late feedback sits).
REWARD_COLUMNS = (
    "trace_id",
    "span_id",
    "episode_id",
    "start_time",
    "operation_name",
    "response_id",
    "rewards",
    "scope_name",
    "resource_attributes",
)


class DatasetError(SpanmillError):
    """A dataset cannot be built as asked; the message says what to change."""


@dataclass(slots=True)
class LLMCall:
    trace_id: str
    span_id: str
    episode_id: str
    start_ns: int
    service: str | None
    agent: str | None
    model: str | None
    model_version: str | None
    task_id: str | None
    response_id: str | None
    prompt_name: str | None
    input_messages: str | None
    output_messages: str | None
    system_instructions: str | None
    input_tokens: int | None
    output_tokens: int | None
    completion_token_ids: list[int] | None
    failed: bool
    request: str | None = None  # the call's parameters a replay needs (request_of)
    index: int = 0  # position among the episode's calls, in time order
    calls_in_episode: int = 1
    # What a policy-gradient trainer needs, read only when the table has them
    # (TOKEN_COLUMNS): the rendered prompt's ids and the sampled tokens' logprobs.
    prompt_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    training: bool = False  # an RL rollout's call (spanmill.traffic=training)
    conversation_id: str | None = None  # gen_ai.conversation.id: a chat's turns share it


@dataclass
class Rewards:
    """Every reward seen, by episode and by the response id it is linked to.

    When one name is given several times, the latest span's value counts.
    """

    by_episode: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    by_response: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    # The call-linked values of each episode, by name and response id (episode_value).
    linked_by_episode: dict[str, dict[str, dict[str, float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict))
    )
    # How often each name is given, and marked primary, by the episode it reaches: which
    # rewards a subset of calls has.
    names_by_episode: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    primary_by_episode: dict[str, Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    # For each feedback reward (POST /v1/feedback), the episode of the calls it reached,
    # or None when its ids match no call read: kept, and counted in the dataset card.
    feedback_reached: list[str | None] = field(default_factory=list)
    # Stored scores that are not finite (stores written before a reward had to be):
    # left out, and counted in the dataset card.
    not_finite: int = 0

    @property
    def names(self) -> Counter[str]:
        """Every reward name seen, and how often."""
        return sum(self.names_by_episode.values(), Counter())

    def episode_value(self, episode: str, name: str) -> float | None:
        """The episode's reward ``name``: its own, else the one linked to a call where only
        one call of the episode has one (several calls' scores are theirs, not the
        episode's: the last one seen was everyone's before)."""
        own = self.by_episode.get(episode, {}).get(name)
        if own is not None:
            return own
        linked = self.linked_by_episode.get(episode, {}).get(name, {})
        return next(iter(linked.values())) if len(linked) == 1 else None

    def episode_values(self, episode: str) -> dict[str, float]:
        """Every reward of the episode by name, as :meth:`episode_value` reads each."""
        names = {*self.by_episode.get(episode, {}), *self.linked_by_episode.get(episode, {})}
        values = {name: self.episode_value(episode, name) for name in names}
        return {name: value for name, value in values.items() if value is not None}

    def primary(self, requested: str | None, episodes: Iterable[str] | None = None) -> str | None:
        """The reward to optimise: the one asked for, else the one marked primary; among
        the rewards of ``episodes`` where given (the calls a dataset keeps: another
        agent's rewards in the same window must not decide this one's)."""
        names: Counter[str] = Counter()
        primaries: Counter[str] = Counter()
        for episode in self.names_by_episode if episodes is None else set(episodes):
            names.update(self.names_by_episode.get(episode, Counter()))
            primaries.update(self.primary_by_episode.get(episode, Counter()))
        if requested is not None:
            if names and requested not in names:
                raise DatasetError(
                    f"no reward named {requested!r} in the window; seen: {sorted(names)}"
                )
            return requested
        if primaries:
            return primaries.most_common(1)[0][0]
        if len(names) == 1:
            return next(iter(names))
        if not names:
            return None
        raise DatasetError(
            f"rewards {sorted(names)} were seen and none is marked primary "
            f"({sc.SPANMILL_REWARD_PRIMARY}); choose one with --reward"
        )


def read_rewards(table: pa.Table) -> Rewards:
    """Rewards linked to a call by response id, or else to an episode, by the one rule
    of :mod:`spanmill.rewards`.

    ``table`` holds at least :data:`REWARD_COLUMNS`: the spans of the calls' window,
    and those read after it for their rewards. Among rewards of one name for one
    call or episode, the latest span's value counts (feedback given after the agent's
    own reward overrides it).
    """
    rewards = Rewards()
    if table.num_rows == 0 or table["rewards"].null_count == table.num_rows:
        return rewards
    linked = linked_rewards(table)
    columns = {
        name: linked[name].to_pylist()
        for name in ("name", "value", "primary", "scope_name", "call_response_id",
                     "episode_id", "reaches_call")
    }  # fmt: skip
    for name, value, primary, scope, response_id, episode, reaches in zip(
        *columns.values(), strict=True
    ):
        if not math.isfinite(value):
            rewards.not_finite += 1
            continue
        rewards.names_by_episode[episode][name] += 1
        if primary:
            rewards.primary_by_episode[episode][name] += 1
        if response_id is not None:
            rewards.by_response[response_id][name] = value
            rewards.linked_by_episode[episode][name][response_id] = value
        else:
            rewards.by_episode[episode][name] = value
        if scope == sc.FEEDBACK_SCOPE:
            rewards.feedback_reached.append(episode if reaches else None)
    return rewards


# Request attributes a replay of the call needs, by the key they are kept under.
_REQUEST: Final = {
    sc.GEN_AI_REQUEST_STOP_SEQUENCES: "stop",
    sc.GEN_AI_REQUEST_MAX_TOKENS: "max_tokens",
    sc.GEN_AI_TOOL_DEFINITIONS: "tools",
}


def request_of(attributes: str | None) -> str | None:
    """The stop sequences, token limit and tools a call was made with, as JSON; None
    when the record has none of them (a client instrumentation may not record them)."""
    if not attributes:
        return None
    try:
        found = json.loads(attributes)
    except ValueError:
        return None
    request: dict[str, Any] = {}
    for attribute, key in _REQUEST.items():
        value = found.get(attribute) if isinstance(found, dict) else None
        if value is None:
            continue
        if key == "tools" and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                continue
        request[key] = value
    return json.dumps(request, sort_keys=True) if request else None


def _is_training(attributes: str | None) -> bool:
    """Whether a call's attributes mark it as RL rollout traffic (never production data)."""
    if not attributes or sc.SPANMILL_TRAFFIC not in attributes:
        return False
    try:
        found = json.loads(attributes)
    except ValueError:
        return False
    return isinstance(found, dict) and found.get(sc.SPANMILL_TRAFFIC) == sc.TRAFFIC_TRAINING


def one_record_per_call(calls: list[LLMCall]) -> list[LLMCall]:
    """Each call once: a client's record and the gateway's of the same call are one.

    A client instrumentation (OpenLLMetry, OpenInference) records the call the
    agent made and the gateway records the same call as it served it. Records that
    share a response id are one call. So is, within an episode, a record without
    token ids and one with them of the same content (:func:`content_digest`), paired
    one to one in time order: a client that recorded no response id, its trace context
    propagated or the calls joined (:mod:`spanmill.store.links`). The gateway's record
    is kept: it has the token ids, logprobs and model version. Order is kept.
    """
    chosen: dict[str, int] = {}
    for i, call in enumerate(calls):
        if call.response_id is None:
            continue
        held = chosen.get(call.response_id)
        if held is None or (
            calls[held].completion_token_ids is None and call.completion_token_ids is not None
        ):
            chosen[call.response_id] = i
    kept = set(chosen.values())
    once = [c for i, c in enumerate(calls) if c.response_id is None or i in kept]
    # Only episodes holding records both with and without token ids can pair any.
    with_ids = {c.episode_id for c in once if c.completion_token_ids is not None}
    mixed = {c.episode_id for c in once if c.completion_token_ids is None} & with_ids
    if not mixed:
        return once
    recorded: dict[tuple[str, str], int] = defaultdict(int)  # gateway records not yet paired
    digests = [
        content_digest(c.input_messages, c.output_messages) if c.episode_id in mixed else None
        for c in once
    ]
    for call, digest in zip(once, digests, strict=True):
        if digest is not None and call.completion_token_ids is not None:
            recorded[(call.episode_id, digest)] += 1
    out = []
    for call, digest in zip(once, digests, strict=True):
        key = (call.episode_id, digest or "")
        if digest is not None and call.completion_token_ids is None and recorded[key] > 0:
            recorded[key] -= 1  # the gateway's record of this call stands for it
            continue
        out.append(call)
    return out


def _by_episode(table: pa.Table, column: str) -> dict[str, str]:
    """``column``'s value by episode id, from the rows that have one."""
    named = table.filter(pc.is_valid(table[column]))
    return dict(zip(named["episode_id"].to_pylist(), named[column].to_pylist(), strict=True))


def read_llm_calls(table: pa.Table) -> list[LLMCall]:
    """The LLM calls of the table, each once, grouped by episode and numbered in time order."""
    is_llm = pc.is_in(table["operation_name"], value_set=pa.array(sorted(sc.LLM_OPERATIONS)))
    llm = table.filter(pc.fill_null(is_llm, False))
    llm = llm.sort_by([("episode_id", "ascending"), ("start_time", "ascending")])
    columns = {name: llm[name].to_pylist() for name in COLUMNS if name != "rewards"}
    tokens = {
        name: llm[name].to_pylist() if name in llm.column_names else [None] * llm.num_rows
        for name in TOKEN_COLUMNS
    }
    starts = pc.cast(llm["start_time"], pa.int64()).to_pylist()
    # A call without a task id (or an agent) of its own is of its episode's, where an agent
    # said it on the episode's span alone (sdk.episode("support", task_id=...)) and its
    # instrumentation recorded the call knowing nothing of either: the split keeps a task
    # whole, and a dataset of the agent has the agent's calls.
    episode_tasks = _by_episode(table, "task_id")
    episode_agents = _by_episode(table, "agent_name")
    episode_conversations = _by_episode(table, "conversation_id")
    calls = [
        LLMCall(
            trace_id=columns["trace_id"][i],
            span_id=columns["span_id"][i],
            episode_id=columns["episode_id"][i],
            start_ns=starts[i],
            service=columns["service_name"][i],
            agent=columns["agent_name"][i] or episode_agents.get(columns["episode_id"][i]),
            model=columns["model"][i],
            model_version=columns["model_version"][i],
            task_id=columns["task_id"][i] or episode_tasks.get(columns["episode_id"][i]),
            response_id=columns["response_id"][i],
            prompt_name=columns["prompt_name"][i],
            input_messages=columns["input_messages"][i],
            output_messages=columns["output_messages"][i],
            system_instructions=columns["system_instructions"][i],
            input_tokens=columns["input_tokens"][i],
            output_tokens=columns["output_tokens"][i],
            completion_token_ids=columns["completion_token_ids"][i],
            failed=columns["status_code"][i] == "error",
            request=request_of(columns["attributes"][i]),
            prompt_token_ids=tokens["prompt_token_ids"][i],
            completion_logprobs=tokens["completion_logprobs"][i],
            training=_is_training(columns["attributes"][i]),
            conversation_id=columns["conversation_id"][i]
            or episode_conversations.get(columns["episode_id"][i]),
        )
        for i in range(llm.num_rows)
    ]
    calls = one_record_per_call(calls)
    start = 0
    while start < len(calls):
        end = start
        while end < len(calls) and calls[end].episode_id == calls[start].episode_id:
            end += 1
        for index in range(start, end):
            calls[index].index = index - start
            calls[index].calls_in_episode = end - start
        start = end
    return calls
