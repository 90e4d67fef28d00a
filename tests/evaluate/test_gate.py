"""The gate and the statistics it reads: pure functions over plain numbers."""

from __future__ import annotations

import pytest

from spanmill.evaluate import GatePolicy, Interval, Summary, bootstrap_difference, decide
from spanmill.evaluate.scoring import Outcome, per_item


def summary(success: float, valid: float = 1.0, n: int = 100) -> Summary:
    return Summary(
        n=n, mean_reward=success, success_rate=success, format_validity=valid, tokens_per_answer=12
    )


def interval(estimate: float, low: float | None = None, high: float | None = None) -> Interval:
    return Interval(estimate, estimate - 0.1 if low is None else low, high or estimate + 0.1, 0.95)


POLICY = GatePolicy(margin=0.05)


def test_a_worse_challenger_is_rejected() -> None:
    decision = decide(summary(0.40), summary(0.55), interval(-0.15), POLICY)
    assert not decision.promote
    assert decision.verdict == "reject"
    assert "below the champion's 0.550" in decision.reasons[0]


def test_a_better_challenger_is_accepted() -> None:
    decision = decide(summary(0.62), summary(0.30), interval(0.32), POLICY)
    assert decision.promote
    assert decision.difference == pytest.approx(0.32)
    assert "better by 0.320" in decision.reasons[0]


@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_a_tie_is_rejected_whatever_the_margin(margin: float) -> None:
    decision = decide(summary(0.5), summary(0.5), interval(0.0), GatePolicy(margin=margin))
    assert not decision.promote
    assert "equal to the champion's" in decision.reasons[0]


def test_better_by_less_than_the_margin_is_rejected() -> None:
    decision = decide(summary(0.53), summary(0.50), interval(0.03), POLICY)
    assert not decision.promote
    assert "less than the margin 0.050" in decision.reasons[0]


def test_a_better_challenger_that_breaks_the_format_is_rejected() -> None:
    decision = decide(summary(0.7, valid=0.90), summary(0.3, valid=0.99), interval(0.4), POLICY)
    assert not decision.promote
    assert "format validity 0.900 is below the champion's 0.990" in decision.reasons[0]
    tolerant = POLICY.model_copy(update={"format_tolerance": 0.1})
    assert decide(summary(0.7, 0.90), summary(0.3, 0.99), interval(0.4), tolerant).promote


def test_significance_can_be_required() -> None:
    strict = POLICY.model_copy(update={"require_significant": True})
    assert not decide(summary(0.6), summary(0.5), interval(0.1, low=-0.02), strict).promote
    assert decide(summary(0.6), summary(0.5), interval(0.1, low=0.01), strict).promote


@pytest.mark.parametrize("score", [float("nan"), float("inf")])
def test_a_score_that_is_not_a_number_is_never_promoted(score: float) -> None:
    decision = decide(summary(score), summary(0.30), interval(0.32), POLICY)
    assert not decision.promote
    assert "cannot be compared" in decision.reasons[0]


def test_better_on_the_gate_metric_and_worse_past_the_tolerance_on_another_is_rejected() -> None:
    """The replay's "auto" metric is the first evaluator's (tool calls, on the items that
    have them): a challenger that gained there and lost its prose answers must not pass."""

    def scored(name_args: float, reference: float, success: float = 0.5) -> Summary:
        return Summary(
            n=100, mean_reward=success, success_rate=success, format_validity=1.0,
            tokens_per_answer=12,
            scores={"tool_calls.name_args": name_args, "reference.normalised": reference},
        )  # fmt: skip

    policy = GatePolicy(margin=0.05, metric="tool_calls.name_args")
    decision = decide(scored(0.90, 0.10), scored(0.80, 0.90), interval(0.1), policy)
    assert not decision.promote
    assert decision.reasons == (
        "reference.normalised 0.100 is below the champion's 0.900 by more than the tolerance 0.100",
    )
    # Within the tolerance, or better: promoted.
    assert decide(scored(0.90, 0.85), scored(0.80, 0.90), interval(0.1), policy).promote
    # The success rate is one of the rates kept.
    worse = decide(scored(0.90, 0.90, success=0.2), scored(0.80, 0.90), interval(0.1), policy)
    assert not worse.promote and worse.reasons[0].startswith("success_rate 0.200 is below")
    # A metric only one of them was scored on is nothing to compare.
    alone = scored(0.90, 0.90)
    alone.scores["judge.score"] = 0.0
    assert decide(alone, scored(0.80, 0.90), interval(0.1), policy).promote
    # A tolerance of 1 lets any drop of the other rates through (not one that is no number).
    lenient = policy.model_copy(update={"regression_tolerance": 1.0})
    assert decide(scored(0.90, 0.10), scored(0.80, 0.90), interval(0.1), lenient).promote


def test_nothing_evaluated_is_never_promoted() -> None:
    assert not decide(summary(0.0, n=0), summary(0.0, n=0), interval(0.0), POLICY).promote


