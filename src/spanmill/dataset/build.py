"""Building a dataset: spans in, train and eval rows plus a card out. Pure.

Steps, each counted in the card: LLM calls in the window; those matching the
service/agent/model filters; those with a completion; with a reward; within the
length limit; after deduplication; then the mode's own step (threshold or
weights, pairing, or grouping); then the split by a hash of the task id, so one
task never lands in both splits; then held-out rows whose prompt a training row holds
leave the held-out split (``eval_prompts_in_train``).

Two windows: calls are taken from ``[since, until)``, rewards from
``[since, until + feedback_horizon_hours)``, because feedback on a call may come
hours or days after it. The card counts what became of the feedback read: joined
to a call of the window, joined to a call after it (its own build will take it),
or unmatched (its ids name no call read; it stays in the store).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spanmill.dataset import credit
from spanmill.dataset.episodes import (
    REWARD_COLUMNS,
    DatasetError,
    LLMCall,
    Rewards,
    read_llm_calls,
    read_rewards,
)
from spanmill.dataset.samples import Sample, digest, make_sample
from spanmill.dataset.spec import DatasetSpec
from spanmill.producers import Trust, producer_of
from spanmill.store.reader import to_unix_nanos

Window = tuple[int | None, int | None]
_HOUR_NS = 3600 * 10**9

Progress = Callable[[str], None]


@dataclass
class Built:
    spec: DatasetSpec
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    counts: OrderedDict[str, int] = field(default_factory=OrderedDict)
    reward_name: str | None = None
    rewards: list[float] = field(default_factory=list)
    # First and last span start of the calls' window.
    span_window: Window = (None, None)
    # The rewards' window as asked of the store, and the last span start read in it.
    reward_window: Window = (None, None)
    last_reward_span: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def content_hash(self) -> str:
        digest = hashlib.sha256()
        for split, rows in (("train", self.train), ("eval", self.eval)):
            for row in rows:
                digest.update(split.encode())
                digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode())
        return digest.hexdigest()


def split_of(group: str, eval_fraction: float, seed: int = 0) -> str:
    """'eval' or 'train' for a task (or episode) id: a stable hash, never random."""
    if eval_fraction <= 0:
        return "train"
    digest = hashlib.sha256(f"{seed}:{group}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction else "train"


def _unseen(
    evaluation: list[dict[str, Any]], train: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], int]:
    """The held-out rows whose prompt no training row holds, and how many did. One
    question asked in several tasks, or by several users, landed in both splits, and
    held-out success measured recall of a training answer. Such rows leave the
    held-out split rather than join their groups' splits: a prompt every conversation
    opens with would have drawn every conversation into one split."""
    trained = {digest(row["prompt"]) for row in train}
    unseen = [row for row in evaluation if digest(row["prompt"]) not in trained]
    return unseen, len(evaluation) - len(unseen)


def _group(sample: Sample) -> str:
    return sample.call.task_id or sample.call.episode_id


def _kept_whole(sample: Sample) -> str:
    """What an SFT sample's split keeps whole: its conversation (a later turn's prompt
    holds the earlier turns' prompts and answers: split apart, an eval prompt held a
    train completion verbatim), else its task, else its episode."""
    conversation = sample.call.conversation_id
    return f"conversation:{conversation}" if conversation else _group(sample)


def _keep(spec: DatasetSpec, call: LLMCall) -> bool:
    return (
        not call.training  # RL rollouts are the trainer's, never production data
        and (spec.service is None or call.service == spec.service)
        and (spec.agent is None or call.agent == spec.agent)
        and (spec.model is None or call.model == spec.model)
        and (spec.model_version is None or call.model_version == spec.model_version)
    )


def call_window(spec: DatasetSpec) -> Window:
    """The window LLM calls are taken from, in nanoseconds: ``[since, until)``."""
    return (
        to_unix_nanos(spec.since) if spec.since is not None else None,
        to_unix_nanos(spec.until) if spec.until is not None else None,
    )


def reward_window(spec: DatasetSpec) -> Window:
    """The window rewards are read from: the calls', its end moved by the horizon."""
    since, until = call_window(spec)
    if until is None:
        return since, None
    return since, until + round(spec.feedback_horizon_hours * _HOUR_NS)


