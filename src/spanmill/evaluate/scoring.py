"""Scored outcomes, one per episode or sample, and their summary: plain data, no models.

Two suites are scored:

``tasks``
    fresh held-out instances of the task, played as whole episodes and judged
    by the task's verifier (its primary reward, and its format reward);
``dataset``
    the dataset's eval split, one reply per sample, compared with the recorded
    completion: the same tool call (same tool, same result or arguments), the
    same number, or the same text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from statistics import fmean
from typing import Any

from spanmill.tasks.base import Message, Task, ToolError, extract_tool_call


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

    @classmethod
    def of(cls, outcomes: Sequence[Outcome]) -> Summary:
        if not outcomes:
            return cls(0, 0.0, 0.0, 0.0, 0.0)
        return cls(
            n=len(outcomes),
            mean_reward=fmean(o.reward for o in outcomes),
            success_rate=fmean(float(o.success) for o in outcomes),
            format_validity=fmean(float(o.format_valid) for o in outcomes),
            tokens_per_answer=fmean(o.tokens_per_reply for o in outcomes),
        )

    def metric(self, name: str) -> float:
        return float(getattr(self, name))


def per_item(outcomes: Sequence[Outcome], metric: str) -> list[float]:
    """The per-item values whose mean is ``metric``."""
    if metric == "success_rate":
        return [float(o.success) for o in outcomes]
    if metric == "mean_reward":
        return [o.reward for o in outcomes]
    if metric == "format_validity":
        return [float(o.format_valid) for o in outcomes]
    raise ValueError(f"no per-item values for {metric!r}")


def score_reply(task: Task, reply: str, reference: str) -> tuple[bool, bool, str]:
    """(match, format_valid, why) of one reply against the recorded completion."""
    wanted = extract_tool_call({"role": "assistant", "content": reference})
    got = extract_tool_call({"role": "assistant", "content": reply})
    if wanted is not None:
        if got is None:
            return False, False, "expected a tool call"
        try:
            result = task.run_tool(got.name, got.arguments)
        except ToolError as exc:
            return False, False, f"the tool refused the call: {exc}"
        if got.name != wanted.name:
            return False, True, f"called {got.name}, expected {wanted.name}"
        if got.arguments == wanted.arguments:
            return True, True, "same call"
        try:
            same = result == task.run_tool(wanted.name, wanted.arguments)
        except ToolError:
            same = False
        return same, True, "same result" if same else "another result"
    if got is not None:
        return False, False, "expected an answer, got a tool call"
    if not reply.strip():
        return False, False, "empty reply"
    number = _number(reference)
    if number is not None:
        same = task.same_answer(reply, reference) is True
        return same, True, "same number" if same else "another number"
    same = reply.strip() == reference.strip()
    return same, True, "same text" if same else "another text"


def _number(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


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
    }
