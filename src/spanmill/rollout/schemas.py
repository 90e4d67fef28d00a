"""The rollout controller's contracts: policy, per-agent state (a state machine), decisions.

The state is what the controller persists (a JSON file locally, an annotation of
the routing ConfigMap on Kubernetes) so that a restarted controller resumes a
rollout where it was: same step, same bake clock, same baseline.
"""

from __future__ import annotations

import itertools
import time
from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import BaseModel, Field, field_validator, model_validator


class Phase(StrEnum):
    # The champion takes all traffic; nothing is in flight.
    STABLE = "stable"
    # The challenger is being written to the model repository, loaded and checked.
    DEPLOYING = "deploying"
    # The challenger takes ``policy.steps[step]`` percent of the traffic.
    CANARY = "canary"


VALID_TRANSITIONS: Final[dict[Phase, frozenset[Phase]]] = {
    Phase.STABLE: frozenset({Phase.STABLE, Phase.DEPLOYING}),
    # Deployed: the canary starts (or, with no champion yet, the version serves).
    # Failed: back to stable, the champion untouched.
    Phase.DEPLOYING: frozenset({Phase.DEPLOYING, Phase.CANARY, Phase.STABLE}),
    # Promoted or rolled back, both end stable.
    Phase.CANARY: frozenset({Phase.CANARY, Phase.STABLE}),
}

Action = Literal[
    "serve",  # a version became the champion and takes all traffic
    "deploy",  # the challenger was written, loaded and answered its smoke check
    "canary",  # the challenger got its first share of traffic
    "advance",  # the challenger moved to the next traffic step
    "hold",  # nothing to change yet (baking, or waiting for traffic)
    "promote",  # the challenger became the champion
    "rollback",  # the challenger was taken out of service
    "retire",  # a version no longer needed was unloaded
    "error",  # something could not be done; the reason says what to fix
]
ACTIONS: Final[tuple[str, ...]] = (
    "serve", "deploy", "canary", "advance", "hold", "promote", "rollback", "retire", "error",
)  # fmt: skip


class RolloutPolicy(BaseModel):
    """How a challenger earns the traffic: steps, bake time, and the thresholds it must keep."""

    steps: list[float] = Field(
        default_factory=lambda: [5.0, 25.0, 50.0, 100.0],
        description="Percent of the traffic the challenger takes at each step; ends at 100.",
    )
    bake_s: float = Field(300.0, ge=0, description="Least time spent at each step.")
    min_requests: int = Field(
        20, ge=0, description="Challenger requests a step needs before it can be judged healthy."
    )
    max_error_rate: float = Field(0.05, ge=0, le=1, description="Errors / requests allowed.")
    max_queue_full_rate: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Requests refused because the version's queue in Triton was full (HTTP "
        "429) / requests allowed, judged on a full sample; off by default. A challenger "
        "slower than the champion fills its queue while the champion keeps up, but a burst "
        "of load fills any queue: set it above what the champion refuses at its peaks.",
    )
    max_p95_latency_s: float | None = Field(None, gt=0, description="Latency p95 allowed.")
    max_latency_ratio: float | None = Field(
        None, gt=0, description="Challenger p95 over champion p95 allowed, e.g. 1.5."
    )
    min_mean_reward: float | None = Field(None, description="Mean primary reward required.")
    max_reward_drop: float | None = Field(
        None, ge=0, description="How far below the champion's mean reward the challenger may be."
    )
    min_rewards: int = Field(10, ge=1, description="Rewards needed before rewards are judged.")
    grace_s: float = Field(
        300.0, ge=0, description="How long a replaced champion stays loaded, for a quick return."
    )
    drain_s: float = Field(
        5.0, ge=0, description="Wait between routing traffic away and unloading a version."
    )

    @field_validator("steps")
    @classmethod
    def _steps(cls, steps: list[float]) -> list[float]:
        return check_steps(steps)


