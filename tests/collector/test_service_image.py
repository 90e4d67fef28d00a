"""The collector image: multi-stage, pinned base, non-root, and only spanmill[collector]."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "services" / "collector" / "Dockerfile"


def test_dockerfile_is_lean_pinned_and_unprivileged() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert len(stages) == 2, "a build stage and a runtime stage"
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base is not None and re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base.group(1))
    installs = re.findall(r'install[^"\n]*"(?:spanmill|\.)\[([^\]]+)\]"', text)
    assert installs and set(installs) == {"collector"}
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert (ROOT / "services" / "collector" / "main.py").exists()


def test_the_image_builds_the_native_decoder() -> None:
    """The build stage compiles the C extension and fails if it did not; the runtime has no gcc."""
    text = DOCKERFILE.read_text()
    build, runtime = text.split("AS runtime")
    assert re.search(r"^COPY [^\n]*\bsetup\.py\b", build, re.M)
    assert "install -y --no-install-recommends gcc" in build
    assert 'python -c "import spanmill._native"' in build
    assert "gcc" not in runtime


def test_the_collector_needs_no_training_or_serving_stack() -> None:
    probe = (
        "import sys, spanmill.collector.run, spanmill.store, spanmill.cli.collector; "
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'transformers', 'tritonclient', 'mlflow', 'kfp', 'peft'}); print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
