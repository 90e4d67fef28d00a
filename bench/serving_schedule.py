"""Continuous batching against static batches, for agent episodes in flight.

Agent episodes call the model turn after turn, each turn as soon as its tool
returned, so requests arrive staggered. The baseline is the scheduling the Python
flavour had before: whenever the model is free it takes every request waiting (up
to 32) and generates them as one static batch (Triton's dynamic batcher with no
queue delay, :func:`spanmill.serving.generation.generate_all`), so a request that
arrives a moment late waits for the whole batch, and every batch lasts as long as
its longest reply. The other is :class:`spanmill.serving.batcher.ContinuousBatcher`.
Both run in this process on SmolLM2-135M with the prefix cache, a fresh model for
each run, the same calculator episodes (held-out instances, greedy): zero-shot (the
base model's replies run long and vary) and few-shot. Prints the wall time, the
ratio to the baseline in the same run, and the p50/p95 latency of one model call.
``SPANMILL_BENCH_SCHEDULE_EPISODES`` (32) and ``_IN_FLIGHT`` (16) size it.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class StaticBatches:
    """Whenever free, one static batch of everything waiting (up to ``max_rows``)."""

    def __init__(self, generator: Any, max_rows: int = 32) -> None:
        from spanmill.serving.generation import generate_all

        self.generate_all = generate_all
        self.generator = generator
        self.max_rows = max_rows
        self.waiting: list[tuple[Any, Callable[[Any], None]]] = []
        self.wake = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def submit(self, request: Any, done: Callable[[Any], None]) -> None:
        with self.wake:
            self.waiting.append((request, done))
            self.wake.notify()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.wake:
            self.stopping = True
            self.wake.notify()
        self.thread.join()

    def _serve(self) -> None:
        while True:
            with self.wake:
                while not self.waiting and not self.stopping:
                    self.wake.wait()
                if self.stopping:
                    return
                batch, self.waiting = self.waiting[: self.max_rows], self.waiting[self.max_rows :]
            results = self.generate_all(self.generator, [request for request, _ in batch])
            for (_, done), result in zip(batch, results, strict=True):
                done(result)


def play(scheduler: Any, task: Any, instances: list[Any], style: str, in_flight: int) -> tuple:
    from spanmill.messages import to_model_messages
    from spanmill.serving.generation import Request
    from spanmill.serving.protocol import GenerationParams
    from spanmill.tasks.loop import EpisodeLoop

    params = GenerationParams(max_tokens=96)
    latencies: list[float] = []

    def ask(request: Any) -> Any:
        answered = threading.Event()
        box: list[Any] = []

        def done(result: Any) -> None:
            box.append(result)
            answered.set()

        scheduler.submit(request, done)
        answered.wait()
        if isinstance(box[0], Exception):
            raise box[0]
        return box[0]

    def episode(instance: Any) -> bool:
        loop = EpisodeLoop(task, instance, style)
        while not loop.done:
            asked = time.perf_counter()
            result = ask(Request(to_model_messages(loop.messages), params))
            latencies.append(time.perf_counter() - asked)
            call = loop.add_reply({"role": "assistant", "content": result.choices[0].text})
            if call is not None:
                outcome = loop.run_tool(call)
                loop.add_tool_result(call.id or f"call_{loop.calls}", outcome.content)
        return loop.verdict().primary.value >= 1.0

    scheduler.start()
    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(in_flight) as pool:
            successes = sum(pool.map(episode, instances))
    finally:
        scheduler.stop()
    return time.perf_counter() - started, successes, latencies


def main() -> None:
    from spanmill.models import pull_model
    from spanmill.serving.batcher import ContinuousBatcher
    from spanmill.serving.generation import Generator
    from spanmill.tasks import get_task

    episodes = int(os.environ.get("SPANMILL_BENCH_SCHEDULE_EPISODES", "32"))
    in_flight = int(os.environ.get("SPANMILL_BENCH_SCHEDULE_IN_FLIGHT", "16"))
    path = str(pull_model("smollm2-135m"))
    task = get_task("calculator")
    instances = task.instances("heldout", episodes, seed=11)
    print(f"{episodes} calculator episodes, {in_flight} in flight, SmolLM2-135M, greedy")
    for style in ("zero_shot", "few_shot"):
        baseline = 0.0
        for name, make in (
            ("static batches", lambda g: StaticBatches(g)),
            ("continuous", lambda g: ContinuousBatcher(g, max_rows=32)),
        ):
            generator = Generator(path, dtype="auto")
            seconds, successes, latencies = play(make(generator), task, instances, style, in_flight)
            baseline = baseline or seconds
            cuts = statistics.quantiles(latencies, n=20)
            print(
                f"  {style:<9} {name:<15} {seconds:6.1f} s  {baseline / seconds:4.2f}x  "
                f"call p50 {statistics.median(latencies):5.2f} s  p95 {cuts[18]:5.2f} s  "
                f"success {successes}/{episodes}",
                flush=True,
            )


if __name__ == "__main__":
    main()
