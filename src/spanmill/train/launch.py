"""Training on every GPU of a machine: one process per GPU, started by torchrun.

The pipeline's ``gpus`` parameter is what the training step's pod asks Kubernetes
for, and the step trains with one process per GPU it was given:

- :func:`plan_processes` decides, from the GPUs asked for and the GPUs this machine
  has (:func:`visible_gpus`, torch's own count), how many processes run and on
  which devices. It is pure, so the decision is tested without a GPU.
- :func:`launch` carries the plan out. One process on the devices the machine
  already shows trains here, in this interpreter; anything else runs
  :func:`torchrun_command` (``python -m torch.distributed.run --standalone
  --nproc-per-node N -m spanmill.train.worker DATASET OUT``) with the settings
  passed on as ``SPANMILL_TRAIN_*`` environment. Every process runs
  :func:`spanmill.train.train`: the Trainer runs data parallel (NCCL on GPUs,
  gloo on CPUs) and only rank 0 logs to MLflow and writes the adapter and its
  manifest, which this module reads back, so the caller gets the same
  :class:`~spanmill.train.TrainResult` as from a single process.

``batch_size`` stays per process: N processes train on N times as many samples
per optimizer step.

A Kubeflow Trainer TrainJob runs the same worker under torchrun on each of its
nodes, with the node count, rank and processes per node from the ``PET_*``
environment the Trainer sets (:mod:`spanmill.train.trainjob`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from spanmill.contracts import TrainManifest
from spanmill.train.errors import TrainError
from spanmill.train.mirror import mirror_url, restore
from spanmill.train.settings import TrainSettings
from spanmill.train.trainer import CHECKPOINTS_DIRNAME, MERGED_DIRNAME, TrainResult, train

logger = logging.getLogger(__name__)

WORKER_MODULE = "spanmill.train.worker"
# The settings every process reads; the parent's own are replaced, never mixed in.
SETTINGS_PREFIX = "SPANMILL_TRAIN_"
MLFLOW_URI_ENV = "SPANMILL_MLFLOW_TRACKING_URI"


@dataclass(frozen=True)
class LaunchPlan:
    """How many training processes run, and where.

    ``devices`` are the positions, among the GPUs the machine shows, that the
    processes may use: ``()`` trains on the CPU, ``None`` leaves the machine's own
    view unchanged. ``in_process`` runs the one process in the caller's interpreter.
    """

    processes: int
    devices: tuple[int, ...] | None
    in_process: bool
    note: str = ""

    @property
    def on_gpu(self) -> bool:
        return self.devices != ()


def visible_gpus() -> int:
    """The CUDA devices this process can use, as torch counts them."""
    import torch

    return int(torch.cuda.device_count())


def plan_processes(gpus: int, visible: int) -> LaunchPlan:
    """One process per GPU asked for; ``gpus`` 0 trains on the CPU.

    Fewer GPUs than asked for is an error, except none at all: then the run goes on
    one CPU process, with a warning, as kfp's local runner (which grants no GPU)
    and a machine without a CUDA build of torch need. More GPUs than asked for are
    left unused.
    """
    if gpus < 0:
        raise TrainError(f"gpus must be 0 (the CPU) or more, not {gpus}")
    if gpus == 0:
        if visible == 0:
            return LaunchPlan(1, None, in_process=True)
        # The machine has GPUs the run was not given: hide them from the one process.
        return LaunchPlan(1, (), in_process=False)
    if visible == 0:
        note = (
            f"asked for {gpus} GPU(s), but torch sees none (no GPU given to this pod, or a "
            "CPU build of torch): training on the CPU in one process"
        )
        return LaunchPlan(1, None, in_process=True, note=note)
    if visible < gpus:
        raise TrainError(
            f"asked for {gpus} GPUs, but this machine has {visible}; ask for {visible} or fewer"
        )
    if gpus == 1 and visible == 1:
        return LaunchPlan(1, None, in_process=True)
    return LaunchPlan(gpus, tuple(range(gpus)) if visible > gpus else None, in_process=False)


def torchrun_command(dataset_dir: Path, output_dir: Path, processes: int | None) -> list[str]:
    """The command that starts the training processes of one machine.

    With ``processes`` None, torchrun takes the node count, node rank, processes per
    node and rendezvous address from the ``PET_*`` environment (a TrainJob node).
    """
    command = [sys.executable, "-m", "torch.distributed.run"]
    if processes is not None:
        command += ["--standalone", "--nproc-per-node", str(processes)]
    return [*command, "-m", WORKER_MODULE, str(dataset_dir), str(output_dir)]


def settings_env(settings: TrainSettings) -> dict[str, str]:
    """``settings`` as the environment that :class:`TrainSettings` loads back in each process."""
    unset = {k for k, v in settings.model_dump(exclude={"mlflow"}).items() if v is None}
    env = {
        f"{SETTINGS_PREFIX}{name.upper()}": text
        for name, text in settings.as_params().items()
        if name not in unset
    }
    env[MLFLOW_URI_ENV] = settings.mlflow.tracking_uri
    return env


def child_env(
    settings: TrainSettings,
    devices: tuple[int, ...] | None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of the training processes: the caller's, with these settings."""
    base = dict(os.environ if environ is None else environ)
    env = {k: v for k, v in base.items() if not k.startswith(SETTINGS_PREFIX)}
    env.update(settings_env(settings))
    if devices is not None:
        shown = [d for d in base.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        ids = [shown[i] if i < len(shown) else str(i) for i in devices]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    return env


def launch(
    dataset_dir: Path, output_dir: Path, settings: TrainSettings, plan: LaunchPlan
) -> TrainResult:
    """Train as ``plan`` says; the result is rank 0's, as a single process would return it."""
    if plan.note:
        logger.warning("%s", plan.note)
    if plan.in_process:
        return train(dataset_dir, output_dir, settings)
    mirror = mirror_url(settings, output_dir)
    if mirror is not None:  # before the processes, which all read the folder at once
        restore(mirror, Path(output_dir) / CHECKPOINTS_DIRNAME)
    prepare_base_model(settings)
    command = torchrun_command(dataset_dir, output_dir, plan.processes)
    where = "the CPU" if not plan.on_gpu else f"{plan.processes} GPU(s)"
    logger.info("training in %d processes on %s: %s", plan.processes, where, " ".join(command))
    run_processes(command, child_env(settings, plan.devices))
    return read_result(output_dir)


def prepare_base_model(settings: TrainSettings) -> None:
    """Pull or download the base model once, before several processes would each try."""
    from spanmill.models import resolve_model

    resolve_model(settings.base_model)


def run_processes(command: list[str], env: Mapping[str, str]) -> None:
    completed = subprocess.run(command, env=dict(env), check=False)
    if completed.returncode != 0:
        raise TrainError(
            f"training processes exited with status {completed.returncode}; the output "
            "above names the failing rank and its error"
        )


def read_result(output_dir: Path) -> TrainResult:
    """The result rank 0 recorded in the adapter's manifest."""
    manifest = TrainManifest.read_if_present(output_dir)
    if manifest is None:
        raise TrainError(
            f"training finished without writing {Path(output_dir) / TrainManifest.FILE}; "
            "rank 0 did not complete"
        )
    result = TrainResult.of(manifest)
    # The manifest names the folders where rank 0 wrote them (another pod, for a TrainJob).
    merged = Path(output_dir) / MERGED_DIRNAME if result.merged_dir else None
    return replace(result, output_dir=Path(output_dir), merged_dir=merged)