def _within(spans: pa.Table, window: Window) -> pa.Table:
    """The rows of ``spans`` (sorted by start time) that start inside ``window``."""
    since, until = window
    if since is None and until is None:
        return spans
    starts = pc.cast(spans["start_time"], pa.int64())
    inside = pc.and_(
        pc.greater_equal(starts, since if since is not None else -(2**63)),
        pc.less(starts, until if until is not None else 2**63 - 1),
    )
    return spans.filter(inside)


def _feedback_counts(rewards: Rewards, calls: list[LLMCall], counts: OrderedDict[str, int]) -> None:
    """What became of the feedback read: joined to this window's calls, to later ones, none."""
    episodes = {c.episode_id for c in calls}
    reached = rewards.feedback_reached
    counts["feedback"] = len(reached)
    counts["feedback_joined"] = sum(1 for e in reached if e is not None and e in episodes)
    counts["feedback_later_calls"] = sum(1 for e in reached if e is not None and e not in episodes)
    counts["feedback_unmatched"] = sum(1 for e in reached if e is None)
    counts["rewards_not_finite"] = rewards.not_finite


def _starts(table: pa.Table) -> Window:
    if table.num_rows == 0:
        return None, None
    starts = pc.cast(table["start_time"], pa.int64())
    return pc.min(starts).as_py(), pc.max(starts).as_py()


