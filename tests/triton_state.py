"""What a tests' Triton holds, read from its repository index."""

from __future__ import annotations

from spanmill.rollout.triton import TritonControl


def loaded_model(url: str, model: str) -> dict[int, str]:
    """The versions of ``model`` READY or LOADING on the Triton at ``url``."""
    control = TritonControl(url)
    try:
        states = control.versions(model)
    finally:
        control.close()
    return {v: state for v, state in states.items() if state in ("READY", "LOADING")}
