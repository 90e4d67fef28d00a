"""Helpers of the rollout tests: client traffic, gateway counts, a controller driven tick by
tick, and kmock's API as the official client sees it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from spanmill.config import (
    GatewaySettings,
    KafkaSettings,
    MLflowSettings,
    RolloutSettings,
    ServingSettings,
    TritonSettings,
)
from spanmill.rollout.reconciler import Reconciler
from spanmill.rollout.schemas import Decision
from spanmill.rollout.service import build_reconciler

# -- the gateway and traffic ---------------------------------------------------------


@dataclass
class Outcome:
    at: float
    status: int
    version: str | None


@dataclass
class Traffic:
    """A client calling the gateway in a loop, remembering what answered each call."""

    url: str
    model: str
    system_prompt: bool = True
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Traffic:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": "You are a calculator."})
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                try:
                    response = client.post("/v1/chat/completions", json={
                        "model": self.model, "messages": messages, "max_tokens": 2,
                    })  # fmt: skip
                    version = response.headers.get("x-spanmill-model-version")
                    self.outcomes.append(Outcome(time.time(), response.status_code, version))
                except httpx.HTTPError:
                    self.outcomes.append(Outcome(time.time(), 0, None))
                # Leave the two cores to the gateway, Triton and the controller.
                self._stop.wait(0.01)

    def stop(self) -> list[Outcome]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        return list(self.outcomes)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200]


def gateway_settings(kafka: Any, triton: Any, **extra: Any) -> GatewaySettings:
    return GatewaySettings(
        kafka=KafkaSettings(bootstrap_servers=kafka.bootstrap_servers),
        triton=TritonSettings(http_url=triton.http_url),
        **extra,
    )


def version_counts(gateway_url: str, model: str) -> dict[tuple[str, str], float]:
    """The gateway's request counter for one route: (version, status) -> count."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{gateway_url}/metrics", timeout=10).text
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "spanmill_gateway_requests_total" and sample.labels["model"] == model:
                counts[(sample.labels["version"], sample.labels["status"])] = sample.value
    return counts


# -- the controller ------------------------------------------------------------------


class HeldClock:
    """Wall-clock time the test can stop and start again: while held it reads the held
    value; once let go it runs on from there, the held stretch left out. A controller on
    it sees a restart last exactly as long as the test says, however slow the machine."""

    def __init__(self) -> None:
        self._offset = 0.0
        self._held: float | None = None

    def __call__(self) -> float:
        return self._held if self._held is not None else time.time() - self._offset

    def hold(self, at: float) -> float:
        """Stop the clock at ``at`` or at its reading now, whichever is later."""
        self._held = max(self(), at)
        return self._held

    def release(self) -> None:
        if self._held is not None:
            self._offset = time.time() - self._held
            self._held = None


def new_agent() -> str:
    return f"calc-{uuid.uuid4().hex[:6]}"


@dataclass
class Controller:
    """A controller driven tick by tick from the test, recording each tick's effect."""

    settings: RolloutSettings
    reconciler: Reconciler
    decisions: list[Decision] = field(default_factory=list)

    def tick(self) -> list[Decision]:
        made = self.reconciler.tick()
        self.decisions.extend(d for d in made if d.action != "hold")
        return made

    def until(
        self,
        done: Callable[[], bool],
        *,
        timeout: float = 120.0,
        every: float = 0.2,
        each: Callable[[], None] | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.tick()
            if each is not None:
                each()
            if done():
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    "controller did not get there; decisions: "
                    + "; ".join(d.message() for d in self.decisions[-10:])
                )
            time.sleep(every)

    def actions(self) -> list[tuple[str, int | None]]:
        return [(d.action, d.version) for d in self.decisions]


def rollout_settings(mlflow_server: Any, triton: Any, tmp_path: Path, agent: str,
                     **extra: Any) -> RolloutSettings:  # fmt: skip
    values: dict[str, Any] = {
        "mlflow": MLflowSettings(tracking_uri=mlflow_server.tracking_uri),
        "triton": TritonSettings(http_url=triton.http_url,
                                 model_repository=str(triton.model_repository)),
        "agents": [agent],
        "steps": [20, 50, 100],
        "bake_s": 1.5,
        "min_requests": 5,
        "max_error_rate": 0.05,
        "grace_s": 2.0,
        "drain_s": 0.5,
        "state_file": tmp_path / f"{agent}-state.json",
        "smoke_timeout_s": 120,
        "retry_after_s": 5,
        # Each pass waits for the deployments it begins, however slow the machine: the
        # tests that count passes see each step in the pass that takes it. The tests of
        # deployments that outlast their pass set a short wait.
        "deploy_wait_s": 600,
        "stall_after_s": 1200,
        "serving": ServingSettings(num_threads=1),
    }  # fmt: skip
    values.update(extra)
    return RolloutSettings(**values)


def controller(settings: RolloutSettings, **parts: Any) -> Controller:
    return Controller(settings, build_reconciler(settings, **parts))
