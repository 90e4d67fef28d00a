"""Compiling the flywheel, and running it with kfp's local runner (no cluster needed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# The compiled package users upload; committed, and checked fresh by a test.
DEFAULT_PACKAGE = Path(__file__).resolve().parents[3] / "pipelines" / "flywheel.yaml"


def compile_pipeline(out: Path) -> Path:
    from kfp import compiler

    from pipelines.flywheel import flywheel

    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(flywheel, str(out))
    return out


def run_local(pipeline_root: Path, package: Path = DEFAULT_PACKAGE, **params: Any) -> None:
    """Run the compiled flywheel (the file users upload) in subprocesses of this environment.

    Connections come from the ``SPANMILL_*`` environment, as on a cluster they come
    from the chart's ConfigMap and Secrets (:mod:`spanmill.pipeline.cluster`); the
    other cluster settings (GPU, node selector) have no effect here, and kfp warns
    about them once per task.
    """
    import kfp.local
    from kfp import components

    flywheel = components.load_component_from_file(str(package))
    # Each task first runs `python3 -m pip install kfp` with the first python3 on
    # PATH: make that this environment's, where kfp is already installed.
    bin_dir = str(Path(sys.executable).parent)
    if not os.environ.get("PATH", "").startswith(bin_dir):
        os.environ["PATH"] = os.pathsep.join((bin_dir, os.environ.get("PATH", "")))
    pipeline_root.mkdir(parents=True, exist_ok=True)
    kfp.local.init(
        runner=kfp.local.SubprocessRunner(use_venv=False),
        pipeline_root=str(pipeline_root),
        raise_on_error=True,
    )
    flywheel(**params)
