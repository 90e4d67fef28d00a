"""A real model through the whole path: SmolLM2 in service, a LoRA adapter on it as challenger."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rollout_helpers import Traffic, controller, new_agent, rollout_settings, version_counts

from spanmill.contracts import EvalReport
from spanmill.gateway.routing import RoutingFile
from spanmill.registry import CHALLENGER, CHAMPION, Lineage
from spanmill.rollout.triton import TritonControl

pytestmark = pytest.mark.services


def test_a_lora_adapter_is_canaried_and_promoted_over_smollm2(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, smollm2_dir: Path, smollm2_lora: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    url, routes = gateway
    agent = new_agent()
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url], steps=[50, 100], bake_s=1.0,
                                min_requests=3, grace_s=0.0)  # fmt: skip
    ctl = controller(settings)
    base = registry.register(agent, Lineage(kind="base", base_model=str(smollm2_dir))).version
    registry.promote(agent, base)
    ctl.until(lambda: registry.aliases(agent).get(CHAMPION) == base and
              RoutingFile(routes).current().routes.get(agent) is not None, timeout=180)  # fmt: skip

    # Registered the way the pipeline does it: the adapter folder and the gate's metrics.
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"decision": {"promote": True, "reasons": ["better"]},
                                   "metrics": {"tasks.challenger.success_rate": 0.6}}))  # fmt: skip
    registration = registry.register_trained(agent, smollm2_lora, EvalReport.load(metrics))
    assert registration.challenger
    adapter = registration.version.version
    traffic = Traffic(url, agent).start()
    try:
        ctl.until(lambda: registry.aliases(agent).get(CHAMPION) == adapter, timeout=240)
        time.sleep(1.0)
    finally:
        traffic.stop()
    assert [a for a, v in ctl.actions() if v == adapter] == [
        "deploy",
        "canary",
        "advance",
        "promote",
    ]
    assert CHALLENGER not in registry.aliases(agent)
    counts = version_counts(url, agent)
    assert counts.get((str(adapter), "200"), 0) > 0 and counts.get((str(base), "200"), 0) > 0
    assert not traffic.failures()
    served = traffic.outcomes[-1]
    assert served.version == str(adapter)
    # The adapter is served from its own version folder, on the base model where it lies.
    spec = json.loads(
        (triton.model_repository / agent / str(adapter) / "spanmill-serving.json").read_text()
    )
    assert spec["adapter"] == "adapter" and spec["base_model"] == str(smollm2_dir.resolve())
    control = TritonControl(triton.http_url)
    ctl.until(lambda: control.versions(agent).get(base) != "READY", timeout=60)
