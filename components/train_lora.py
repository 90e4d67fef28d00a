"""Component: a LoRA adapter trained on the dataset (the GPU step on a cluster)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components import TRAIN_IMAGE


@dsl.component(base_image=TRAIN_IMAGE)
def train_lora(
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    base_model: str,
    method: str = "auto",
    lora_r: int = 16,
    lora_alpha: int = 32,
    learning_rate: float = 3e-4,
    max_steps: int = 90,
    batch_size: int = 8,
    max_length: int = 1024,
    seed: int = 0,
    precision: str = "auto",
    num_threads: int = 0,
    tracking_uri: str = "",
    gpus: int = 1,
    trainer: str = "pod",
    trainjob_nodes: int = 2,
    trainjob_gpus_per_node: int = 1,
    gpu_resource: str = "nvidia.com/gpu",
    pipeline_run_id: str = "",
    task_name: str = "",
) -> None:
    from pathlib import Path

    from spanmill.pipeline.steps import train_step

    result = train_step(
        Path(dataset.path), Path(model.path), base_model=base_model, method=method, lora_r=lora_r,
        lora_alpha=lora_alpha, learning_rate=learning_rate, max_steps=max_steps,
        batch_size=batch_size, max_length=max_length, seed=seed, precision=precision,
        num_threads=num_threads, tracking_uri=tracking_uri, gpus=gpus, trainer=trainer,
        trainjob_nodes=trainjob_nodes, trainjob_gpus_per_node=trainjob_gpus_per_node,
        gpu_resource=gpu_resource, pipeline_run_id=pipeline_run_id,
        task_name=task_name,
    )  # fmt: skip
    for name, value in result.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics.log_metric(name, float(value))
    model.metadata.update({"base_model": base_model, "mlflow_run_id": result.get("run_id") or ""})
