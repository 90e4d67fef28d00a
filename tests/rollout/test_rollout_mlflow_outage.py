"""MLflow down while the controller serves: the routing stays, every pass ends soon, and
once MLflow is back the controller takes up where the aliases say; a canary that fails
meanwhile is rolled back all the same.

MLflow's client alone waits up to 120 s for an answer and retries 7 times with backoff:
against a stopped server one call took 246 s here, and the controller's pass with it.
The controller bounds its calls (``mlflow_timeout_s``, ``mlflow_retries``; see
``spanmill.rollout.service.bounded_mlflow``), which is what this test holds it to.

The outage lasts ``SPANMILL_FAULT_OUTAGE_S`` (10 s in ``make test``; the README's row is
from a run with 120).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rollout_helpers import Traffic, controller, new_agent, rollout_settings
from test_rollout_local import weights

from spanmill.registry import CHALLENGER, CHAMPION, Lineage, ModelRegistry, names
from spanmill.rollout.schemas import Phase
from spanmill.rollout.service import bounded_mlflow
from spanmill.stack.ports import free_port
from spanmill.stack.services import MLflowServer

pytestmark = pytest.mark.services

OUTAGE_S = float(os.environ.get("SPANMILL_FAULT_OUTAGE_S", "10"))


@pytest.mark.parametrize("fault", ["stopped", "hung"])
def test_mlflow_down_keeps_the_routing_and_the_controller_resumes(  # type: ignore[no-untyped-def]
    fault: str, triton, gateway, tmp_path: Path
) -> None:
    """``stopped``: connections refused; ``hung``: the server paused (SIGSTOP), so calls
    are accepted and never answered, which only the timeout ends."""
    server = MLflowServer("127.0.0.1", free_port(), tmp_path / "mlflow")
    running = server.start()
    try:
        url, routes = gateway
        agent = new_agent()
        settings = rollout_settings(
            SimpleNamespace(tracking_uri=server.url), triton, tmp_path, agent,
            routing_file=routes, gateway_urls=[url],
            mlflow_timeout_s=10 if fault == "stopped" else 2,
        )  # fmt: skip
        with bounded_mlflow(settings):
            registry = ModelRegistry(server.url)
            ctl = controller(settings)
            v1 = registry.register(agent, Lineage(kind="echo")).version
            registry.promote(agent, v1)
            ctl.until(lambda: weights(routes, agent) == {str(v1): 100.0}, timeout=90)
            traffic = Traffic(url, agent).start()

            group = os.getpgid(running.process.pid)
            if fault == "stopped":
                running.stop()
            else:
                os.killpg(group, signal.SIGSTOP)
            down_at = time.monotonic()
            passes: list[float] = []
            routes_seen = set()
            errors_before = len([d for d in ctl.decisions if d.action == "error"])
            while time.monotonic() - down_at < OUTAGE_S:
                started = time.monotonic()
                ctl.tick()
                passes.append(time.monotonic() - started)
                routes_seen.add(tuple(sorted(weights(routes, agent).items())))
                time.sleep(0.5)
            errors = len([d for d in ctl.decisions if d.action == "error"]) - errors_before

            if fault == "stopped":
                running = server.start()  # the same database: MLflow back as it was
            else:
                os.killpg(group, signal.SIGCONT)
            back_at = time.monotonic()
            v2 = registry.register(agent, Lineage(kind="echo")).version
            registry.set_alias(agent, CHALLENGER, v2)
            ctl.until(lambda: registry.aliases(agent).get(CHAMPION) == v2, timeout=180)
            resumed_s = time.monotonic() - back_at
        outcomes = traffic.stop()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(running.process.pid), signal.SIGCONT)
        running.stop()

    failed = [o for o in outcomes if o.status != 200]
    print(
        f"\nfault row: MLflow {fault} {OUTAGE_S:g} s while the champion served | "
        f"requests {len(outcomes)} (failed {len(failed)}) | passes while down {len(passes)}, "
        f"longest {max(passes):.1f} s, {errors} errors recorded | routes while down "
        f"{sorted(routes_seen)} | back: challenger v{v2} promoted {resumed_s:.0f} s later"
    )
    assert routes_seen == {((str(v1), 100.0),)}  # the routing never moved
    assert len(passes) >= 2 and errors >= len(passes)  # each pass tried, and said so
    # Each pass ends within the bound (a timeout and one retry, a second apart), not after
    # MLflow's own minutes; a refused connection ends it at once.
    assert max(passes) < 2 * settings.mlflow_timeout_s + 5
    assert failed == []  # serving never depended on MLflow


def test_a_failing_canary_is_rolled_back_while_mlflow_is_down(  # type: ignore[no-untyped-def]
    triton, gateway, no_system_model: Path, tmp_path: Path
) -> None:
    """The challenger answers prompts without a system message and fails every one with
    it (``no_system_model``): its canary runs healthy on the first, MLflow stops, and the
    traffic turns to the second. The gateway's counts condemn it with MLflow down: the
    routes go back to the champion then, and MLflow is told once it answers again."""
    server = MLflowServer("127.0.0.1", free_port(), tmp_path / "mlflow")
    running = server.start()
    try:
        url, routes = gateway
        agent = new_agent()
        settings = rollout_settings(
            SimpleNamespace(tracking_uri=server.url), triton, tmp_path, agent,
            routing_file=routes, gateway_urls=[url], steps=[50, 100], bake_s=3600,
        )  # fmt: skip
        with bounded_mlflow(settings):
            registry = ModelRegistry(server.url)
            ctl = controller(settings)
            v1 = registry.register(agent, Lineage(kind="echo")).version
            registry.promote(agent, v1)
            ctl.until(lambda: weights(routes, agent) == {str(v1): 100.0}, timeout=90)
            healthy = Traffic(url, agent, system_prompt=False).start()
            bad = registry.register(agent, Lineage(kind="model"), no_system_model).version
            registry.set_alias(agent, CHALLENGER, bad)
            ctl.until(lambda: weights(routes, agent).get(str(bad)) == 50.0, timeout=120)
            ctl.until(lambda: sum(o.version == str(bad) for o in healthy.outcomes) >= 3)
            healthy.stop()

            running.stop()
            failing = Traffic(url, agent).start()
            ctl.until(lambda: weights(routes, agent) == {str(v1): 100.0}, timeout=45)
            routed_back_at = time.time()
            down = ctl.reconciler.state(agent)
            for _ in range(3):  # it stays out while MLflow stays down
                ctl.tick()
                assert weights(routes, agent) == {str(v1): 100.0}

            running = server.start()  # the same database: MLflow back as it was
            ctl.until(lambda: CHALLENGER not in registry.aliases(agent), timeout=60)
            ctl.tick()
            back = ctl.reconciler.state(agent)
            stopped = registry.version(agent, bad)
            aliases = registry.aliases(agent)
            time.sleep(0.5)
        outcomes = failing.stop()
    finally:
        running.stop()

    rollback = next(d for d in ctl.decisions if d.action == "rollback")
    assert rollback.version == bad and "error rate" in rollback.reason
    assert down is not None and down.phase == Phase.STABLE and down.champion == v1
    assert list(down.unrecorded_rollbacks) == [bad]
    assert all(o.version == str(v1) and o.status == 200
               for o in outcomes if o.at > routed_back_at + 0.2)  # fmt: skip
    # Once back, MLflow says what was done, and the version is not staged again.
    assert stopped.rolled_back and "error rate" in stopped.tags[names.TAG_ROLLOUT_REASON]
    assert aliases == {CHAMPION: v1}
    assert back is not None and back.unrecorded_rollbacks == {} and back.phase == Phase.STABLE
    assert ctl.actions().count(("deploy", bad)) == 1
