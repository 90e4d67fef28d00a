"""Component: the challenger against the champion, both served by Triton; the gate's verdict."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from components import IMAGE


@dsl.component(base_image=IMAGE)
def evaluate(
    dataset: Input[Dataset],
    model: Input[Model],
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[Markdown],
    report_html: Output[HTML],
    agent: str,
    base_model: str,
    margin: float = 0.05,
    instances: int = 100,
    evaluators: str = "tool_calls,reference",
    gate_metric: str = "auto",
    judge_url: str = "",
    judge_model: str = "",
    num_threads: int = 0,
    triton_url: str = "",
    model_repository: str = "",
    flavour: str = "",
    tracking_uri: str = "",
    pipeline_run_id: str = "",
    task_name: str = "",
) -> bool:
    """The gate's decision: promote the challenger or not.

    The Markdown and HTML reports and the metrics are the run's visualisation in
    the Kubeflow UI. A plain return value rather than a named output: kfp's local
    runner resolves a condition on a task's single return value, not on a named
    tuple field.
    """
    import shutil
    from pathlib import Path

    from spanmill.evaluate.run import REPORT_HTML, REPORT_MD
    from spanmill.pipeline.steps import evaluate_step

    out = Path(evaluation.path)
    result = evaluate_step(
        Path(dataset.path), Path(model.path), out, agent=agent, base_model=base_model,
        margin=margin, instances=instances, evaluators=evaluators, gate_metric=gate_metric,
        judge_url=judge_url, judge_model=judge_model, num_threads=num_threads,
        triton_url=triton_url, model_repository=model_repository, flavour=flavour,
        tracking_uri=tracking_uri, pipeline_run_id=pipeline_run_id, task_name=task_name,
    )  # fmt: skip
    for name, value in result.get("metrics", {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics.log_metric(name, float(value))
    shutil.copyfile(out / REPORT_MD, report.path)
    shutil.copyfile(out / REPORT_HTML, report_html.path)
    promote = bool(result["decision"]["promote"])
    evaluation.metadata.update({"promote": promote, "verdict": result["decision"]["verdict"]})
    return promote
