"""Every setting of an evaluation, and the gate's policy. Env prefix ``SPANMILL_EVAL_``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from spanmill.config import MLflowSettings

Suite = Literal["tasks", "dataset"]
GateMetric = Literal["success_rate", "mean_reward"]


class GatePolicy(BaseModel):
    """When a challenger may replace the champion."""

    model_config = {"extra": "forbid", "frozen": True}

    suite: Suite = Field(
        "tasks",
        description="The suite that decides: fresh task instances, or the dataset's eval split.",
    )
    metric: GateMetric = "success_rate"
    margin: float = Field(
        0.02, ge=0.0, le=1.0, description="How much better the challenger must be, at least."
    )
    format_tolerance: float = Field(
        0.0, ge=0.0, le=1.0, description="How much lower its format validity may be."
    )
    require_significant: bool = Field(
        False, description="Also require the difference's confidence interval to exclude 0."
    )


class EvalSettings(BaseSettings):
    """How to compare a challenger with the champion (or the base model)."""

    model_config = SettingsConfigDict(
        env_prefix="SPANMILL_EVAL_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    task: str | None = Field(
        None, description="The task whose verifier scores; by default the dataset's agent's task."
    )
    base_model: str | None = Field(
        None, description="Base of adapters; by default what the challenger was trained from."
    )
    champion: str | None = Field(
        None, description="The model in service (adapter or model folder); none: the base model."
    )
    instances: int = Field(100, ge=0, description="Fresh held-out task instances; 0 skips them.")
    instance_seed: int = 1
    dataset_samples: int = Field(
        100, ge=0, description="Samples of the dataset's eval split, at most; 0 skips them."
    )
    prompt_style: Literal["zero_shot", "few_shot"] = "zero_shot"
    max_new_tokens: int = Field(96, gt=0, le=4096)
    batch_size: int = Field(16, gt=0)
    dtype: Literal["bfloat16", "float32", "float16"] = "bfloat16"
    num_threads: int = Field(0, ge=0)

    bootstrap_resamples: int = Field(2000, ge=100)
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    seed: int = 0
    gate: GatePolicy = Field(default_factory=GatePolicy)

    track: bool = True
    experiment: str = Field("spanmill", min_length=1)
    run_id: str | None = Field(
        None, description="Log into this run; by default the challenger's training run."
    )
    mlflow: MLflowSettings = Field(default_factory=MLflowSettings)
