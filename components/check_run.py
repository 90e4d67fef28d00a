"""Component: the run's parameters checked together, before anything is built or trained."""

from kfp import dsl

from components import IMAGE


@dsl.component(base_image=IMAGE)
def check_run(
    dataset_mode: str = "sft",
    train_method: str = "sft",
    lora_r: int = 16,
    gpus: int = 1,
    trainer: str = "pod",
    trainjob_nodes: int = 2,
    trainjob_gpus_per_node: int = 1,
) -> str:
    from spanmill.pipeline.steps import check_run_step

    return check_run_step(
        dataset_mode=dataset_mode, train_method=train_method, lora_r=lora_r, gpus=gpus,
        trainer=trainer, trainjob_nodes=trainjob_nodes,
        trainjob_gpus_per_node=trainjob_gpus_per_node,
    )  # fmt: skip
