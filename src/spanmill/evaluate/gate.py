"""The promotion gate: a pure decision over two summaries and their difference."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from spanmill.evaluate.scoring import Summary
from spanmill.evaluate.settings import GatePolicy
from spanmill.evaluate.stats import Interval


@dataclass(frozen=True)
class GateDecision:
    """Whether to promote, and every reason that decided it."""

    promote: bool
    reasons: tuple[str, ...]
    metric: str
    difference: float

    @property
    def verdict(self) -> str:
        return "promote" if self.promote else "reject"


def decide(
    challenger: Summary,
    champion: Summary,
    difference: Interval,
    policy: GatePolicy,
    *,
    others: Mapping[str, tuple[Summary, Summary]] | None = None,
) -> GateDecision:
    """Promote only a challenger better by at least the margin and not worse on format.

    A tie is never promoted, whatever the margin: replacing a model in service
    has a cost, and an equal model does not pay for it. ``others``: the other suites'
    (challenger, champion) summaries, by name, whose rates must not fall by more than
    the regression tolerance either (a task suite's gain must not hide a replay's loss).
    """
    # An unresolved "auto" (no evaluators to choose from) is the success rate.
    metric = "success_rate" if policy.metric == "auto" else policy.metric
    delta = challenger.metric(metric) - champion.metric(metric)
    reasons: list[str] = []
    measured = min(challenger.measured(metric), champion.measured(metric))
    if challenger.n == 0 or champion.n == 0:
        reasons.append("nothing was evaluated")
    elif measured < policy.min_items:
        reasons.append(
            f"{metric} was measured on {measured} item{'s' * (measured != 1)}, fewer than the "
            f"{policy.min_items} the gate needs (min_items)"
        )
    elif not math.isfinite(delta):  # a comparison with NaN is false: it would pass below
        reasons.append(
            f"{metric} cannot be compared: {challenger.metric(metric)} against the "
            f"champion's {champion.metric(metric)}"
        )
    elif delta <= 0:
        reasons.append(
            f"{metric} {challenger.metric(metric):.3f} is "
            f"{'equal to' if delta == 0 else 'below'} the champion's {champion.metric(metric):.3f}"
        )
    elif delta < policy.margin:
        reasons.append(
            f"{metric} is better by {delta:.3f}, less than the margin {policy.margin:.3f}"
        )
    reasons.extend(_format_kept(challenger, champion, policy.format_tolerance))
    reasons.extend(_regressions(challenger, champion, metric, policy.regression_tolerance))
    for suite, (its_challenger, its_champion) in sorted((others or {}).items()):
        found = _format_kept(its_challenger, its_champion, policy.format_tolerance)
        found += _regressions(its_challenger, its_champion, "", policy.regression_tolerance)
        reasons.extend(f"{suite}: {reason}" for reason in found)
    if policy.require_significant and not difference.low > 0:
        reasons.append(
            f"the {difference.confidence:.0%} interval of the difference "
            f"[{difference.low:.3f}, {difference.high:.3f}] does not exclude 0"
        )
    if reasons:
        return GateDecision(False, tuple(reasons), metric, delta)
    return GateDecision(
        True,
        (
            f"{metric} better by {delta:.3f} (margin {policy.margin:.3f}), format validity "
            "and the other rates kept",
        ),
        metric,
        delta,
    )


def _format_kept(challenger: Summary, champion: Summary, tolerance: float) -> list[str]:
    """Why the challenger's format validity is below the champion's less the tolerance."""
    if challenger.n == 0 or champion.n == 0:
        return []
    if challenger.format_validity >= champion.format_validity - tolerance:
        return []
    return [
        f"format validity {challenger.format_validity:.3f} is below the champion's "
        f"{champion.format_validity:.3f}"
        + (f" less the tolerance {tolerance:.3f}" if tolerance else "")
    ]


def _regressions(
    challenger: Summary, champion: Summary, metric: str, tolerance: float
) -> list[str]:
    """The rates other than the gate's own that the challenger loses by more than
    ``tolerance``: one metric chosen for the gate (the replay's first evaluator, say)
    must not hide a model that got worse at everything else. Only rates both models
    were scored on count: an evaluator metric applies to the items it applies to."""
    if challenger.n == 0 or champion.n == 0:
        return []
    names = ["success_rate", "mean_reward",
             *sorted(challenger.scores.keys() & champion.scores.keys())]  # fmt: skip
    found = []
    for name in names:
        if name == metric:
            continue
        ours, theirs = challenger.metric(name), champion.metric(name)
        if not math.isfinite(ours) or not math.isfinite(theirs):
            found.append(f"{name} cannot be compared: {ours} against the champion's {theirs}")
        elif ours < theirs - tolerance:
            found.append(
                f"{name} {ours:.3f} is below the champion's {theirs:.3f} "
                f"by more than the tolerance {tolerance:.3f}"
            )
    return found
