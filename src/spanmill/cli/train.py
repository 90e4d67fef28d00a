"""``spanmill train``: fine-tune a LoRA adapter on a dataset folder, with a progress bar.

Options override the ``SPANMILL_TRAIN_*`` environment, which overrides the
defaults; see :class:`spanmill.train.TrainSettings` for every setting. On
several GPUs run the same command under a launcher, for example
``torchrun --nproc_per_node 4 -m spanmill.cli.main train DATASET OUT --precision bf16``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from spanmill.cli.console import console, handle_errors


@handle_errors
def train(
    dataset: Path = typer.Argument(
        None, help="Dataset folder (train.parquet, eval.parquet, card); none for grpo."
    ),
    output: Path = typer.Argument(
        None, help="Folder for the adapter; resumes if it has checkpoints."
    ),
    base_model: str = typer.Option(None, help="Folder, catalog name or Hugging Face id."),
    method: str = typer.Option(
        None, help="sft or dpo (default: from the dataset's mode), or grpo: online RL."
    ),
    task: str = typer.Option(None, help="grpo: the task plugin whose episodes are sampled."),
    init_adapter: Path = typer.Option(None, help="grpo: start from this adapter (an SFT run's)."),
    group_size: int = typer.Option(None, min=2, help="grpo: episodes per task instance."),
    groups_per_step: int = typer.Option(None, min=1, help="grpo: task instances per step."),
    temperature: float = typer.Option(None, min=0.0, help="grpo: sampling temperature."),
    beta: float = typer.Option(None, min=0.0, help="grpo: KL weight to the start policy."),
    steps: int = typer.Option(None, min=1, help="Optimizer steps (overrides --epochs)."),
    epochs: float = typer.Option(None, min=0.0, help="Passes over the training split."),
    learning_rate: float = typer.Option(None, "--lr", min=0.0, help="Peak learning rate."),
    batch_size: int = typer.Option(None, min=1, help="Samples per device per step."),
    lora_r: int = typer.Option(None, min=1, help="LoRA rank."),
    lora_alpha: int = typer.Option(None, min=1, help="LoRA alpha."),
    max_length: int = typer.Option(None, min=1, help="Most tokens per sample."),
    packing: bool = typer.Option(None, help="Pack short samples into max-length sequences."),
    precision: str = typer.Option(None, help="auto, bf16, fp16 or fp32."),
    seed: int = typer.Option(None, help="Seed for initialisation and data order."),
    merge: bool = typer.Option(None, help="Also save the base model with the adapter merged."),
    resume: bool = typer.Option(None, help="Continue from the output folder's checkpoints."),
    track: bool = typer.Option(None, help="Log the run to MLflow (SPANMILL_MLFLOW_*)."),
    experiment: str = typer.Option(None, help="MLflow experiment name."),
    metrics_json: Path = typer.Option(None, help="Also write the final metrics to this file."),
) -> None:
    """Train a LoRA adapter on DATASET into OUTPUT and log it to MLflow.

    With --method grpo there is no dataset: spanmill train --method grpo --task
    calculator OUTPUT samples the task's episodes from the policy being trained,
    through a gateway of its own, and reads them back from the rollout topic
    (SPANMILL_KAFKA_BOOTSTRAP_SERVERS, SPANMILL_KAFKA_ROLLOUTS_TOPIC).
    """
    from transformers import TrainerCallback

    from spanmill.config import load_settings
    from spanmill.train import TrainSettings
    from spanmill.train import train as run_training

    given = {
        "base_model": base_model,
        "max_steps": steps,
        "epochs": epochs,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "lora_r": lora_r,
        "lora_alpha": lora_alpha,
        "max_length": max_length,
        "packing": packing,
        "precision": precision,
        "seed": seed,
        "merge": merge,
        "resume": resume,
        "track": track,
        "experiment": experiment,
        "method": method,
        "task": task,
        "init_adapter": str(init_adapter) if init_adapter else None,
        "group_size": group_size,
        "groups_per_step": groups_per_step,
        "rollout_temperature": temperature,
        "beta": beta,
    }
    settings = load_settings(TrainSettings, **{k: v for k, v in given.items() if v is not None})
    if settings.method == "grpo":
        if output is not None:
            raise typer.BadParameter(
                "grpo samples its own episodes and reads no dataset: give only OUTPUT"
            )
        if dataset is None:
            raise typer.BadParameter("give the OUTPUT folder for the adapter")
        _train_grpo(dataset, settings)
        return
    if dataset is None or output is None:
        raise typer.BadParameter("give the DATASET folder and the OUTPUT folder")

    with _progress() as progress:
        bar = progress.add_task("training", total=None, status="loading")

        class ProgressBar(TrainerCallback):
            def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                progress.update(bar, total=state.max_steps, completed=state.global_step)

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                progress.update(bar, completed=state.global_step)

            def on_log(
                self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any
            ) -> None:
                if logs and "loss" in logs:
                    progress.update(bar, status=f"loss {logs['loss']:.4f}")

        result = run_training(
            dataset, output, settings, metrics_path=metrics_json, callbacks=[ProgressBar()]
        )
    _report(result)


def _train_grpo(output: Path, settings: Any) -> None:
    from spanmill.config import KafkaSettings, load_settings
    from spanmill.train.rl import DEFAULT_STEPS, train_grpo

    with _progress() as progress:
        bar = progress.add_task("grpo", total=settings.max_steps or DEFAULT_STEPS, status="")

        def on_step(step: int, stats: dict[str, float]) -> None:
            status = f"reward {stats['reward_mean']:.3f}, loss {stats['loss']:.4f}"
            progress.update(bar, completed=step, status=status)

        result = train_grpo(output, settings, load_settings(KafkaSettings), on_step=on_step)
    _report(result)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
    )


def _report(result: Any) -> None:
    resumed = f", resumed from step {result.resumed_from_step}" if result.resumed_from_step else ""
    console.print(
        f"[green]✓[/] {result.method} adapter in {result.output_dir} after "
        f"{result.global_step} steps{resumed}"
    )
    if result.run_id:
        console.print(f"  MLflow run {result.run_id}")
    console.print_json(json.dumps(result.metrics))
