"""How long a spanmill process waits on MLflow.

The MLflow client waits 120 s for an answer and retries 7 times with backoff by
default: one call to an MLflow that has gone quiet holds its caller about 20 minutes,
and a refused one about 4. The client reads its own variables at each call, so a
process bounds every call it makes by setting them: the rollout controller for the
length of its loop (:func:`bounded`, its own tighter bounds), every other entry point
(the CLI, each pipeline step) for the process, where the operator set none
(:func:`bound_by_default`, ``SPANMILL_MLFLOW_REQUEST_TIMEOUT_S`` and
``SPANMILL_MLFLOW_REQUEST_RETRIES``). Processes a step starts (torchrun's) inherit them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def request_env(timeout_s: int, retries: int) -> dict[str, str]:
    """The client's variables for one answer waited ``timeout_s`` and ``retries`` retries
    1, 2, 4... seconds apart."""
    return {
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
    }


def bound_by_default(timeout_s: int, retries: int) -> None:
    """Bound this process's MLflow calls, leaving any variable the operator set."""
    for name, value in request_env(timeout_s, retries).items():
        os.environ.setdefault(name, value)


@contextlib.contextmanager
def bounded(timeout_s: int, retries: int) -> Iterator[None]:
    """MLflow calls bounded so while the block runs; what the process had before is
    restored after."""
    bounds = request_env(timeout_s, retries)
    before = {name: os.environ.get(name) for name in bounds}
    os.environ.update(bounds)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