def check_steps(steps: list[float]) -> list[float]:
    """Traffic steps must grow within (0, 100] and end at 100."""
    if not steps:
        raise ValueError("give at least one traffic step, e.g. [5, 25, 50, 100]")
    if any(not 0 < s <= 100 for s in steps):
        raise ValueError(f"each step is a percent within (0, 100], got {steps}")
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise ValueError(f"steps must grow, got {steps}")
    if steps[-1] != 100:
        raise ValueError(f"the last step must be 100 (the challenger takes all), got {steps}")
    return steps


class Health(BaseModel):
    """What recent traffic says about one version."""

    requests: int = 0
    errors: int = 0
    # Refused for a full queue (HTTP 429): neither an answer nor an error (requests counts them).
    queue_full: int = 0
    # Answered (2xx); None: every request that is neither an error nor a full queue's.
    answered: int | None = None
    p95_latency_s: float | None = None
    mean_reward: float | None = None
    rewards: int = 0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def served(self) -> int:
        """Requests the model answered or failed: what says anything of the model."""
        answered = self.requests - self.errors - self.queue_full
        return (answered if self.answered is None else self.answered) + self.errors

    @property
    def refused(self) -> int:
        """Requests refused as the client's (4xx but 429) or given up by it (499)."""
        return max(0, self.requests - self.served - self.queue_full)

    def describe(self) -> str:
        parts = [f"{self.errors}/{self.requests} errors"]
        if self.queue_full:
            parts.append(f"{self.queue_full} refused for a full queue")
        if self.p95_latency_s is not None:
            parts.append(f"p95 {self.p95_latency_s * 1000:.0f} ms")
        if self.mean_reward is not None:
            parts.append(f"mean reward {self.mean_reward:.3f} (n={self.rewards})")
        return ", ".join(parts)


class Verdict(BaseModel):
    kind: Literal["healthy", "unhealthy", "insufficient"]
    reasons: tuple[str, ...] = ()


class Move(BaseModel):
    """What the canary does next."""

    kind: Literal["hold", "advance", "promote", "rollback"]
    reason: str


class AgentState(BaseModel):
    """Where one agent's rollout stands; the controller's memory across restarts."""

    agent: str
    phase: Phase = Phase.STABLE
    champion: int | None = None
    challenger: int | None = None
    step: int = Field(0, ge=0)
    step_started_at: float | None = None
    # The signal source's counters when the step began (gateway metrics are cumulative).
    baseline: dict[str, Any] | None = None
    # Versions to unload, and when: a replaced champion after the grace period, a
    # rolled-back challenger once traffic has drained.
    retiring: dict[int, float] = Field(default_factory=dict)
    # Versions that failed to deploy, and when to try again.
    retry_at: dict[int, float] = Field(default_factory=dict)
    # Challengers whose vLLM engine reload failed with the engine serving on, how often.
    reload_failures: dict[int, int] = Field(default_factory=dict)
    # Challengers rolled back while MLflow could not be read, and why: MLflow is told
    # (the rollback tag, the challenger alias removed) before the next pass reads its aliases.
    unrecorded_rollbacks: dict[int, str] = Field(default_factory=dict)
    # The champion's figures over the last canary step in which it had traffic enough to
    # compare with: the reference of a step that sends it none (the last, at 100%).
    champion_reference: Health | None = None
    last_action: str | None = None
    last_reason: str | None = None
    updated_at: float = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _consistent(self) -> AgentState:
        if self.phase != Phase.STABLE and self.challenger is None:
            raise ValueError(f"phase {self.phase} needs a challenger")
        return self


class ControllerState(BaseModel):
    """Every agent's state, as persisted."""

    format: Literal[1] = 1
    agents: dict[str, AgentState] = Field(default_factory=dict)


class Decision(BaseModel):
    """One thing the controller decided, for the log, the metrics and the event trail."""

    agent: str
    action: Action
    version: int | None = None
    reason: str
    at: float = Field(default_factory=time.time)
    weight: float | None = None  # the challenger's percent of traffic after the decision
    health: Health | None = None

    def message(self) -> str:
        subject = f"{self.agent} v{self.version}" if self.version is not None else self.agent
        share = f" ({self.weight:g}% of traffic)" if self.weight is not None else ""
        return f"{subject}: {self.action}{share}: {self.reason}"
