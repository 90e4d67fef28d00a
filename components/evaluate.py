"""Component: the challenger against the champion in service; the gate's decision."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from components import IMAGE


@dsl.component(base_image=IMAGE)
def evaluate(
    dataset: Input[Dataset],
    model: Input[Model],
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
    agent: str,
    base_model: str,
    margin: float = 0.05,
    instances: int = 100,
    num_threads: int = 0,
    tracking_uri: str = "",
) -> bool:
    """The gate's decision: promote the challenger or not.

    A plain return value rather than a named output: kfp's local runner resolves
    a condition on a task's single return value, not on a named tuple field.
    """
    from pathlib import Path

    from spanmill.pipeline.steps import evaluate_step

    report = evaluate_step(
        Path(dataset.path), Path(model.path), Path(evaluation.path), agent=agent,
        base_model=base_model, margin=margin, instances=instances, num_threads=num_threads,
        tracking_uri=tracking_uri,
    )  # fmt: skip
    for name, value in report.get("metrics", {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics.log_metric(name, float(value))
    promote = bool(report["decision"]["promote"])
    evaluation.metadata.update({"promote": promote, "verdict": report["decision"]["verdict"]})
    return promote
