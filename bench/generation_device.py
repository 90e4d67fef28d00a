"""Generation throughput of the Python flavour where its Triton instance runs.

Loads the served model the way a ``KIND_GPU`` instance does (the weights on
``cuda:0``) when a GPU is present, else as a ``KIND_CPU`` one, in the format a
served model takes there (bf16 where the device computes it natively, else fp32), and
prints tokens/s for one request and for a batch of concurrent requests, each
answering with up to ``SPANMILL_BENCH_GEN_TOKENS`` (64) tokens (tokens/s counts
the tokens the answers kept, up to their end). The model is
``SPANMILL_BENCH_GEN_MODEL`` (a folder, or a catalog name; SmolLM2-135M by
default). ``python -m bench generation_device``.
"""

from __future__ import annotations

import os
import time

BATCH = 32


def main() -> None:
    import torch

    from spanmill.models import pull_model
    from spanmill.serving.generation import Generator, instance_device
    from spanmill.serving.protocol import GenerationParams

    kind = "GPU" if torch.cuda.is_available() else "CPU"
    device = instance_device(kind, 0)
    name = os.environ.get("SPANMILL_BENCH_GEN_MODEL", "smollm2-135m")
    path = name if os.path.isdir(name) else str(pull_model(name))
    tokens = int(os.environ.get("SPANMILL_BENCH_GEN_TOKENS", "64"))
    generator = Generator(path, dtype="auto", device=device)
    dtype = str(generator.model.dtype).removeprefix("torch.")
    where = (
        torch.cuda.get_device_name(0) if kind == "GPU" else f"{torch.get_num_threads()} CPU threads"
    )
    print(f"generation on {device} ({where}), {name}, {dtype}, {tokens} tokens an answer")
    params = GenerationParams(max_tokens=tokens)
    question = [
        {"role": "user", "content": "Write a long story about a cat who travels the world."}
    ]
    generator.generate(question, GenerationParams(max_tokens=4))  # warm-up
    single = 0.0
    for batch in (1, BATCH):
        if kind == "GPU":
            torch.cuda.synchronize()
        started = time.perf_counter()
        results = generator.generate_batch([question] * batch, params)
        if kind == "GPU":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        produced = sum(len(r.choices[0].token_ids) for r in results)
        rate = produced / seconds
        single = single or rate
        print(f"  {batch:>3} request(s) together: {rate:8.1f} tokens/s, {rate / single:.1f}x one "
              f"request ({seconds:.2f} s for {produced} tokens)")  # fmt: skip


if __name__ == "__main__":
    main()