def build(
    spec: DatasetSpec,
    spans: pa.Table,
    progress: Progress | None = None,
    *,
    late: pa.Table | None = None,
) -> Built:
    """Samples of ``spec.mode`` from a table of stored spans (the store's schema).

    Calls come from the rows of ``spans`` inside the spec's window; rewards from
    every row of ``spans`` and of ``late``: spans after the window, read for their
    rewards only (:data:`~spanmill.dataset.episodes.REWARD_COLUMNS` suffice).
    """
    report = progress or (lambda _: None)
    counts: OrderedDict[str, int] = OrderedDict()
    trust = Trust(spec.trusted_producers)
    in_window = _within(spans, call_window(spec))
    counts["spans"] = in_window.num_rows
    # Untrusted producers' spans are stored, counted here, and read no further.
    untrusted = _untrusted(in_window, trust)
    in_window = in_window.filter(trust.mask(in_window["resource_attributes"]))
    spans = spans.filter(trust.mask(spans["resource_attributes"]))
    if late is not None and late.num_rows:
        untrusted.update(_untrusted(late, trust))
        late = late.filter(trust.mask(late["resource_attributes"]))
    counts["untrusted_spans"] = sum(untrusted.values())
    report("finding LLM calls")
    calls = read_llm_calls(in_window)
    counts["llm_calls"] = len(calls)
    counts["training_traffic"] = sum(call.training for call in calls)
    report("collecting rewards")
    reward_spans = spans.select(list(REWARD_COLUMNS))
    if late is not None and late.num_rows:
        reward_spans = pa.concat_tables([reward_spans, late.select(list(REWARD_COLUMNS))])
    counts["reward_window_spans"] = reward_spans.num_rows
    rewards = read_rewards(reward_spans)
    counts["episodes"] = len({c.episode_id for c in calls})
    _feedback_counts(rewards, calls, counts)
    kept = [call for call in calls if _keep(spec, call)]
    # Chosen among the kept calls' rewards: in a window shared with other agents, a
    # busier agent's primary reward was this one's, and its own went unread.
    name = rewards.primary(spec.reward, {call.episode_id for call in kept})

    report("making samples")
    samples: list[Sample] = []
    matched = with_completion = 0
    refused: dict[str, int] = {
        "undecodable_messages": 0,
        "invalid_tool_arguments": 0,
        "cut_short": 0,
        "unsupported_parts": 0,
    }
    for call in kept:
        matched += 1
        value = credit.assign(call, rewards, name, spec.credit, spec.discount) if name else None
        sample = make_sample(call, value, drop_examples=spec.drop_examples, refused=refused)
        if sample is None:
            continue
        with_completion += 1
        if sample.reward is not None:
            samples.append(sample)
    counts["matching_filters"] = matched
    counts.update(refused)
    counts["with_completion"] = with_completion
    counts["with_reward"] = len(samples)

    if spec.max_tokens is not None:
        samples = [s for s in samples if s.tokens <= spec.max_tokens]
    counts["within_max_tokens"] = len(samples)
    if spec.dedupe:
        samples, counts["duplicates_rewarded_apart"] = _deduplicated(samples)
    counts["deduplicated"] = len(samples)

    report(f"building {spec.mode} rows")
    if spec.mode == "sft":
        rows = _sft(spec, samples, counts)
    elif spec.mode == "preference":
        rows = _preference(spec, samples, counts)
    else:
        rows = _rl(samples, counts)

    train: list[dict[str, Any]] = []
    evaluation: list[dict[str, Any]] = []
    for group, row in rows:
        (evaluation if split_of(group, spec.eval_fraction, spec.seed) == "eval" else train).append(
            row
        )
    evaluation, counts["eval_prompts_in_train"] = _unseen(evaluation, train)
    train.sort(key=lambda r: r["sample_id"])
    evaluation.sort(key=lambda r: r["sample_id"])
    counts["train"] = len(train)
    counts["eval"] = len(evaluation)
    return Built(
        spec=spec,
        train=train,
        eval=evaluation,
        counts=counts,
        reward_name=name,
        rewards=[s.reward for s in samples if s.reward is not None],
        span_window=_starts(in_window),
        reward_window=reward_window(spec),
        last_reward_span=_starts(reward_spans)[1],
        details={
            "model_versions": _tally(s.call.model_version for s in samples),
            "prompt_names": _tally(s.call.prompt_name for s in samples),
            "trusted_producers": str(trust),
            "untrusted_producers": dict(sorted(untrusted.items())),
        },
    )


def _deduplicated(samples: list[Sample]) -> tuple[list[Sample], int]:
    """One sample of each (prompt, completion), in the order first seen, whose reward is
    the mean of its copies'; and how many were rewarded apart. The first copy's reward
    alone decided before: a passing copy could be dropped for a failing one (then
    filtered out by min_reward), and a preference pair never made."""
    copies: dict[str, list[Sample]] = {}
    for sample in samples:
        copies.setdefault(sample.key, []).append(sample)
    unique, apart = [], 0
    for group in copies.values():
        first = group[0]
        rewards = [s.reward for s in group if s.reward is not None]
        if len(set(rewards)) > 1:
            apart += 1
            first = dataclasses.replace(first, reward=statistics.fmean(rewards))
        unique.append(first)
    return unique, apart


def _untrusted(table: pa.Table, trust: Trust) -> Counter[str]:
    """The spans of ``table`` that ``trust`` leaves out, by producer."""
    left_out = table.filter(pc.invert(trust.mask(table["resource_attributes"])))
    if left_out.num_rows == 0:
        return Counter()
    column = left_out["resource_attributes"]
    if pa.types.is_dictionary(column.type):
        column = pc.cast(column, pa.string())
    found = pc.value_counts(column).to_pylist()
    tally: Counter[str] = Counter()
    for entry in found:
        tally[producer_of(entry["values"])] += entry["counts"]
    return tally


