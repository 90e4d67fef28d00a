"""What an evaluation decides: the models compared, each suite's summaries and the
difference between them, and the gate's decision; the report is drawn from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from spanmill.contracts import EvalReport
from spanmill.evaluate.gate import GateDecision
from spanmill.evaluate.scoring import Summary
from spanmill.evaluate.settings import GatePolicy
from spanmill.evaluate.stats import Interval

ROLES = ("champion", "challenger")


@dataclass(frozen=True)
class ModelRef:
    """A model: a base model and, optionally, an adapter on it; where Triton serves it."""

    label: str
    base: str
    adapter: str | None = None
    run_id: str | None = None
    served: str = ""
    # The base as it was named (a catalog name, a hub id), before ``base`` resolved it to
    # this machine's files: what another machine (a vLLM engine) can open.
    base_named: str = ""
    # The champion: its registered version the evaluation measured (None: the agent had
    # none, and the base model stood in), which its registration checks is still the one.
    version: int | None = None

    def describe(self) -> str:
        model = f"{self.adapter} on {self.base}" if self.adapter else self.base
        return f"{model} ({self.served})" if self.served else model


@dataclass(frozen=True)
class SuiteResult:
    name: str
    champion: Summary
    challenger: Summary
    difference: Interval
    metric: str = "success_rate"  # the one the difference is of


@dataclass(frozen=True)
class Comparison:
    """The comparison, suite by suite, and the gate's decision."""

    task: str
    models: dict[str, ModelRef]
    suites: dict[str, SuiteResult]
    policy: GatePolicy
    decision: GateDecision
    run_id: str | None = None
    evaluators: dict[str, dict[str, str]] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Flat metrics, named ``<suite>.<role>.<rate>`` and ``<suite>.difference[_low|_high]``."""
        flat: dict[str, float] = {}
        for suite in self.suites.values():
            for role in ROLES:
                summary: Summary = getattr(suite, role)
                for key, value in asdict(summary).items():
                    if key not in ("scores", "counts"):
                        flat[f"{suite.name}.{role}.{key}"] = float(value)
                for key, value in summary.scores.items():
                    flat[f"{suite.name}.{role}.{key}"] = float(value)
            flat[f"{suite.name}.difference"] = suite.difference.estimate
            flat[f"{suite.name}.difference_low"] = suite.difference.low
            flat[f"{suite.name}.difference_high"] = suite.difference.high
        flat["gate.promote"] = float(self.decision.promote)
        return flat

    def report(self) -> EvalReport:
        """The evaluation's output file (:class:`spanmill.contracts.EvalReport`)."""
        return EvalReport.model_validate({
            "task": self.task,
            "models": {role: asdict(ref) for role, ref in self.models.items()},
            "suites": {name: asdict(suite) for name, suite in self.suites.items()},
            "policy": self.policy.model_dump(),
            "decision": {
                "promote": self.decision.promote,
                "verdict": self.decision.verdict,
                "reasons": list(self.decision.reasons),
                "metric": self.decision.metric,
                "difference": self.decision.difference,
            },
            "evaluators": self.evaluators,
            "metrics": self.metrics(),
            "run_id": self.run_id,
        })  # fmt: skip
