"""Names in the model registry that people, the pipeline and the controller all rely on.

One registered model per agent, named after the agent; the Triton model and the
gateway route carry the same name, so a reader can follow one agent from MLflow
to Triton to a client's ``model`` field without a lookup table. Every tag spanmill
writes starts with ``spanmill.`` and is defined here.
"""

from __future__ import annotations

import re
from typing import Final, Literal

from spanmill.errors import SpanmillError

CHAMPION: Final = "champion"
CHALLENGER: Final = "challenger"

# Registered model tags.
TAG_AGENT: Final = "spanmill.agent"
TAG_PREVIOUS_CHAMPIONS: Final = "spanmill.champion.history"

# Version tags: what the version is and how to serve it.
TAG_KIND: Final = "spanmill.kind"
TAG_BASE_MODEL: Final = "spanmill.base_model"  # the trainer writes the same key on its run
# Lineage.
TAG_DATASET_DIGEST: Final = "spanmill.dataset.digest"
TAG_DATASET_NAME: Final = "spanmill.dataset.name"
TAG_SPAN_WINDOW: Final = "spanmill.dataset.span_window"
TAG_TRAIN_RUN: Final = "spanmill.train.run_id"
TAG_TRAIN_METHOD: Final = "spanmill.train.method"
TAG_TRAIN_SETTINGS: Final = "spanmill.train.settings"
TAG_EVAL_RUN: Final = "spanmill.eval.run_id"
EVAL_METRIC_PREFIX: Final = "spanmill.eval."
TAG_GATE: Final = "spanmill.gate.decision"
TAG_GATE_REASONS: Final = "spanmill.gate.reasons"
TAG_PIPELINE_RUN: Final = "spanmill.pipeline.run_id"
# Registering a trained version takes several MLflow calls; the version says "pending"
# from its creation until its alias and gate verdict are written, then "complete", so
# that a failure in between leaves nothing the rollout serves and a retry can finish
# it. A version without the tag was registered in one call.
TAG_REGISTRATION: Final = "spanmill.registration"
REGISTRATION_PENDING: Final = "pending"
REGISTRATION_COMPLETE: Final = "complete"
# What the rollout controller did with the version.
TAG_ROLLOUT_STATUS: Final = "spanmill.rollout.status"
TAG_ROLLOUT_REASON: Final = "spanmill.rollout.reason"
ROLLOUT_EVENT_PREFIX: Final = "spanmill.rollout.event."

# adapter: a LoRA adapter on ``spanmill.base_model``; model: a full (merged) model;
# base: the base model itself, served as it is; echo: answers with the last user
# message, a version with no compute for measuring everything around the model.
Kind = Literal["adapter", "model", "base", "echo"]
KINDS: Final[tuple[Kind, ...]] = ("adapter", "model", "base", "echo")

RolloutStatus = Literal["deploying", "canary", "promoted", "rolled_back", "retired"]
ROLLED_BACK: Final = "rolled_back"

# What Triton accepts as a model name; the agent name becomes one.
_AGENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class RegistryError(SpanmillError):
    """The model registry could not be read or written, or holds something unexpected."""


def check_agent(agent: str) -> str:
    if not _AGENT.match(agent):
        raise RegistryError(
            f"agent name {agent!r} must start with a letter or digit and hold only letters, "
            "digits, '_', '.' or '-' (it names the registered model, the Triton model and "
            "the gateway route)"
        )
    return agent


def registered_model(agent: str) -> str:
    """The MLflow registered model of an agent."""
    return check_agent(agent)


def triton_model(agent: str) -> str:
    """The Triton model of an agent; its versions are the registered model's versions."""
    return check_agent(agent)


def triton_candidate_model(agent: str) -> str:
    """The Triton model where an evaluation stages a challenger that is not registered yet.

    Apart from the agent's own model, so the versions there stay the registered
    ones; the gateway never routes to it.
    """
    return f"{check_agent(agent)}.candidate"


def route(agent: str) -> str:
    """The gateway route (the ``model`` a client asks for) of an agent."""
    return check_agent(agent)


def lora_name(agent: str, version: int) -> str:
    """The LoRA adapter name a vLLM version serves a registered version under."""
    return f"{check_agent(agent)}-v{version}"
