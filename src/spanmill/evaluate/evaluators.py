"""Evaluators: how a replayed answer is scored, found by name through entry points.

An evaluator sees every replayed item with both models' answers at once, so a
pairwise judge and a pointwise check share one interface. It returns, for each
model, one :class:`ItemScore` per item: metric values in [0, 1] for the metrics
that apply to that item (a tool-call metric does not apply to an item whose
logged answer was prose), and why.

Evaluators are plugins (:mod:`spanmill.plugins`): the ``spanmill.evaluators``
entry-point group maps a name to a factory taking an :class:`EvaluatorContext`.
spanmill registers its own (``tool_calls``, ``reference``, ``judge``) the same way
a team registers one of its own package's, so the pipeline and the CLI choose
them by name alone.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from spanmill import messages as chat
from spanmill.errors import SpanmillError
from spanmill.plugins import Plugins
from spanmill.tasks.base import Task

GROUP = "spanmill.evaluators"
ROLES = ("champion", "challenger")


class EvaluatorError(SpanmillError):
    """An evaluator cannot be found, built or run; the message names it."""


@dataclass(frozen=True)
class ReplayItem:
    """One logged LLM call of a held-out episode, replayed to both models."""

    item_id: str
    prompt: list[dict[str, str]]
    reference: str  # the logged answer, which earned a reward
    reward: float | None = None
    # How the call was made, when its record says: replayed the same way.
    tools: list[dict[str, Any]] | None = None
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None


@dataclass(frozen=True)
class ItemScore:
    """What an evaluator found of one answer: metric -> value in [0, 1], and why."""

    values: dict[str, float]
    explanation: str = ""


@dataclass(frozen=True)
class EvaluatorContext:
    """What an evaluator may need besides the answers: set by the evaluation's settings."""

    judge_url: str | None = None
    judge_model: str | None = None
    judge_api_key: str | None = field(default=None, repr=False)
    judge_timeout_s: float = 120.0
    seed: int = 0
    # The agent's task plugin, when it has one: it knows when two answers are the same.
    task: Task | None = None


# role -> one score per item, in the items' order.
Scored = dict[str, list[ItemScore]]


class Evaluator(Protocol):
    name: str
    # The metrics it can give, the first one the evaluator's headline.
    metrics: tuple[str, ...]

    def score(self, items: Sequence[ReplayItem], answers: Mapping[str, Sequence[str]]) -> Scored:
        """Scores of each role's answers (``answers[role][i]`` answers ``items[i]``)."""
        ...


class PointwiseEvaluator:
    """An evaluator that scores each answer on its own against the item."""

    name = ""
    metrics: tuple[str, ...] = ()

    def __init__(self, context: EvaluatorContext | None = None) -> None:
        self.context = context or EvaluatorContext()

    def score_one(self, item: ReplayItem, answer: str) -> ItemScore:
        raise NotImplementedError

    def score(self, items: Sequence[ReplayItem], answers: Mapping[str, Sequence[str]]) -> Scored:
        return {
            role: [self.score_one(item, answer) for item, answer in zip(items, got, strict=True)]
            for role, got in answers.items()
        }


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: Any


def parse_call(text: str) -> ParsedCall | None:
    """The one tool call a text holds, its arguments as parsed JSON; None when it holds none."""
    calls = chat.parse_tool_calls(text)
    if not calls:
        return None
    function = calls[0]["function"]
    return ParsedCall(function["name"], json.loads(function["arguments"]))


class ToolCallsEvaluator(PointwiseEvaluator):
    """Function-name and name-plus-arguments accuracy against the logged successful call.

    Arguments are compared as parsed JSON, so key order and whitespace never
    count; ``1`` and ``1.0`` are the same number, as JSON has one number type.
    Applies only to items whose logged answer was a tool call that earned a
    reward (when the reward is known).
    """

    name = "tool_calls"
    metrics = ("name_args", "name")

    def score_one(self, item: ReplayItem, answer: str) -> ItemScore:
        wanted = parse_call(item.reference)
        if wanted is None:
            return ItemScore({}, "the logged answer is not a tool call")
        if item.reward is not None and item.reward <= 0:
            return ItemScore({}, "the logged call earned no reward")
        got = parse_call(answer)
        if got is None:
            return ItemScore({"name": 0.0, "name_args": 0.0}, "no tool call")
        if got.name != wanted.name:
            return ItemScore(
                {"name": 0.0, "name_args": 0.0}, f"called {got.name}, expected {wanted.name}"
            )
        same = got.arguments == wanted.arguments
        why = "same call" if same else f"other arguments {json.dumps(got.arguments)[:200]}"
        return ItemScore({"name": 1.0, "name_args": float(same)}, why)


_SPACE = re.compile(r"\s+")
_EDGE_PUNCTUATION = ".,;:!?\"'`"


def normalise(text: str) -> str:
    """Case, Unicode forms, runs of white space and edge punctuation do not count."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return _SPACE.sub(" ", folded).strip().strip(_EDGE_PUNCTUATION).strip()


class ReferenceEvaluator(PointwiseEvaluator):
    """Exact and normalised match against a logged answer that earned a reward.

    Normalised: equal after :func:`normalise`, or the same answer as the agent's
    task plugin reads answers (the calculator: the same number).

    Applies only to items whose logged answer is text (a tool call is the
    tool_calls evaluator's to judge) and whose logged reward was positive, when
    the reward is known.
    """

    name = "reference"
    metrics = ("normalised", "exact")

    def score_one(self, item: ReplayItem, answer: str) -> ItemScore:
        if parse_call(item.reference) is not None:
            return ItemScore({}, "the logged answer is a tool call")
        if item.reward is not None and item.reward <= 0:
            return ItemScore({}, "the logged answer earned no reward")
        exact = answer.strip() == item.reference.strip()
        loose = exact or normalise(answer) == normalise(item.reference)
        if not loose and self.context.task is not None:
            loose = self.context.task.same_answer(answer, item.reference) is True
        why = "exact match" if exact else "normalised match" if loose else "another answer"
        return ItemScore({"exact": float(exact), "normalised": float(loose)}, why)


Factory = Callable[[EvaluatorContext], Evaluator]


def _factory(name: str, loaded: Any) -> Factory:
    if not callable(loaded):
        raise EvaluatorError(f"evaluator {name!r} names {loaded!r}, which cannot be called")
    return loaded


EVALUATORS: Plugins[Factory] = Plugins(GROUP, "evaluator", _factory, EvaluatorError)


def load_evaluator(name: str, context: EvaluatorContext) -> Evaluator:
    """The evaluator registered as ``name``, built for ``context``."""
    try:
        factory = EVALUATORS[name]
    except KeyError:
        raise EvaluatorError(
            f"no evaluator named {name!r} is installed (entry points {GROUP}: "
            f"{EVALUATORS.installed()})"
        ) from None
    try:
        evaluator = factory(context)
    except EvaluatorError:
        raise
    except Exception as exc:
        raise EvaluatorError(
            f"evaluator {name!r} failed to start: {type(exc).__name__}: {exc}"
        ) from exc
    if not getattr(evaluator, "metrics", None):
        raise EvaluatorError(f"evaluator {name!r} declares no metrics")
    return evaluator
