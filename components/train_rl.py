"""Component: GRPO over live rollouts of the agent's task (the GPU step, after or for SFT)."""

from kfp import dsl
from kfp.dsl import Input, Metrics, Model, Output

from components import TRAIN_IMAGE


@dsl.component(base_image=TRAIN_IMAGE)
def train_rl(
    model: Output[Model],
    metrics: Output[Metrics],
    agent: str,
    base_model: str,
    init_model: Input[Model] = None,
    max_steps: int = 20,
    group_size: int = 8,
    groups_per_step: int = 4,
    temperature: float = 0.8,
    learning_rate: float = 1e-4,
    beta: float = 0.0,
    seed: int = 0,
    precision: str = "auto",
    num_threads: int = 0,
    tracking_uri: str = "",
    pipeline_run_id: str = "",
    task_name: str = "",
) -> None:
    from pathlib import Path

    from spanmill.pipeline.steps import train_rl_step

    result = train_rl_step(
        Path(model.path), Path(init_model.path) if init_model is not None else None,
        agent=agent, base_model=base_model, max_steps=max_steps, group_size=group_size,
        groups_per_step=groups_per_step, temperature=temperature, learning_rate=learning_rate,
        beta=beta, seed=seed, precision=precision, num_threads=num_threads,
        tracking_uri=tracking_uri, pipeline_run_id=pipeline_run_id, task_name=task_name,
    )  # fmt: skip
    for name, value in result.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics.log_metric(name, float(value))
    model.metadata.update({"base_model": base_model, "mlflow_run_id": result.get("run_id") or ""})
