"""Every setting of a training run, with the defaults that work for SmolLM2 on a CPU.

Env prefix ``SPANMILL_TRAIN_`` (``SPANMILL_TRAIN_LORA_R=32``); the MLflow
connection comes from ``SPANMILL_MLFLOW_*`` as for every service. The defaults
are the recipe measured on the calculator agent: LoRA r=16, alpha=32 on every
attention and MLP projection, lr 3e-4, batch 8; GRPO takes GRPO_RECIPE where a run
leaves those unset.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from spanmill.config import MLflowSettings

Precision = Literal["auto", "bf16", "fp16", "fp32"]
Method = Literal["auto", "sft", "dpo", "grpo"]

# The projections of Llama-style blocks (SmolLM2, Qwen2, Llama, Mistral).
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# GRPO's own recipe where a run does not set these: a small constant rate from the first
# step (SFT's linear warm-up over a run of 20 steps gave its first step a rate of 0, its
# 32 episodes for nothing) and rollouts sampled a little cooler than the model's own.
GRPO_RECIPE: dict[str, Any] = {
    "learning_rate": 1e-4,
    "lr_scheduler": "constant",
    "warmup_ratio": 0.0,
    "rollout_temperature": 0.8,
    # A step is minutes of rollouts: each is kept (a few MB), so that a run stopped part
    # way resumes where it was.
    "save_steps": 1,
}


class TrainSettings(BaseSettings):
    """How to fine-tune a base model with LoRA on a spanmill dataset."""

    model_config = SettingsConfigDict(
        env_prefix="SPANMILL_TRAIN_", extra="forbid", validate_default=True
    )

    base_model: str = Field(
        "smollm2-135m",
        description="A local folder, a catalog name (pulled if missing) or a Hugging Face id.",
    )
    method: Method = Field(
        "auto",
        description="sft or dpo (auto picks from the dataset's mode, preference: dpo), or grpo: "
        "online RL over the task's own episodes (spanmill.train.rl).",
    )

    lora_r: int = Field(16, gt=0, le=1024)
    lora_alpha: int = Field(32, gt=0)
    lora_dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: list(LLAMA_PROJECTIONS),
        description='Module names to adapt, or ["all-linear"].',
    )

    learning_rate: float = Field(3e-4, gt=0.0, le=1.0)
    epochs: float = Field(1.0, gt=0.0, description="Ignored when max_steps is set.")
    max_steps: int | None = Field(None, gt=0, description="Optimizer steps; overrides epochs.")
    batch_size: int = Field(8, gt=0, description="Samples per device per step.")
    gradient_accumulation_steps: int = Field(1, gt=0)
    warmup_ratio: float = Field(0.05, ge=0.0, lt=1.0)
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "linear"
    weight_decay: float = Field(0.0, ge=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    max_length: int = Field(1024, gt=0, description="Tokens per sample, or per packed sequence.")
    packing: bool = Field(
        False,
        description="Pack short samples into max_length sequences; not with varying weights.",
    )
    sample_weights: bool = Field(
        True, description="Weigh each sample's loss by the dataset's weight column when it varies."
    )
    dpo_beta: float = Field(0.1, gt=0.0, description="DPO's KL strength.")
    seed: int = 0
    precision: Precision = Field(
        "auto",
        description="auto: bf16 where the device computes it natively (a GPU that supports "
        "it, a CPU with AVX512-BF16 or AMX), else fp32.",
    )
    gradient_checkpointing: bool = False
    num_threads: int = Field(
        0,
        ge=0,
        description="CPU threads for torch; 0: as many as the CPUs the process may use "
        "(its cgroup quota), or OMP_NUM_THREADS.",
    )

    logging_steps: int = Field(1, gt=0)
    save_steps: int = Field(
        50,
        gt=0,
        description="Checkpoint every this many steps; GRPO, whose steps are minutes of "
        "rollouts each, checkpoints every step unless this is set.",
    )
    save_total_limit: int = Field(2, gt=0)
    resume: bool = Field(True, description="Continue from the output folder's last checkpoint.")
    keep_checkpoints: bool = Field(False, description="Keep checkpoints after a finished run.")
    checkpoint_store: str | None = Field(
        None,
        description="A folder (local, or an object store's such as s3://bucket/checkpoints) "
        "each checkpoint is copied into as it is saved, in a folder named from run_key: a run "
        "started again elsewhere (a retried pipeline step, on a new pod) resumes from it "
        "(spanmill.train.mirror). Unset: checkpoints are in the output folder alone.",
    )
    run_key: str | None = Field(
        None,
        description="What names this run across its tries (a pipeline run's id and task): "
        "its folder in checkpoint_store. Unset: the output folder's path.",
    )

    @field_validator("checkpoint_store", "run_key")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # The chart's ConfigMap holds the key whether or not a store is set.
        return value.strip() or None if value is not None else None

    merge: bool = Field(False, description="Also save the base model with the adapter merged in.")
    eval_loss: bool = Field(True, description="Compute the loss on the eval split at the end.")

    # GRPO (method grpo): the policy samples groups of episodes of the task's agent.
    task: str | None = Field(None, description="GRPO: the task plugin whose episodes are sampled.")
    init_adapter: str | None = Field(
        None, description="GRPO: start from this LoRA adapter (an SFT run's output folder)."
    )
    group_size: int = Field(8, ge=2, description="GRPO: episodes per task instance (a group).")
    groups_per_step: int = Field(4, gt=0, description="GRPO: task instances per step.")
    rollout_temperature: float = Field(
        1.0, gt=0.0, le=2.0, description="GRPO: sampling temperature (unset: GRPO_RECIPE's)."
    )
    rollout_max_tokens: int = Field(128, gt=0, description="GRPO: most new tokens per LLM call.")
    rollout_concurrency: int = Field(
        0, ge=0, description="GRPO: episodes run at once; 0: every episode of a step."
    )
    rollout_timeout_s: float = Field(
        900.0,
        gt=0,
        description="GRPO: seconds a step's episodes may take; one still running then (a tool "
        "or verifier that never returns) counts as failed, and the step trains on the others.",
    )
    beta: float = Field(0.0, ge=0.0, description="GRPO: weight of the KL term to the start policy.")
    epsilon_low: float = Field(0.2, ge=0.0, lt=1.0, description="GRPO: lower clip range.")
    epsilon_high: float = Field(0.2, ge=0.0, description="GRPO: upper clip range.")
    scale_rewards: bool = Field(
        True, description="GRPO: divide advantages by the group's std (False: Dr. GRPO)."
    )
    reward_weights: dict[str, float] | None = Field(
        None, description="GRPO: named rewards and weights; default: the primary reward alone."
    )

    track: bool = Field(True, description="Log the run to MLflow.")
    experiment: str = Field("spanmill", min_length=1)
    run_name: str | None = None
    mlflow: MLflowSettings = Field(default_factory=MLflowSettings)

    @field_validator("target_modules")
    @classmethod
    def _some_modules(cls, value: list[str]) -> list[str]:
        cleaned = [name.strip() for name in value if name.strip()]
        if not cleaned:
            raise ValueError("name at least one module to adapt, e.g. q_proj, or all-linear")
        return cleaned

    @model_validator(mode="after")
    def _grpo_recipe(self) -> TrainSettings:
        """GRPO takes :data:`GRPO_RECIPE` for what the run leaves unset (by argument or
        environment): one recipe for the CLI, the pipeline and the API."""
        if self.method == "grpo":
            for name, value in GRPO_RECIPE.items():
                if name not in self.model_fields_set:
                    self.__dict__[name] = value
        return self

    def training_fingerprint(self) -> str:
        """A hash of what decides the trained weights, to refuse resuming under other settings."""
        decisive = self.model_dump(
            exclude={
                "resume",
                "keep_checkpoints",
                "checkpoint_store",
                "run_key",
                "merge",
                "eval_loss",
                "track",
                "experiment",
                "run_name",
                "mlflow",
                "num_threads",
                "rollout_concurrency",
                "rollout_timeout_s",
                "logging_steps",
                "save_steps",
                "save_total_limit",
            }
        )
        return hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()[:16]

    def as_params(self) -> dict[str, str]:
        """The settings as MLflow params (the connection excluded)."""
        return {
            key: json.dumps(value) if isinstance(value, list | dict) else str(value)
            for key, value in self.model_dump(exclude={"mlflow"}).items()
        }


class TrainJobSettings(BaseSettings):
    """How the pipeline's training step hands a run to the Kubeflow Trainer (trainer=trainjob).

    Env prefix ``SPANMILL_TRAINJOB_``; on a cluster the chart's ConfigMap
    ``spanmill-trainjob`` sets them (``trainer.enabled``). See
    :mod:`spanmill.train.trainjob` for what the TrainJob runs.
    """

    model_config = SettingsConfigDict(
        env_prefix="SPANMILL_TRAINJOB_", extra="ignore", validate_default=True
    )

    runtime: str = Field(
        "spanmill-train", min_length=1, description="The training runtime the TrainJob runs on."
    )
    runtime_kind: Literal["TrainingRuntime", "ClusterTrainingRuntime"] = Field(
        "TrainingRuntime", description="TrainingRuntime (in the TrainJob's namespace) or cluster."
    )
    namespace: str = Field("", description="Where TrainJobs go; empty: this pod's own namespace.")
    image: str = Field("", description="The training image; empty: the runtime's own image.")
    staging_url: str = Field(
        "",
        description="Object store folder (s3://bucket/prefix) through which the dataset goes "
        "to the TrainJob and the adapter comes back.",
    )
    cpu_per_node: str = Field("8", min_length=1, description="CPU limit of each node's pod.")
    memory_per_node: str = Field("32Gi", min_length=1, description="Memory limit of each pod.")
    poll_s: float = Field(15.0, gt=0, description="Seconds between looks at the TrainJob.")
    deadline_s: int = Field(
        86400, gt=0, description="Seconds the TrainJob may run (its activeDeadlineSeconds)."
    )
    wait_s: float = Field(
        90000.0,
        gt=0,
        description="Seconds the step waits for the TrainJob to end, queueing included, "
        "before it gives up and leaves the TrainJob in place: within the step's own deadline "
        "in a pipeline (26 hours), so that the step, not its pod's end, says why it stopped.",
    )
