"""Component: the adapter as a new MLflow version with its lineage; alias challenger."""

from kfp import dsl
from kfp.dsl import Artifact, Input, Model

from components import IMAGE


@dsl.component(base_image=IMAGE)
def register_model(
    model: Input[Model],
    evaluation: Input[Artifact],
    agent: str,
    base_model: str,
    pipeline_run_id: str = "",
    tracking_uri: str = "",
) -> int:
    from pathlib import Path

    from spanmill.pipeline.steps import register_step

    return register_step(
        Path(model.path), Path(evaluation.path), agent=agent, base_model=base_model,
        pipeline_run_id=pipeline_run_id, tracking_uri=tracking_uri,
    )  # fmt: skip
