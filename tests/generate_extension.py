"""Triton's generate extension as tests need it without a server: a JSON body as the
input tensors the model receives, and output tensors as the JSON event the client reads.

The mapping follows the extension's documentation (each field names a tensor; a
one-element output comes as a scalar, a larger one flattened); the tests that run
tritonserver check the same paths for real.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spanmill.serving import protocol

_NUMPY = {"TYPE_STRING": np.object_, "TYPE_FP32": np.float32, "TYPE_INT32": np.int32,
          "TYPE_INT64": np.int64, "TYPE_BOOL": np.bool_}  # fmt: skip


def as_tensors(body: dict[str, Any]) -> dict[str, np.ndarray]:
    """The batch-of-one input tensors Triton hands the model for a generate body."""
    tensors = {}
    for name, value in body.items():
        dtype = _NUMPY[protocol.INPUTS[name][0]]
        values = value if isinstance(value, list) else [value]
        if dtype is np.object_:
            values = [str(v).encode() for v in values]
        tensors[name] = np.array([values], dtype=dtype)
    return tensors


def as_event(outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """The JSON event the generate extension sends for a response's output tensors."""
    event: dict[str, Any] = {"model_name": "model", "model_version": "1"}
    for name, array in outputs.items():
        flat = [v.decode() if isinstance(v, bytes) else v.item() for v in array.reshape(-1)]
        event[name] = flat[0] if len(flat) == 1 else flat
    return event
