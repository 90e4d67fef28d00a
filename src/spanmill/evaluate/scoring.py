"""Scored outcomes, one per episode or replayed call, and their summary: plain data, no models.

An outcome has the rates every suite shares (reward, success, format validity,
tokens) and, for replayed calls, the metrics of each evaluator that applies to
it (:mod:`spanmill.evaluate.evaluators`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from spanmill.tasks.base import Message


@dataclass(frozen=True)
class Outcome:
    """One scored episode or sample."""

    item_id: str
    reward: float
    success: bool
    format_valid: bool
    tokens: int
    replies: int
    explanation: str = ""
    transcript: list[Message] = field(default_factory=list)
    # Evaluator metrics that apply to this item: "<evaluator>.<metric>" -> [0, 1].
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_reply(self) -> float:
        return self.tokens / self.replies if self.replies else 0.0


@dataclass(frozen=True)
class Summary:
    """The rates of one model on one suite."""

    n: int
    mean_reward: float
    success_rate: float
    format_validity: float
    tokens_per_answer: float
    # Each evaluator metric's mean over the items it applies to, and how many those are.
    scores: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, outcomes: Sequence[Outcome]) -> Summary:
        if not outcomes:
            return cls(0, 0.0, 0.0, 0.0, 0.0)
        names = sorted({name for o in outcomes for name in o.scores})
        values = {name: per_item(outcomes, name) for name in names}
        return cls(
            n=len(outcomes),
            mean_reward=fmean(o.reward for o in outcomes),
            success_rate=fmean(float(o.success) for o in outcomes),
            format_validity=fmean(float(o.format_valid) for o in outcomes),
            tokens_per_answer=fmean(o.tokens_per_reply for o in outcomes),
            scores={name: fmean(items) for name, items in values.items()},
            counts={name: len(items) for name, items in values.items()},
        )

    def metric(self, name: str) -> float:
        if name in RATES:
            return float(getattr(self, name))
        return self.scores.get(name, 0.0)

    def measured(self, name: str) -> int:
        """How many items ``name`` was measured on (a rate: every item; a score given
        without its count: every item, as a summary made by hand says)."""
        if name in RATES:
            return self.n
        return self.counts.get(name, self.n if name in self.scores else 0)


# The rates every suite has; evaluator metrics are named "<evaluator>.<metric>".
RATES = ("success_rate", "mean_reward", "format_validity")


def per_item(outcomes: Sequence[Outcome], metric: str) -> list[float]:
    """The per-item values whose mean is ``metric``."""
    if metric == "success_rate":
        return [float(o.success) for o in outcomes]
    if metric == "mean_reward":
        return [o.reward for o in outcomes]
    if metric == "format_validity":
        return [float(o.format_valid) for o in outcomes]
    if "." in metric:
        return [o.scores[metric] for o in outcomes if metric in o.scores]
    raise ValueError(f"no per-item values for {metric!r}")


def format_score_of(rewards: dict[str, float], primary: str, wanted: str | None) -> float:
    """The verdict's format reward: ``wanted``, else its first other reward, else 1."""
    if wanted is not None:
        return rewards.get(wanted, 0.0)
    others = [value for name, value in rewards.items() if name != primary]
    return others[0] if others else 1.0


def as_jsonable(outcome: Outcome, suite: str, role: str) -> dict[str, Any]:
    return {
        "suite": suite,
        "model": role,
        "item": outcome.item_id,
        "reward": outcome.reward,
        "success": outcome.success,
        "format_valid": outcome.format_valid,
        "tokens": outcome.tokens,
        "replies": outcome.replies,
        "explanation": outcome.explanation,
        "transcript": outcome.transcript,
        "scores": outcome.scores,
    }
