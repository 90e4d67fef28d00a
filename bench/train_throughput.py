"""Training throughput: the spanmill trainer against a plain transformers loop, same run.

Same model (SmolLM2-135M-Instruct), same LoRA (r=16 on every projection), same
calculator samples, same number of optimizer steps and samples per step. Each
configuration runs in its own process so that its peak RSS is its own:

- ``plain``: a hand-written loop: chat template, right padding, prompt tokens
  masked out of the loss, AdamW; the full logits are materialised;
- ``spanmill``: :func:`spanmill.train.train` (TRL's SFTTrainer, padded batches);
- ``spanmill packed``: the same with packing (padding-free, best-fit decreasing).

Prints tokens/s (real tokens, padding excluded), peak RSS and the ratio to the
plain loop. ``SPANMILL_BENCH_TRAIN_STEPS`` (default 8) and
``SPANMILL_BENCH_TRAIN_PRECISION`` (default bf16 where the CPU computes it natively,
else fp32) change the run.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BATCH = 8
LEARNING_RATE = 3e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_spanmill(model: str, dataset: Path, steps: int, precision: str, packing: bool) -> dict:
    from spanmill.train import TrainSettings, train

    # Three packed rows of 512 tokens hold about the real tokens of a padded batch of
    # eight here; longer rows pay attention over the whole row (no varlen kernels on a CPU).
    settings = TrainSettings(
        base_model=model,
        max_steps=steps,
        batch_size=3 if packing else BATCH,
        max_length=512,
        packing=packing,
        precision=precision,  # type: ignore[arg-type]
        learning_rate=LEARNING_RATE,
        track=False,
        eval_loss=False,
        save_steps=10_000,
        num_threads=os.cpu_count() or 1,
    )
    with tempfile.TemporaryDirectory() as out:
        result = train(dataset, Path(out), settings)
    tokens = result.metrics.get("train_tokens_per_second", 0.0) * result.metrics["train_runtime_s"]
    return {"tokens": tokens, "seconds": result.metrics["train_runtime_s"], "steps": steps}


def run_plain(model_path: str, dataset: Path, steps: int, precision: str) -> dict:
    import pyarrow.parquet as pq
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=TARGETS)
    model = get_peft_model(model, lora)
    model.train()
    rows = pq.read_table(dataset / "train.parquet").to_pylist()
    examples = []
    for row in rows:
        prompt = tokenizer.apply_chat_template(
            row["prompt"], add_generation_prompt=True, return_dict=False
        )
        full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], return_dict=False)
        prompt_ids = list(prompt)
        full_ids = list(full)
        labels = [-100] * len(prompt_ids) + full_ids[len(prompt_ids) :]
        examples.append((full_ids, labels))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tokens = 0
    started = time.perf_counter()
    for step in range(steps):
        batch = [examples[(step * BATCH + i) % len(examples)] for i in range(BATCH)]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((BATCH, width), pad)
        labels = torch.full((BATCH, width), -100)
        mask = torch.zeros((BATCH, width), dtype=torch.long)
        for i, (ids, lab) in enumerate(batch):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, : len(lab)] = torch.tensor(lab)
            mask[i, : len(ids)] = 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        tokens += int(mask.sum())
    return {"tokens": tokens, "seconds": time.perf_counter() - started, "steps": steps}


def worker(kind: str, model: str, dataset: str, steps: int, precision: str) -> None:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    if kind == "plain":
        figures = run_plain(model, Path(dataset), steps, precision)
    else:
        figures = run_spanmill(model, Path(dataset), steps, precision, packing=kind == "packed")
    figures["peak_rss_mb"] = _peak_rss_mb()
    print("RESULT " + json.dumps(figures), flush=True)


def measure(kind: str, model: str, dataset: Path, steps: int, precision: str) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "bench.train_throughput",
        kind,
        model,
        str(dataset),
        str(steps),
        precision,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    raise RuntimeError(f"{kind} failed:\n{done.stderr[-3000:]}")


def main() -> None:
    from spanmill.models import pull_model
    from spanmill.paths import models_dir
    from spanmill.tasks import get_task
    from spanmill.train import write_reference_dataset

    steps = int(os.environ.get("SPANMILL_BENCH_TRAIN_STEPS", "8"))
    from spanmill.precision import bf16_native

    # bf16 where this CPU computes it natively, else fp32 (spanmill.precision says why).
    default = "bf16" if bf16_native("cpu") else "fp32"
    precision = os.environ.get("SPANMILL_BENCH_TRAIN_PRECISION", default)
    model = str(pull_model("smollm2-135m", models_dir()))
    with tempfile.TemporaryDirectory() as tmp:
        dataset = write_reference_dataset(
            get_task("calculator"), Path(tmp) / "dataset", n_train=200, n_eval=4
        )
        print(
            f"SmolLM2-135M, LoRA r=16 on all projections, {steps} steps, {precision}, "
            f"{os.cpu_count()} threads, calculator samples (~160 tokens each)"
        )
        results = {
            "plain loop": measure("plain", model, dataset, steps, precision),
            "spanmill": measure("padded", model, dataset, steps, precision),
            "spanmill packed": measure("packed", model, dataset, steps, precision),
        }
    baseline = results["plain loop"]["tokens"] / results["plain loop"]["seconds"]
    print(f"{'':16} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'peak RSS MB':>12} {'ratio':>6}")
    for name, figures in results.items():
        rate = figures["tokens"] / figures["seconds"]
        print(
            f"{name:16} {figures['tokens']:7.0f} {figures['seconds']:8.1f} {rate:9.1f} "
            f"{figures['peak_rss_mb']:12.0f} {rate / baseline:6.2f}"
        )


if __name__ == "__main__":
    if len(sys.argv) == 6:
        worker(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        main()
