"""Evaluation: the challenger against the champion on held-out work, and the promotion gate.

``evaluate(dataset_dir, challenger, output_dir, settings)`` generates with both
models locally, scores with the task's verifier, and decides with
:func:`~spanmill.evaluate.gate.decide`, a pure function of the summaries.
"""

from spanmill.evaluate.gate import GateDecision, decide
from spanmill.evaluate.run import Comparison, EvaluationError, ModelRef, SuiteResult, evaluate
from spanmill.evaluate.scoring import Outcome, Summary
from spanmill.evaluate.settings import EvalSettings, GatePolicy
from spanmill.evaluate.stats import Interval, bootstrap_difference

__all__ = [
    "Comparison",
    "EvalSettings",
    "EvaluationError",
    "GateDecision",
    "GatePolicy",
    "Interval",
    "ModelRef",
    "Outcome",
    "SuiteResult",
    "Summary",
    "bootstrap_difference",
    "decide",
    "evaluate",
]
