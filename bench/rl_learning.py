"""Learning figures: base, SFT from production successes, then GRPO, on held-out instances.

``python -m bench.rl_learning [--task calculator] [--grpo-steps 14] ...`` (about
35 minutes on two cores; ``make bench`` leaves it out, it runs only when named).
Every stage runs the task's own episode code against spanmill's gateway over the
policy served in-process, with a broker of its own (tansu) for the spans:

1. **base**: the base model, zero-shot, greedy, on ``--heldout`` held-out instances;
2. **production**: the base model with the task's few-shot prompt answers
   ``--production`` training instances; its successful episodes, read back from
   their spans, become an SFT dataset with the examples distilled away (the
   dataset builder's own code) and train a LoRA adapter (spanmill.train.train);
3. **sft**: that adapter, zero-shot, greedy, on the same held-out instances;
4. **grpo**: GRPO from the SFT adapter (spanmill.train.rl.train_grpo) on
   training instances, then the same held-out evaluation.

Printed: each stage's success rate with a bootstrap 95% interval, the paired
difference to the stage before it with its interval, rollout throughput
(episodes/s), the GRPO step time and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path
from statistics import fmean
from typing import Any

EXPLICIT_ONLY = True  # python -m bench runs it only when named


def _served(model_dir: str, adapter: str | None) -> Any:
    """The model (with the adapter merged) served in-process, on the GPU if any; bf16 where
    the device computes it natively, else fp32 (``spanmill.precision``)."""
    from spanmill.serving.generation import Generator
    from spanmill.train.policy import PolicyServer
    from spanmill.train.rl import placement
    from spanmill.train.settings import TrainSettings

    generator = Generator(model_dir, adapter, dtype="auto")
    device, _ = placement(TrainSettings(track=False))
    model = generator.model.to(device)
    return PolicyServer(model, generator.tokenizer, max_tokens_limit=128)


def _evaluate(
    task: Any, model_dir: str, adapter: str | None, n: int, kafka: Any, label: str
) -> tuple[dict[str, float], float]:
    """Success per held-out instance id, zero-shot and greedy; and episodes/s."""
    from spanmill import sdk
    from spanmill.tasks.runner import run_agent
    from spanmill.train.policy import RolloutGateway

    policy = _served(model_dir, adapter)
    sdk.configure(f"{task.agent_name}-evaluation", kafka=kafka, agent_name=task.agent_name,
                  set_global=False)  # fmt: skip
    started = time.perf_counter()
    try:
        with RolloutGateway(policy, task.agent_name, kafka) as gateway:
            report = run_agent(
                task, n, gateway.base_url, task.agent_name, split="heldout", concurrency=32
            )
    finally:
        sdk.shutdown()
    seconds = time.perf_counter() - started
    scores = {e.instance.id: e.score("success") for e in report.episodes}
    print(f"  {label}: success {fmean(scores.values()):.3f} on {len(scores)} held-out "
          f"({len(scores) / seconds:.2f} episodes/s)", flush=True)  # fmt: skip
    return scores, len(scores) / seconds


def _production_dataset(task: Any, model_dir: str, n: int, kafka: Any, out: Path) -> int:
    """The base model's few-shot episodes on training instances, successes as an SFT set."""
    from spanmill import sdk
    from spanmill.dataset.build import build
    from spanmill.dataset.output import write_dataset
    from spanmill.dataset.spec import DatasetSpec
    from spanmill.tasks.runner import run_agent
    from spanmill.train.policy import RolloutGateway
    from spanmill.train.rollouts import RolloutReader

    policy = _served(model_dir, None)
    sdk.configure(f"{task.agent_name}-production", kafka=kafka, agent_name=task.agent_name,
                  set_global=False)  # fmt: skip
    reader = RolloutReader(kafka, kafka.spans_topic)
    try:
        # Production traffic, unmarked: what the dataset builder learns from.
        with RolloutGateway(policy, task.agent_name, kafka, traffic=None) as gateway:
            report = run_agent(
                task, n, gateway.base_url, task.agent_name, split="train",
                prompt_style="few_shot", concurrency=32, seed=1,
            )  # fmt: skip
        sdk.force_flush()
        finished = [e for e in report.episodes if e.error is None]
        table = reader.read(finished, timeout_s=300)
    finally:
        reader.close()
        sdk.shutdown()
    spec = DatasetSpec(mode="sft", min_reward=1.0, drop_examples=True, eval_fraction=0.0)
    built = build(spec, table)
    write_dataset(built, out, kafka.spans_topic)
    print(f"  production: {report.success_rate:.3f} success few-shot on {report.n} training "
          f"instances; {built.counts['train']} SFT rows", flush=True)  # fmt: skip
    return int(built.counts["train"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rl_learning")
    parser.add_argument("--task", default="calculator")
    parser.add_argument("--heldout", type=int, default=100)
    parser.add_argument("--production", type=int, default=500)
    parser.add_argument("--sft-steps", type=int, default=90)
    parser.add_argument("--grpo-steps", type=int, default=14)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--grpo-lr", type=float, default=1e-4)
    parser.add_argument("--out", type=Path, default=None, help="Keep the adapters here.")
    parser.add_argument(
        "--sft", type=Path, default=None,
        help="Start GRPO from this SFT adapter (an earlier run's OUT/sft) instead of making one.",
    )  # fmt: skip
    args = parser.parse_args(argv)

    from spanmill.config import KafkaSettings
    from spanmill.evaluate.stats import bootstrap_difference
    from spanmill.models import pull_model
    from spanmill.paths import models_dir
    from spanmill.stack.ports import free_port
    from spanmill.stack.services import KafkaBroker
    from spanmill.tasks import get_task
    from spanmill.train import TrainSettings, train
    from spanmill.train.rl import train_grpo

    task = get_task(args.task)
    base = str(pull_model("smollm2-135m", models_dir()))
    work = Path(args.out or tempfile.mkdtemp(prefix="rl-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    broker = KafkaBroker("127.0.0.1", free_port(), work / "kafka", partitions=2,
                         topics=("rl-production", "rl-rollouts"))  # fmt: skip
    running = broker.start()
    kafka = KafkaSettings(
        bootstrap_servers=running.url, spans_topic="rl-production", rollouts_topic="rl-rollouts"
    )
    rows: list[tuple[str, dict[str, float]]] = []
    try:
        print(f"{task.name}: base, SFT from production successes, GRPO from SFT", flush=True)
        scores, base_rate = _evaluate(task, base, None, args.heldout, kafka, "base")
        rows.append(("base", scores))
        sft = args.sft or work / "sft"
        if args.sft is None:
            dataset = work / "production-dataset"
            _production_dataset(task, base, args.production, kafka, dataset)
            clock = time.perf_counter()
            train(dataset, sft, TrainSettings(
                base_model=base, max_steps=args.sft_steps, batch_size=8, learning_rate=3e-4,
                precision="auto", track=False, eval_loss=False,
            ))  # fmt: skip
            print(f"  sft: {args.sft_steps} steps in {time.perf_counter() - clock:.0f}s")
        scores, _ = _evaluate(task, base, str(sft), args.heldout, kafka, "sft")
        rows.append(("sft", scores))
        grpo = work / "grpo"
        settings = TrainSettings(
            base_model=base, method="grpo", task=task.name, init_adapter=str(sft),
            max_steps=args.grpo_steps, group_size=args.group_size,
            groups_per_step=args.groups_per_step, rollout_temperature=args.temperature,
            learning_rate=args.grpo_lr, warmup_ratio=0.0, lr_scheduler="constant",
            batch_size=8, precision="auto", track=False, save_steps=1000,
        )  # fmt: skip

        def on_step(step: int, stats: dict[str, float]) -> None:
            print(f"    grpo step {step}: reward {stats['reward_mean']:.3f}, "
                  f"{int(stats['groups_with_signal'])}/{int(stats['groups'])} groups with "
                  f"signal, rollout {stats['rollout_s']:.0f}s, train {stats['train_s']:.0f}s",
                  flush=True)  # fmt: skip

        result = train_grpo(grpo, settings, kafka, on_step=on_step)
        scores, _ = _evaluate(task, base, str(grpo), args.heldout, kafka, "grpo")
        rows.append(("grpo", scores))
    finally:
        running.stop()

    print(f"\n{task.name}, {args.heldout} held-out instances, zero-shot, greedy")
    print(f"{'stage':<6} {'success':>8} {'95% CI':>15} {'vs before':>10} {'95% CI':>17}")
    previous: dict[str, float] | None = None
    for name, scores in rows:
        values = list(scores.values())
        rate = bootstrap_difference(values, [0.0] * len(values))  # the rate's own interval
        line = f"{name:<6} {rate.estimate:>8.3f} [{rate.low:.3f}, {rate.high:.3f}]".ljust(33)
        if previous is not None:
            shared = sorted(set(scores) & set(previous))
            diff = bootstrap_difference([scores[i] for i in shared], [previous[i] for i in shared])
            line += f" {diff.estimate:>+10.3f} [{diff.low:+.3f}, {diff.high:+.3f}]"
        print(line)
        previous = scores
    metrics = result.metrics
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\nrollout (greedy evaluation of the base): {base_rate:.2f} episodes/s; GRPO: "
        f"{metrics.get('episodes_per_s', 0):.2f} episodes/s sampled, "
        f"{metrics.get('step_s', 0):.0f}s a step ({args.groups_per_step}x{args.group_size} "
        f"episodes), {metrics['train_runtime_s'] / 60:.1f} min for {args.grpo_steps} steps; "
        f"peak RSS {peak:.0f} MiB"
    )
    (work / "figures.json").write_text(json.dumps(
        {"rows": {n: s for n, s in rows}, "grpo": metrics, "args": vars(args)},
        indent=2, default=str,
    ))  # fmt: skip
    print(f"details: {work / 'figures.json'}")


if __name__ == "__main__":
    main()
