"""Fixtures of the chart tests: the real helm binary and the chart rendered per value set.

helm comes from ``$SPANMILL_HOME/bin/helm`` or ``.cache/spanmill/bin/helm`` (where
``make install`` puts it); when neither is there it is fetched once per session with
``infra/local/fetch-helm.sh``, never skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CHART, VALUE_SETS, Rendered, helm_binary, parse, template


@pytest.fixture(scope="session")
def helm() -> Path:
    return helm_binary()


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
