"""What a dataset build asks for: the window, the filters, the mode and the credit rule."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spanmill.dataset.layout import Mode

CreditRule = Literal["episode", "per_call", "discounted"]
# A time before now: "-24h", "-7d", "-90m", "-30s".
_AGO = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
SftWeighting = Literal["uniform", "reward"]


class DatasetSpec(BaseModel):
    """Every choice of a build; it is written into the dataset card as it was given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode = "sft"
    # Span window, ISO 8601, nanoseconds, or a time before now ("-24h": a recurring run's
    # window moves with it, resolved once, when the build is asked for); [since, until).
    since: str | int | None = None
    until: str | int | None = None
    # Feedback comes after its calls: rewards are read until this long after `until`.
    feedback_horizon_hours: float = Field(
        72.0,
        ge=0,
        description="Rewards are read from [since, until + this): late feedback still joins.",
    )
    # Which LLM calls become samples.
    service: str | None = None
    agent: str | None = None
    model: str | None = None
    model_version: str | None = None
    # Whose spans count (spanmill.producers): by default every producer but "anonymous".
    trusted_producers: tuple[str, ...] = Field(
        (),
        description="Producers whose spans and rewards are read; empty: all but 'anonymous' "
        "(what came through an endpoint that asked for no key); '*': every span.",
    )
    # Rewards: the one training optimises, and how it reaches each call.
    reward: str | None = Field(
        None, description="Reward name to optimise; default: the one marked primary."
    )
    credit: CreditRule = "episode"
    discount: float = Field(1.0, gt=0, le=1, description="Per-call discount for 'discounted'.")
    min_reward: float | None = Field(None, description="sft: keep samples at or above it.")
    max_reward: float | None = Field(
        None, description="sft: keep samples at or below it (a dataset of failures: 0)."
    )
    sft_weighting: SftWeighting = "uniform"
    min_reward_gap: float = Field(
        1e-9, ge=0, description="preference: smallest reward difference that makes a pair."
    )
    max_tokens: int | None = Field(None, gt=0, description="Longest sample (prompt+completion).")
    # Context distillation: drop few-shot example turns from prompts.
    drop_examples: bool = False
    dedupe: bool = True
    eval_fraction: float = Field(0.1, ge=0, lt=1)
    min_train_rows: int = Field(
        1,
        ge=1,
        description="Fewest training rows worth a run: fewer stop it at the dataset, "
        "before any GPU is asked for (a scheduled run on a trickle of new calls).",
    )
    seed: int = 0

    @field_validator("since", "until", mode="before")
    @classmethod
    def _resolve_ago(cls, value: object) -> object:
        """``-24h`` and the like as the ISO time they name now; other values as given.
        A nightly run's window was fixed text: it read the same hours, or the whole
        retained store, night after night."""
        if isinstance(value, str) and (match := _AGO.match(value.strip())):
            ago = timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
            return (datetime.now(UTC) - ago).isoformat()
        return value

    @model_validator(mode="after")
    def _coherent(self) -> DatasetSpec:
        if self.sft_weighting == "reward" and self.mode != "sft":
            raise ValueError("sft_weighting='reward' applies to mode 'sft' only")
        if self.credit != "discounted" and self.discount != 1.0:
            raise ValueError("discount applies to credit='discounted' only")
        if (
            self.min_reward is not None
            and self.max_reward is not None
            and self.min_reward > self.max_reward
        ):
            raise ValueError(f"min_reward {self.min_reward} is above max_reward {self.max_reward}")
        return self
