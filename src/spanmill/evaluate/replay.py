"""Replay: the dataset's held-out logged calls, answered again by both models, scored.

This is the suite every agent has, with or without a task plugin: the eval split
(episodes never trained on) holds LLM calls as the agent made them and the
answers that earned their reward. Both models answer the same prompts greedily,
with the stop sequences, token limit and tools each call was made with (the
gateway records them); then each evaluator scores both sets of answers at once
(a judge compares them side by side). The outcome of an item records every evaluator metric that
applies to it; its ``success`` is whether the answer matches the logged one (the
same tool call, arguments as parsed JSON, or the same text up to normalisation).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from spanmill.evaluate.evaluators import (
    Evaluator,
    ItemScore,
    ReplayItem,
    normalise,
    parse_call,
)
from spanmill.evaluate.play import BatchGenerator
from spanmill.evaluate.scoring import Outcome
from spanmill.serving.protocol import GenerationParams
from spanmill.train.data import TrainingData

Progress = Callable[[int], None]


def replay_items(data: TrainingData, limit: int) -> list[ReplayItem]:
    """The eval split's calls that earned a reward, at most ``limit``.

    A preference dataset's reference is its chosen answer; sft and rl rows are kept
    only when their reward is positive (or not recorded): the others are not
    answers to match.
    """
    if data.eval is None or limit == 0:
        return []
    target = "chosen" if data.mode == "preference" else "completion"
    rows = (data.eval.full if data.eval.full is not None else data.eval.table).to_pylist()
    if data.mode != "preference":
        rows = [row for row in rows if row.get("reward") is None or row["reward"] > 0]
    items = []
    for i, row in enumerate(rows[:limit]):
        reward = row.get("reward")
        request = json.loads(row.get("request") or "{}")
        max_tokens = request.get("max_tokens")
        items.append(
            ReplayItem(
                item_id=str(row.get("sample_id") or f"eval-{i}"),
                prompt=list(row["prompt"]),
                reference=str(row[target][-1]["content"]),
                reward=float(reward) if reward is not None else None,
                tools=request.get("tools") or None,
                stop=tuple(request.get("stop") or ()),
                max_tokens=int(max_tokens) if isinstance(max_tokens, int | float) else None,
            )
        )
    return items


def answer(
    generator: BatchGenerator,
    items: Sequence[ReplayItem],
    *,
    max_new_tokens: int,
    batch_size: int,
    progress: Progress | None = None,
) -> tuple[list[str], list[int]]:
    """Each item's answer text and token count: greedy, with the stop sequences, token limit
    (at most ``max_new_tokens``) and tools its call was made with."""
    texts: list[str] = [""] * len(items)
    tokens: list[int] = [0] * len(items)
    for start in range(0, len(items), batch_size):
        batch = range(start, min(start + batch_size, len(items)))
        # A batch shares its parameters: calls made alike are sent together.
        alike: dict[str, list[int]] = defaultdict(list)
        for i in batch:
            alike[_request_key(items[i])].append(i)
        for indices in alike.values():
            first = items[indices[0]]
            params = GenerationParams(
                max_tokens=min(first.max_tokens or max_new_tokens, max_new_tokens),
                stop=first.stop,
            )
            results = generator.generate_batch(
                [items[i].prompt for i in indices], params, first.tools
            )
            for i, result in zip(indices, results, strict=True):
                choice = result.choices[0]
                texts[i] = choice.text
                tokens[i] = len(choice.token_ids)
        if progress is not None:
            progress(len(batch))
    return texts, tokens


def _request_key(item: ReplayItem) -> str:
    return json.dumps([item.stop, item.max_tokens, item.tools], sort_keys=True)


def matches(item: ReplayItem, text: str) -> tuple[bool, bool]:
    """(format valid, matches the logged answer): a tool call where one was logged, else text."""
    wanted = parse_call(item.reference)
    got = parse_call(text)
    if wanted is not None:
        return got is not None, got == wanted
    if got is not None or not text.strip():
        return False, False
    return True, normalise(text) == normalise(item.reference)


def score(
    items: Sequence[ReplayItem],
    answers: Mapping[str, Sequence[str]],
    tokens: Mapping[str, Sequence[int]],
    evaluators: Sequence[Evaluator],
) -> dict[str, list[Outcome]]:
    """Every role's outcomes, with each evaluator's metrics for the items they apply to."""
    per_evaluator: list[tuple[str, dict[str, list[ItemScore]]]] = [
        (evaluator.name, evaluator.score(items, answers)) for evaluator in evaluators
    ]
    outcomes: dict[str, list[Outcome]] = {}
    for role, texts in answers.items():
        outcomes[role] = []
        for i, (item, text) in enumerate(zip(items, texts, strict=True)):
            valid, same = matches(item, text)
            scores: dict[str, float] = {}
            why: list[str] = []
            for name, scored in per_evaluator:
                found = scored[role][i]
                scores.update({f"{name}.{metric}": v for metric, v in found.values.items()})
                if found.values and found.explanation:
                    why.append(f"{name}: {found.explanation}")
            outcomes[role].append(
                Outcome(
                    item_id=item.item_id,
                    reward=float(same),
                    success=same,
                    format_valid=valid,
                    tokens=tokens[role][i],
                    replies=1,
                    explanation="; ".join(why),
                    transcript=[
                        item.prompt[-1],
                        {"role": "assistant", "content": text},
                        {"role": "reference", "content": item.reference},
                    ],
                    scores=scores,
                )
            )
    return outcomes
