"""Training throughput and model FLOPs utilisation on a GPU, with a 0.5B-1.5B model.

Runs :func:`spanmill.train.train` (LoRA r=16 on every projection, bf16, packed
calculator samples) and prints tokens/s and MFU. Skipped without a GPU.

The model is ``SPANMILL_BENCH_GPU_MODEL`` (a folder or a Hugging Face id; on a
node with hub access ``Qwen/Qwen2.5-0.5B-Instruct`` or ``Qwen/Qwen2.5-1.5B-Instruct``).
Without it, a randomly initialised Qwen2.5-0.5B-shaped model is built with
SmolLM2's tokenizer: its weights are noise, but its FLOPs are those of the real
shape, which is all throughput depends on. ``SPANMILL_BENCH_GPU_STEPS`` (30),
``SPANMILL_BENCH_GPU_BATCH`` (8 packed rows of 2048 tokens) and
``SPANMILL_BENCH_GPU_PEAK_TFLOPS`` (else read from the device name) tune it.

MFU counts the FLOPs a LoRA step needs: forward (2N per token) and the backward
through the activations (2N); the frozen weights get no gradient. Attention
adds 4·layers·seq·hidden per token forward, twice that backward (packed rows
attend within their samples, so this slightly overstates it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

# Dense bf16 peak of common training GPUs, in TFLOP/s.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}
SEQ = 2048


def peak_tflops(device_name: str) -> float | None:
    configured = os.environ.get("SPANMILL_BENCH_GPU_PEAK_TFLOPS")
    if configured:
        return float(configured)
    return next((v for k, v in PEAK_TFLOPS.items() if k in device_name), None)


def flops_per_token(config: Any, seq: int) -> float:
    """LoRA training FLOPs per token: 4N for the matmuls plus attention, see the module doc."""
    hidden = config.hidden_size
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", heads)
    head_dim = hidden // heads
    per_layer = (
        hidden * hidden * 2  # q and o
        + hidden * kv_heads * head_dim * 2  # k and v
        + 3 * hidden * config.intermediate_size  # gate, up, down
    )
    matmul_params = layers * per_layer + hidden * config.vocab_size  # the LM head
    attention = 4 * layers * seq * hidden
    return 4 * matmul_params + 3 * attention


def random_model(folder: Path) -> str:
    """A Qwen2.5-0.5B-shaped model with random weights and SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from spanmill.models import pull_model
    from spanmill.paths import models_dir

    tokenizer = AutoTokenizer.from_pretrained(pull_model("smollm2-135m", models_dir()))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        print("no GPU on this machine: skipped (run `python -m bench train_gpu` on a GPU node)")
        return
    from transformers import AutoConfig

    from spanmill.tasks import get_task
    from spanmill.train import TrainSettings, train, write_reference_dataset

    steps = int(os.environ.get("SPANMILL_BENCH_GPU_STEPS", "30"))
    batch = int(os.environ.get("SPANMILL_BENCH_GPU_BATCH", "8"))
    device = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = os.environ.get("SPANMILL_BENCH_GPU_MODEL") or random_model(root / "model")
        dataset = write_reference_dataset(
            get_task("calculator"), root / "dataset", n_train=3000, n_eval=4
        )
        settings = TrainSettings(
            base_model=model,
            max_steps=steps,
            batch_size=batch,
            packing=True,
            max_length=SEQ,
            precision="bf16",
            track=False,
            eval_loss=False,
            save_steps=100_000,
        )
        torch.cuda.reset_peak_memory_stats()
        result = train(dataset, root / "adapter", settings)
        config = AutoConfig.from_pretrained(model)
    rate = result.metrics.get("train_tokens_per_second", 0.0)
    achieved = rate * flops_per_token(config, SEQ)
    peak = peak_tflops(device)
    print(f"{device}: {model}, LoRA r=16, bf16, {steps} steps of {batch}x{SEQ} packed tokens")
    print(f"tokens/s          {rate:12.0f}")
    print(f"achieved TFLOP/s  {achieved / 1e12:12.1f}")
    if peak:
        print(f"MFU               {achieved / (peak * 1e12):12.1%}  (peak {peak:.0f} TFLOP/s)")
    print(f"peak GPU memory   {torch.cuda.max_memory_allocated() / 2**30:12.1f} GiB")


if __name__ == "__main__":
    main()
