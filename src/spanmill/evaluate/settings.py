"""Every setting of an evaluation, and the gate's policy. Env prefix ``SPANMILL_EVAL_``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from spanmill.config import MLflowSettings, ServingSettings, TritonSettings

Suite = Literal["auto", "tasks", "replay"]


class GatePolicy(BaseModel):
    """When a challenger may replace the champion."""

    model_config = {"extra": "forbid", "frozen": True}

    suite: Suite = Field(
        "auto",
        description="The suite that decides: fresh task instances (agents with a task plugin), "
        "or the replay of the dataset's eval split; auto: tasks when there are any.",
    )
    metric: str = Field(
        "auto",
        description="success_rate, mean_reward, format_validity, or an evaluator's metric "
        "(<evaluator>.<metric>, e.g. tool_calls.name_args); auto: success_rate for tasks, "
        "the first evaluator's first metric for the replay.",
        pattern=r"^(auto|success_rate|mean_reward|format_validity|[a-z0-9_]+\.[a-z0-9_]+)$",
    )
    margin: float = Field(
        0.02, ge=0.0, le=1.0, description="How much better the challenger must be, at least."
    )
    format_tolerance: float = Field(
        0.0, ge=0.0, le=1.0, description="How much lower its format validity may be."
    )
    require_significant: bool = Field(
        False, description="Also require the difference's confidence interval to exclude 0."
    )
    min_items: int = Field(
        5,
        ge=1,
        description="The fewest items the gate's metric must be measured on, for each model: "
        "fewer say too little to replace a model in service.",
    )
    regression_tolerance: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="How much lower than the champion's any other rate evaluated on both may "
        "be (the success rate, each evaluator metric): a challenger better on the gate's "
        "metric and worse past this on another is refused.",
    )


class EvalSettings(BaseSettings):
    """How to compare a challenger with the champion (or the base model)."""

    model_config = SettingsConfigDict(
        env_prefix="SPANMILL_EVAL_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    agent: str | None = Field(
        None, description="The agent whose champion is compared; by default the dataset's."
    )
    task: str | None = Field(
        None,
        description="A task plugin whose verifier scores fresh episodes; by default the "
        "agent's task when one is installed, else none (replay only).",
    )
    base_model: str | None = Field(
        None, description="Base of adapters; by default what the challenger was trained from."
    )
    champion_version: int | None = Field(
        None, ge=1, description="The registered version to compare with; default: the champion."
    )
    instances: int = Field(100, ge=0, description="Fresh held-out task instances; 0 skips them.")
    instance_seed: int = 1
    replay_items: int = Field(
        100, ge=0, description="Logged calls of the dataset's eval split replayed, at most."
    )
    evaluators: list[str] = Field(
        default_factory=lambda: ["tool_calls", "reference"],
        description="Evaluators (entry points spanmill.evaluators) that score the replay.",
    )
    judge_url: str | None = Field(
        None, description="The LLM judge's OpenAI-compatible base URL (ending in /v1)."
    )
    judge_model: str | None = Field(None, description="The model the judge endpoint serves.")
    judge_api_key: SecretStr | None = Field(
        None, description="The judge endpoint's key; from a Secret on a cluster."
    )
    prompt_style: Literal["zero_shot", "few_shot"] = "zero_shot"
    max_new_tokens: int = Field(96, gt=0, le=4096)
    batch_size: int = Field(16, gt=0)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    triton: TritonSettings = Field(default_factory=TritonSettings)
    candidates_url: str | None = Field(
        None,
        description="A Triton server of the evaluation's own (host:port of its HTTP API) to "
        "stage the challenger on; unset or empty: one of the serving Triton's pods (never "
        "all: a large or broken candidate takes memory from one pod's models at most).",
    )

    @field_validator("candidates_url")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # The chart's ConfigMap holds the key whether or not it runs such a Triton.
        return value.strip() or None if value is not None else None

    owner: str | None = Field(
        None,
        description="Who stages the candidates (a pipeline run's id and task), written in "
        "their records: a retry of the same evaluation removes what its killed try left.",
    )

    bootstrap_resamples: int = Field(2000, ge=100)
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    seed: int = 0
    gate: GatePolicy = Field(default_factory=GatePolicy)

    def with_gate(self, **asked: Any) -> EvalSettings:
        """These settings with the gate's fields ``asked`` (None: as they are, from the
        environment or the default) over the gate the settings hold; raises ValueError
        naming a bad value."""
        given = {name: value for name, value in asked.items() if value is not None}
        if not given:
            return self
        return self.model_copy(update={"gate": GatePolicy(**{**self.gate.model_dump(), **given})})

    track: bool = True
    experiment: str = Field("spanmill", min_length=1)
    run_id: str | None = Field(
        None, description="Log into this run; by default the challenger's training run."
    )
    mlflow: MLflowSettings = Field(default_factory=MLflowSettings)
