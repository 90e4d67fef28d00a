"""The one-machine demo: the loop turns once, every part real.

Production pattern (see the README): the agent in production uses an expensive
few-shot prompt (worked examples as real chat turns). Its successful episodes,
recorded as spans through the gateway, Kafka and the collector, are re-targeted
to the short zero-shot prompt and distilled into a LoRA adapter: context
distillation. The short prompt then serves, cheaper and better.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spanmill.config import (
    KafkaSettings,
    MLflowSettings,
    RolloutSettings,
    StackSettings,
    TritonSettings,
)
from spanmill.stack.local import LocalStack
from spanmill.stack.services import RunningService

AGENT = "calculator"
BASE = "smollm2-135m"


@dataclass(frozen=True)
class DemoPlan:
    """Sizes that keep the whole demo within about 20 minutes on two cores."""

    eval_episodes: int = 100
    # 240 episodes and 60 steps gave 58% and 62% held-out success (2026-12-05); the loss
    # levels off near step 25, and 200 episodes keep about 90 successes to train on, 45
    # steps about two epochs of them: the whole demo, install included, stays under 20
    # minutes on two AVX2 cores.
    traffic_episodes: int = 200
    max_steps: int = 45
    # The gate compares a base model that never answers with a candidate near 50%: 32
    # instances tell them apart.
    eval_instances: int = 32
    margin: float = 0.05
    # Episodes in flight at once: Triton's dynamic batcher generates their turns together
    # (up to its largest batch, spanmill.serving.protocol.MAX_BATCH_SIZE).
    concurrency: int = 32


def stack_urls(settings: StackSettings) -> dict[str, str]:
    host = settings.host
    return {
        "kafka": f"{host}:{settings.kafka_port}",
        "mlflow": f"http://{host}:{settings.mlflow_port}",
        "triton": f"{host}:{settings.triton_http_port}",
        "gateway": f"http://{host}:{settings.gateway_port}",
    }


def start_stack(
    settings: StackSettings, on_started: Callable[[RunningService], None] | None = None
) -> list[RunningService]:
    return LocalStack(settings).up(on_started=on_started)


def rollout_settings(settings: StackSettings, agent: str = AGENT) -> RolloutSettings:
    """A quick canary for the demo: half the traffic, then all of it."""
    urls = stack_urls(settings)
    return RolloutSettings(
        mlflow=MLflowSettings(tracking_uri=urls["mlflow"]),
        triton=TritonSettings(
            http_url=urls["triton"], model_repository=str(settings.model_repository)
        ),
        agents=[agent],
        steps=[50.0, 100.0],
        bake_s=5.0,
        min_requests=6,
        max_error_rate=0.2,
        grace_s=0.0,
        drain_s=1.0,
        gateway_urls=[urls["gateway"]],
        routing_file=settings.routing_file,
        state_file=settings.state_dir / "rollout-state.json",
    )


def serve_base_as_champion(settings: StackSettings, agent: str = AGENT) -> int:
    """Register the base model as the agent's first version and make it the champion."""
    from spanmill.models import pull_model
    from spanmill.registry import ModelRegistry

    registry = ModelRegistry(stack_urls(settings)["mlflow"])
    return registry.serve_base(agent, str(pull_model(BASE)))[0]


def reconcile_until(
    settings: StackSettings,
    done: Callable[[Any], bool],
    *,
    traffic: Callable[[], None] | None = None,
    timeout_s: float = 600.0,
    agent: str = AGENT,
) -> Any:
    """Run the rollout controller until ``done(state)``; ``traffic`` runs between ticks.

    Returns the final state and the decisions taken on the way (holds left out).
    """
    from spanmill.rollout.service import build_reconciler

    reconciler = build_reconciler(rollout_settings(settings, agent))
    deadline = time.monotonic() + timeout_s
    decisions: list[Any] = []
    try:
        while True:
            decisions.extend(d for d in reconciler.tick() if d.action != "hold")
            state = reconciler.state(agent)
            if state is not None and done(state):
                return state, decisions
            if time.monotonic() > deadline:
                raise TimeoutError(f"the rollout of {agent} did not settle: {state}")
            if traffic is not None:
                traffic()
            else:
                time.sleep(1.0)
    finally:
        reconciler.close()


def run_agent(
    settings: StackSettings,
    n: int,
    *,
    split: str,
    prompt_style: str,
    concurrency: int = 1,
    progress: Callable[[int, int, Any], None] | None = None,
) -> Any:
    from spanmill.tasks.runner import run_agent as run

    return run(
        AGENT, n, f"{stack_urls(settings)['gateway']}/v1", AGENT,
        split=split, prompt_style=prompt_style, concurrency=concurrency,  # type: ignore[arg-type]
        progress=progress,
    )  # fmt: skip


def wait_for_spans(settings: StackSettings, at_least: int, timeout_s: float = 120.0) -> int:
    """Until the collector has written ``at_least`` spans to the store."""
    from spanmill.store import SpanStore

    deadline = time.monotonic() + timeout_s
    count = 0
    while time.monotonic() < deadline:
        count = SpanStore(settings.span_store).count()
        if count >= at_least:
            return count
        time.sleep(1.0)
    return count


def run_flywheel(settings: StackSettings, plan: DemoPlan, root: Path) -> None:
    """The flywheel pipeline with kfp's local runner, against this stack."""
    from spanmill.pipeline.build import run_local

    urls = stack_urls(settings)
    run_local(
        root,
        agent=AGENT,
        store_url=settings.span_store,
        dataset_mode="sft",
        min_reward=1.0,
        drop_examples=True,
        base_model=BASE,
        max_steps=plan.max_steps,
        precision="auto",  # bf16 where the CPU computes it natively, else fp32
        eval_instances=plan.eval_instances,
        margin=plan.margin,
        triton_url=urls["triton"],
        model_repository=str(settings.model_repository),
        tracking_uri=urls["mlflow"],
    )


def kafka_settings(settings: StackSettings) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=stack_urls(settings)["kafka"])