def test_the_bootstrap_interval_brackets_the_paired_difference() -> None:
    champion = [1.0] * 30 + [0.0] * 70
    challenger = [1.0] * 30 + [1.0] * 30 + [0.0] * 40
    result = bootstrap_difference(challenger, champion, resamples=2000, seed=3)
    assert result.estimate == pytest.approx(0.30)
    assert 0.18 < result.low < 0.30 < result.high < 0.42
    assert result.excludes_zero
    assert result == bootstrap_difference(challenger, champion, resamples=2000, seed=3)

    same = bootstrap_difference(champion, champion)
    assert (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="differ in length"):
        bootstrap_difference([1.0], [1.0, 0.0])


def test_summaries_and_per_item_values_agree() -> None:
    outcomes = [
        Outcome("a", 1.0, True, True, tokens=20, replies=2),
        Outcome("b", 0.0, False, False, tokens=48, replies=1),
    ]
    s = Summary.of(outcomes)
    assert (s.n, s.success_rate, s.format_validity, s.tokens_per_answer) == (2, 0.5, 0.5, 29.0)
    assert per_item(outcomes, "success_rate") == [1.0, 0.0]
    assert Summary.of([]).n == 0


def test_evaluator_metrics_are_averaged_over_the_items_they_apply_to() -> None:
    outcomes = [
        Outcome("a", 1.0, True, True, 5, 1, scores={"tool_calls.name": 1.0, "judge.preference": 1}),
        Outcome("b", 0.0, False, True, 5, 1, scores={"judge.preference": 0.5}),
        Outcome(
            "c", 0.0, False, True, 5, 1, scores={"tool_calls.name": 0.0, "judge.preference": 0}
        ),
    ]
    s = Summary.of(outcomes)
    assert s.scores == {"tool_calls.name": 0.5, "judge.preference": 0.5}
    assert s.metric("tool_calls.name") == 0.5 and s.metric("success_rate") == 1 / 3
    assert per_item(outcomes, "tool_calls.name") == [1.0, 0.0]
    champion = summary(0.0)
    champion.scores["tool_calls.name"] = 0.0
    policy = GatePolicy(metric="tool_calls.name", min_items=2)
    decision = decide(s, champion, interval(0.5), policy)
    assert decision.promote and decision.metric == "tool_calls.name"
    assert s.measured("tool_calls.name") == 2 and s.measured("success_rate") == 3


def test_the_gate_metric_is_checked_when_the_policy_is_made() -> None:
    with pytest.raises(ValueError, match="metric"):
        GatePolicy(metric="no such metric")


def test_a_metric_measured_on_a_few_items_never_decides() -> None:
    """One tool-call item among forty prose ones: a challenger right on it and worse
    elsewhere must not pass on it. ``auto`` takes a metric only where it scores at least
    half the items, and the gate refuses one measured on fewer than min_items."""
    from types import SimpleNamespace

    from spanmill.evaluate.run import _metric

    def outcomes(right_on_the_call: bool, prose: float) -> list[Outcome]:
        scores = {"tool_calls.name_args": float(right_on_the_call), "reference.normalised": 0.5}
        items = [Outcome("call", 0.0, False, True, 5, 1, scores=scores)]
        for i in range(39):
            items.append(Outcome(f"p{i}", 0.0, False, True, 5, 1,
                                 scores={"reference.normalised": prose}))  # fmt: skip
        return items

    replay = {
        "challenger": {"replay": outcomes(True, 0.80)},
        "champion": {"replay": outcomes(False, 0.90)},
    }
    evaluators = [SimpleNamespace(name="tool_calls", metrics=["name_args"]),
                  SimpleNamespace(name="reference", metrics=["normalised"])]  # fmt: skip
    policy = _metric(GatePolicy(suite="replay"), evaluators, replay)  # type: ignore[arg-type]
    assert policy.metric == "reference.normalised"
    challenger, champion = (Summary.of(replay[side]["replay"]) for side in replay)
    assert not decide(challenger, champion, interval(-0.1), policy).promote
    # Asked for by name, the metric of one item is still refused.
    by_name = GatePolicy(suite="replay", metric="tool_calls.name_args")
    refused = decide(challenger, champion, interval(1.0), by_name)
    assert not refused.promote
    assert refused.reasons[0] == (
        "tool_calls.name_args was measured on 1 item, fewer than the 5 the gate needs (min_items)"
    )
    # A one-item evaluation is refused whatever its metric.
    one = decide(summary(1.0, n=1), summary(0.0, n=1), interval(1.0), POLICY)
    assert not one.promote and "measured on 1 item" in one.reasons[0]