def _tally(values: Iterable[str | None]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for value in values:
        counts[value or "(none)"] += 1
    return dict(sorted(counts.items()))


def _sft(
    spec: DatasetSpec, samples: list[Sample], counts: OrderedDict[str, int]
) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    for s in samples:
        reward = float(s.reward)  # type: ignore[arg-type]
        if spec.min_reward is not None and reward < spec.min_reward:
            continue
        if spec.max_reward is not None and reward > spec.max_reward:
            continue
        weight = 1.0 if spec.sft_weighting == "uniform" else max(reward, 0.0)
        if weight <= 0:
            continue
        row = {"prompt": s.prompt, "completion": s.completion, "weight": weight,
               "reward": reward, **s.lineage()}  # fmt: skip
        rows.append((_kept_whole(s), row))
    counts["sft_kept"] = len(rows)
    return rows


def _preference(
    spec: DatasetSpec, samples: list[Sample], counts: OrderedDict[str, int]
) -> list[tuple[str, dict[str, Any]]]:
    """Pairs of attempts at one task from the same prompt: best against worst."""
    groups: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    for s in samples:
        if s.call.task_id:
            groups[(s.call.task_id, s.prompt_key)].append(s)
    rows = []
    for (task_id, _), attempts in sorted(groups.items()):
        ordered = sorted(attempts, key=lambda s: (-(s.reward or 0.0), s.call.span_id))
        best, worst = ordered[0], ordered[-1]
        if (best.reward or 0.0) - (worst.reward or 0.0) < max(spec.min_reward_gap, 1e-12):
            continue
        row = {
            "prompt": best.prompt,
            "chosen": best.completion,
            "rejected": worst.completion,
            "chosen_reward": float(best.reward or 0.0),
            "rejected_reward": float(worst.reward or 0.0),
            **best.lineage(),
        }
        row["sample_id"] = f"{best.call.span_id}:{worst.call.span_id}"
        rows.append((task_id, row))
    counts["task_groups"] = len(groups)
    counts["pairs"] = len(rows)
    return rows


def _rl(samples: list[Sample], counts: OrderedDict[str, int]) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    for s in samples:
        group = _group(s)
        row = {"prompt": s.prompt, "completion": s.completion, "reward": float(s.reward or 0.0),
               "group_id": group, **s.lineage()}  # fmt: skip
        rows.append((group, row))
    counts["rl_samples"] = len(rows)
    counts["groups"] = len({g for g, _ in rows})
    return rows


def histogram(values: list[float], bins: int = 10) -> list[dict[str, float]]:
    """Equal-width bins over the values' range (one bin when they are all equal)."""
    if not values:
        return []
    low, high = min(values), max(values)
    if math.isclose(low, high):
        return [{"low": low, "high": high, "count": len(values)}]
    width = (high - low) / bins
    counts = [0] * bins
    for value in values:
        counts[min(int((value - low) / width), bins - 1)] += 1
    return [
        {"low": low + i * width, "high": low + (i + 1) * width, "count": c}
        for i, c in enumerate(counts)
    ]


def check_trainable(built: Built) -> None:
    """Raises DatasetError, saying what each step kept, when the dataset holds fewer
    training rows than its spec's ``min_train_rows`` (one by default)."""
    least = built.spec.min_train_rows
    if len(built.train) < least:
        steps = ", ".join(f"{k}={v}" for k, v in built.counts.items())
        hint = "widen the window or loosen the filters"
        if built.counts.get("untrusted_spans"):
            producers = ", ".join(built.details["untrusted_producers"])
            hint += (
                f"; {built.counts['untrusted_spans']} spans from untrusted producers "
                f"({producers}) were left out: give their writers keys, or name the producers "
                "to trust (trusted_producers, '*' for every span)"
            )
        rows = (f"{len(built.train)} training rows, fewer than min_train_rows {least}"
                if built.train else "no training rows")  # fmt: skip
        raise DatasetError(f"the {built.spec.mode} dataset has {rows} ({steps}); {hint}")
