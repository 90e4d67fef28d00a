"""Fixtures of the chart tests: the real helm binary and the chart rendered per value set.

helm comes from ``$SPANMILL_HOME/bin/helm`` or ``.cache/spanmill/bin/helm`` (where
``make install`` puts it); when neither is there it is fetched once per session with
``infra/local/fetch-helm.sh``, never skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CHART, ROOT, VALUE_SETS, Rendered, parse, template


def _helm_candidates() -> list[Path]:
    candidates = []
    home = os.environ.get("SPANMILL_HOME", "").strip()
    if home:
        candidates.append(Path(home).expanduser() / "bin" / "helm")
    candidates.append(ROOT / ".cache" / "spanmill" / "bin" / "helm")
    return candidates


@pytest.fixture(scope="session")
def helm() -> Path:
    for candidate in _helm_candidates():
        if os.access(candidate, os.X_OK):
            return candidate
    target = _helm_candidates()[0]
    subprocess.run(
        [str(ROOT / "infra" / "local" / "fetch-helm.sh"), str(target.parent)],
        env={**os.environ, "PYTHON": sys.executable},
        check=True,
        timeout=600,
    )
    assert os.access(target, os.X_OK), f"fetch-helm.sh did not produce {target}"
    return target


@pytest.fixture(scope="session")
def render_set(helm: Path) -> Any:
    """Render a ci/ value set once per session: ``render_set("defaults")``."""
    cache: dict[str, Rendered] = {}

    def render(name: str) -> Rendered:
        if name not in cache:
            result = template(helm, [CHART / "ci" / f"{name}.yaml"])
            assert result.returncode == 0, f"helm template with ci/{name}.yaml:\n{result.output}"
            cache[name] = parse(name, result.stdout)
        return cache[name]

    return render


@pytest.fixture(params=VALUE_SETS)
def rendered(request: pytest.FixtureRequest, render_set: Any) -> Rendered:
    """The chart rendered with each ci/ value set in turn."""
    result: Rendered = render_set(request.param)
    return result


@pytest.fixture(scope="session")
def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values
