"""Where spanmill keeps files on this machine; one root, overridable with SPANMILL_HOME."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """Root for models, state and helper binaries: ``$SPANMILL_HOME`` or ``~/.cache/spanmill``."""
    configured = os.environ.get("SPANMILL_HOME", "").strip()
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "spanmill"


def models_dir() -> Path:
    return home() / "models"


def state_dir() -> Path:
    return home() / "state"


def bin_dir() -> Path:
    return home() / "bin"