def test_another_suites_loss_is_a_regression_too() -> None:
    """The tasks suite decides, better by 0.1; the replay's tool calls fell from 0.9 to
    0.2: refused, naming the suite."""
    tasks = (summary(0.6), summary(0.5))
    replay = (summary(0.5), summary(0.5))
    for side, value in zip(replay, (0.2, 0.9), strict=True):
        side.scores["tool_calls.name_args"] = value
    decision = decide(*tasks, interval(0.1), POLICY, others={"replay": replay})
    assert not decision.promote
    assert decision.reasons == (
        "replay: tool_calls.name_args 0.200 is below the champion's 0.900 by more than the "
        "tolerance 0.100",
    )
    kept = (summary(0.5), summary(0.5))
    assert decide(*tasks, interval(0.1), POLICY, others={"replay": kept}).promote


def test_another_suites_format_validity_and_mean_reward_must_hold_too() -> None:
    """The other suite was checked for its success rate and evaluator scores alone: its
    format validity falling from 1.0 to 0.1, or its mean reward from 0.8 to 0.2, passed
    under a reason that said "format validity and the other rates kept"."""
    replay = (summary(0.6), summary(0.5))
    broken = (summary(0.5, valid=0.1), summary(0.5, valid=1.0))
    decision = decide(*replay, interval(0.1), POLICY, others={"tasks": broken})
    assert not decision.promote
    assert decision.reasons == ("tasks: format validity 0.100 is below the champion's 1.000",)
    from dataclasses import replace

    poorer, richer = replace(summary(0.5), mean_reward=0.2), replace(summary(0.5), mean_reward=0.8)
    rewarded = decide(*replay, interval(0.1), POLICY, others={"tasks": (poorer, richer)})
    assert not rewarded.promote
    assert "tasks: mean_reward 0.200 is below the champion's 0.800" in rewarded.reasons[0]


def test_fewer_fresh_instances_than_asked_are_said(caplog: pytest.LogCaptureFixture) -> None:
    """A task whose held-out instances are mostly among the training ids gives fewer than
    asked: the evaluation goes on with them, and says so."""
    from types import SimpleNamespace

    from spanmill.evaluate.run import fresh_instances

    def instances(split: str, n: int, seed: int) -> list[object]:
        return [SimpleNamespace(id=f"q{i}") for i in range(min(n, 6))]  # six at most

    task = SimpleNamespace(name="calculator", instances=instances)
    with caplog.at_level("WARNING", logger="spanmill.evaluate.run"):
        got = fresh_instances(task, 4, 0, frozenset({"q0", "q1", "q2"}))  # type: ignore[arg-type]
    assert len(got) == 3 and {i.id for i in got} == {"q3", "q4", "q5"}
    assert "gave 3 held-out instances not seen in training, of 4 asked" in caplog.text


def test_a_report_flattens_what_summaries_hold() -> None:
    """The report's metrics are numbers: each rate and evaluator metric, not the counts of
    items each metric was measured on (kept in the report's suites)."""
    from spanmill.evaluate.comparison import Comparison, ModelRef, SuiteResult

    scored = [Outcome(f"i{i}", 1.0, True, True, 5, 1, scores={"tool_calls.name": 1.0})
              for i in range(6)]  # fmt: skip
    summary_ = Summary.of(scored)
    suite = SuiteResult("replay", summary_, summary_, interval(0.0))
    decision = decide(summary_, summary_, interval(0.0), POLICY)
    report = Comparison(task="calc", models={"champion": ModelRef("champion", "b")},
                        suites={"replay": suite}, policy=POLICY, decision=decision)  # fmt: skip
    metrics = report.metrics()
    assert metrics["replay.challenger.tool_calls.name"] == 1.0
    assert metrics["replay.challenger.n"] == 6.0
    assert not [k for k in metrics if "counts" in k]
    assert report.report().to_json()["suites"]["replay"]["challenger"]["counts"] == {
        "tool_calls.name": 6
    }


def test_an_evaluator_metric_is_compared_on_the_items_it_scored_for_both() -> None:
    """A plugin evaluator that finds nothing to score in a failed answer leaves it out:
    the challenger's mean was taken over its good answers alone (1.0 on 6 items against
    the champion's 0.6 on 10), and the bootstrap paired the two sides by position."""
    from spanmill.evaluate.run import _compare
    from spanmill.evaluate.settings import EvalSettings

    def outcome(i: int, score: float | None) -> Outcome:
        scores = {} if score is None else {"plugin.right": score}
        return Outcome(f"item-{i}", 0.0, False, True, 10, 1, scores=scores)

    champion = [outcome(i, 1.0 if i < 6 else 0.0) for i in range(10)]
    challenger = [outcome(i, 1.0 if i < 6 else None) for i in range(10)]
    result = _compare(
        "replay", {"champion": {"replay": champion}, "challenger": {"replay": challenger}},
        "plugin.right", EvalSettings(),
    )  # fmt: skip
    assert result.challenger.counts["plugin.right"] == result.champion.counts["plugin.right"] == 6
    assert result.challenger.scores["plugin.right"] == result.champion.scores["plugin.right"]
    assert result.difference.estimate == 0.0
    assert not decide(result.challenger, result.champion, result.difference, POLICY).promote
