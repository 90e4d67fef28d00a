"""Which number format a model computes in, decided on the device it runs on.

bf16 halves the memory of fp32 and, where the hardware multiplies bf16 itself (a GPU
that supports it; an x86 CPU with AVX512-BF16 or AMX), is the faster format. Where it
does not, torch computes bf16 matrix products on a scalar path: on an AVX2-only CPU
(this project's 2-core machine on 2026-12-05, an AMD EPYC) a SmolLM2-135M training
step took 22 times as long in bf16 as in fp32, and a forward pass 6 times. So the
``auto`` format, the default for training and serving, is bf16 only where it is native
and fp32 elsewhere; a format asked for by name is used as asked.

The decision is made where the weights load (the training job's node, the Triton
instance), not where a version folder or a pipeline run is written: one model
repository can be served by GPU and CPU instances alike.
"""

from __future__ import annotations

import logging
from typing import Literal

log = logging.getLogger(__name__)

Dtype = Literal["float32", "bfloat16", "float16"]
# Serving's formats, by torch's names; "auto" as above.
ServingDtype = Literal["auto", "float32", "bfloat16", "float16"]


def bf16_native(device: str = "cpu") -> bool:
    """Whether ``device`` ("cpu", "cuda", "cuda:1") multiplies bf16 matrices in hardware."""
    import torch

    if device.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    # The instructions oneDNN's bf16 kernels use. Without them (AVX2 alone, or AVX-512
    # without its BF16 extension) bf16 is emulated, and slower than fp32.
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve(requested: ServingDtype, device: str = "cpu") -> Dtype:
    """The format a model loads in on ``device``: ``requested``, with ``auto`` decided."""
    if requested != "auto":
        if requested == "bfloat16" and not bf16_native(device):
            log.warning(
                "bfloat16 was asked for on %s, which computes it without hardware support; "
                "float32 (or dtype auto) is several times faster there",
                device,
            )
        return requested
    return "bfloat16" if bf16_native(device) else "float32"
