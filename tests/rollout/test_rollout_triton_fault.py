"""Triton faults: killed during a canary at 50%, the controller rolls the challenger back,
and once Triton is up again it loads the champion and serving resumes; a champion that
cannot be loaded again keeps its files, and is loaded once it can be.

A Triton of the test's own (the session's serves every other test), SIGKILLed with
traffic flowing through the gateway at 50/50, down for ``SPANMILL_FAULT_OUTAGE_S``
(10 s in ``make test``), then started again on the same repository as a restarted pod
would be, with nothing loaded. One Triton serves both versions here, so every request
fails while it is down; in a fleet the other pods answer meanwhile.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rollout_helpers import Traffic, controller, gateway_settings, new_agent, rollout_settings
from test_rollout_local import weights

from spanmill.gateway.app import create_app
from spanmill.registry import CHALLENGER, Lineage, ModelRegistry
from spanmill.rollout.triton import TritonControl, TritonError
from spanmill.stack.ports import free_port
from spanmill.stack.services import TritonServer

pytestmark = pytest.mark.services

OUTAGE_S = float(os.environ.get("SPANMILL_FAULT_OUTAGE_S", "10"))


def test_triton_killed_during_a_canary_rolls_back_and_the_champion_returns(  # type: ignore[no-untyped-def]
    kafka, mlflow_server, serve_app, tmp_path: Path
) -> None:
    repository = tmp_path / "model-repository"
    server = TritonServer("127.0.0.1", tmp_path / "triton", repository, http_port=free_port(),
                          grpc_port=free_port(), metrics_port=free_port())  # fmt: skip
    running = server.start()
    triton = SimpleNamespace(http_url=f"127.0.0.1:{server.http_port}",
                             model_repository=repository)  # fmt: skip
    routes = tmp_path / "routes.json"
    agent = new_agent()
    registry = ModelRegistry(mlflow_server.tracking_uri)
    try:
        with serve_app(create_app(gateway_settings(kafka, triton, routing_file=routes))) as url:
            settings = rollout_settings(
                mlflow_server, triton, tmp_path, agent, routing_file=routes,
                gateway_urls=[url], steps=[50, 100], bake_s=3600,
            )  # fmt: skip
            ctl = controller(settings)
            v1 = registry.register(agent, Lineage(kind="echo")).version
            registry.promote(agent, v1)
            ctl.until(lambda: weights(routes, agent) == {str(v1): 100.0}, timeout=90)
            traffic = Traffic(url, agent).start()
            v2 = registry.register(agent, Lineage(kind="echo")).version
            registry.set_alias(agent, CHALLENGER, v2)
            ctl.until(lambda: weights(routes, agent).get(str(v2)) == 50.0, timeout=90)
            time.sleep(3)  # both versions answer

            os.killpg(os.getpgid(running.process.pid), signal.SIGKILL)
            killed_at = time.time()
            ctl.until(lambda: weights(routes, agent) == {str(v1): 100.0}, timeout=60)
            rolled_back_s = time.time() - killed_at
            while time.time() - killed_at < OUTAGE_S:
                ctl.tick()
                time.sleep(0.5)

            running = server.start()  # a restarted pod: the repository, nothing loaded
            restarted_at = time.time()

            def answered_since(moment: float) -> bool:
                return any(o.at > moment and o.status == 200 for o in traffic.outcomes)

            ctl.until(lambda: answered_since(time.time() - 1), timeout=120)
            recovered_at = min(o.at for o in traffic.outcomes
                               if o.at > restarted_at and o.status == 200)  # fmt: skip
            time.sleep(3)
            outcomes = traffic.stop()
    finally:
        running.stop()

    before = [o for o in outcomes if o.at < killed_at]
    down = [o for o in outcomes if killed_at <= o.at < recovered_at]
    after = [o for o in outcomes if o.at >= recovered_at]
    actions = ctl.actions()
    print(
        f"\nfault row: Triton SIGKILLed at 50% canary, down {OUTAGE_S:g} s | requests "
        f"{len(outcomes)}: before {len(before)} (failed "
        f"{sum(o.status != 200 for o in before)}, v{v2} answered "
        f"{sum(o.version == str(v2) for o in before)}), while down {len(down)} (failed "
        f"{sum(o.status != 200 for o in down)}), after {len(after)} (failed "
        f"{sum(o.status != 200 for o in after)}) | rolled back {rolled_back_s:.1f} s after "
        f"the kill | champion answering {recovered_at - restarted_at:.1f} s after the restart"
    )
    assert all(o.status == 200 for o in before)
    assert any(o.version == str(v2) for o in before)  # the canary had its share
    assert ("rollback", v2) in actions
    assert CHALLENGER not in registry.aliases(agent)  # never to be staged again
    assert all(o.status == 200 and o.version == str(v1) for o in after)
    assert weights(routes, agent) == {str(v1): 100.0}


class RefusingTriton(TritonControl):
    """The session's Triton, whose loads fail while ``refusing`` is set. A stand-in for the
    fault alone: a champion that every pod lost and none can take back (a restarted node
    short of memory, say) cannot be staged on demand with tritonserver itself."""

    refusing = False

    def load(self, model: str) -> None:
        if self.refusing:
            raise TritonError(f"{self.describe()}: loading {model} failed: out of memory")
        super().load(model)


def test_a_champion_that_cannot_be_loaded_again_keeps_its_files(  # type: ignore[no-untyped-def]
    mlflow_server, triton, registry, tmp_path: Path
) -> None:
    agent = new_agent()
    routes = tmp_path / "routes.json"
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                retry_after_s=3600)  # fmt: skip
    fleet = RefusingTriton(triton.http_url)
    later = [0.0]  # seconds the controller's clock is ahead, to reach a retry
    ctl = controller(settings, fleet=fleet, clock=lambda: time.time() + later[0])
    v1 = registry.register(agent, Lineage(kind="echo")).version
    registry.promote(agent, v1)
    ctl.until(lambda: weights(routes, agent) == {str(v1): 100.0}, timeout=90)
    files = triton.model_repository / agent / str(v1)

    def listed() -> list[Path]:  # what was written, less what Python compiled of it
        return sorted(
            p.relative_to(files) for p in files.rglob("*") if "__pycache__" not in p.parts
        )

    written = listed()

    control = TritonControl(triton.http_url)
    control.unload(agent)  # every server lost it, as a restart leaves them
    fleet.refusing = True
    ctl.tick()
    failed = [d for d in ctl.decisions if d.action == "error" and d.version == v1]
    assert failed and "cannot be loaded again" in failed[-1].reason
    assert listed() == written
    assert weights(routes, agent) == {str(v1): 100.0}  # nothing else to send it to
    ctl.tick()  # within the wait before a retry: not tried again, and still there
    assert len([d for d in ctl.decisions if d.action == "error"]) == len(failed)

    fleet.refusing = False
    later[0] = settings.retry_after_s
    ctl.tick()
    assert control.versions(agent).get(v1) == "READY"
    control.smoke(agent, v1, flavour="python", timeout_s=60)
    assert listed() == written


def test_a_champion_whose_files_are_damaged_is_written_again_from_the_registry(  # type: ignore[no-untyped-def]
    mlflow_server, triton, registry, tmp_path: Path
) -> None:
    """Every server lost the champion and its files no longer load (damaged on the
    volume): they were kept and tried again at every retry, failing for ever. They are
    written again from the registry, and the champion serves at once."""
    agent = new_agent()
    routes = tmp_path / "routes.json"
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                retry_after_s=3600)  # fmt: skip
    ctl = controller(settings)
    v1 = registry.register(agent, Lineage(kind="echo")).version
    registry.promote(agent, v1)
    ctl.until(lambda: weights(routes, agent) == {str(v1): 100.0}, timeout=90)
    entry = triton.model_repository / agent / str(v1) / "model.py"
    written = entry.read_bytes()

    control = TritonControl(triton.http_url)
    control.unload(agent)  # every server lost it, as a restart leaves them
    entry.write_text("this file was damaged on the volume (\n")
    ctl.tick()
    assert control.versions(agent).get(v1) == "READY"
    control.smoke(agent, v1, flavour="python", timeout_s=60)
    assert entry.read_bytes() == written
    assert not [d for d in ctl.decisions if d.action == "error"]
