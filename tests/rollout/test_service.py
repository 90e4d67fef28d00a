"""The controller as a service: settings in, the loop running, /metrics and health out."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rollout_helpers import new_agent, rollout_settings
from typer.testing import CliRunner

from spanmill.cli.main import app
from spanmill.config import MLflowSettings, RolloutSettings
from spanmill.registry import Lineage
from spanmill.rollout.service import run
from spanmill.stack.ports import free_port

pytestmark = pytest.mark.services


def test_the_service_reconciles_and_reports(  # type: ignore[no-untyped-def]
    mlflow_server, triton, gateway, registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, routes = gateway
    agent = new_agent()
    port = free_port()
    settings = rollout_settings(mlflow_server, triton, tmp_path, agent, routing_file=routes,
                                gateway_urls=[url], interval_s=0.2, http_port=port)  # fmt: skip
    registry.promote(agent, registry.register(agent, Lineage(kind="echo")).version)
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(settings, stop), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                ready = httpx.get(f"{base}/readyz", timeout=2).status_code == 200
                metrics = httpx.get(f"{base}/metrics", timeout=2).text
            except httpx.HTTPError:
                ready, metrics = False, ""
            serving = f'spanmill_rollout_champion_version{{agent="{agent}"}} 1.0' in metrics
            if ready and serving:
                break
            assert time.monotonic() < deadline, metrics
            time.sleep(0.2)
        assert httpx.get(f"{base}/healthz", timeout=2).json() == {"status": "ok"}
        assert f'spanmill_rollout_decisions_total{{action="serve",agent="{agent}"}} 1.0' in metrics
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()

    # `spanmill rollout --once` runs one pass from SPANMILL_* settings and says what it did.
    env = {
        "SPANMILL_MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
        "SPANMILL_TRITON_HTTP_URL": triton.http_url,
        "SPANMILL_TRITON_MODEL_REPOSITORY": str(triton.model_repository),
        "SPANMILL_ROLLOUT_AGENTS": f'["{agent}"]',
        "SPANMILL_ROLLOUT_STATE_FILE": str(settings.state_file),
        "SPANMILL_ROLLOUT_ROUTING_FILE": str(routes),
        "SPANMILL_ROLLOUT_GATEWAY_URLS": f'["{url}"]',
        "COLUMNS": "200",
    }
    v2 = registry.register(agent, Lineage(kind="echo")).version
    registry.set_alias(agent, "challenger", v2)
    result = CliRunner().invoke(app, ["rollout", "--once"], env=env)
    assert result.exit_code == 0, result.output
    assert f"{agent} v{v2}: deploy" in result.output and f"{agent} v{v2}: canary" in result.output

    # `spanmill rollout status` reads the same state.
    result = CliRunner().invoke(app, ["rollout", "status"], env=env)
    assert result.exit_code == 0, result.output
    assert agent in result.output and "canary" in result.output and "5%" in result.output
    result = CliRunner().invoke(
        app, ["rollout", "--once"], env={**env, "SPANMILL_ROLLOUT_STEPS": "[50]"}
    )
    assert result.exit_code == 1 and "SPANMILL_ROLLOUT_STEPS" in result.output


def test_every_canary_rule_the_settings_declare_reaches_the_policy() -> None:
    """The controller's settings declare the canary policy's fields by the same names: a
    field added to one and not passed on would be read from the environment and ignored."""
    from spanmill.config import RolloutSettings
    from spanmill.rollout.schemas import RolloutPolicy
    from spanmill.rollout.service import policy_of

    shared = set(RolloutPolicy.model_fields) & set(RolloutSettings.model_fields)
    assert shared >= {"max_error_rate", "max_queue_full_rate", "max_latency_ratio"}
    values = {"max_error_rate": 0.2, "max_queue_full_rate": 0.3, "max_p95_latency_s": 9.0,
              "max_latency_ratio": 1.7, "min_mean_reward": 0.4, "max_reward_drop": 0.11,
              "min_rewards": 7, "min_requests": 3, "bake_s": 12.0, "grace_s": 13.0,
              "drain_s": 1.5, "steps": [10.0, 100.0]}  # fmt: skip
    assert set(values) == shared, sorted(shared ^ set(values))
    policy = policy_of(RolloutSettings(**values))
    assert {name: getattr(policy, name) for name in shared} == values


@contextlib.contextmanager
def silent_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A Kubernetes API server, in the kubeconfig, that takes connections and never answers
    (a control plane failing over)."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections complete in the backlog and are never answered
    kubeconfig = tmp_path / "kubeconfig"
    server = f"http://127.0.0.1:{silent.getsockname()[1]}"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    try:
        yield
    finally:
        silent.close()


def test_a_stuck_pass_fails_healthz_and_logs_where_it_is_stuck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Kubernetes API takes the connection and never answers. The pass waits in its
    read of the ConfigMap; past ``stall_after_s`` the log says where it is and /healthz
    fails, so the kubelet would restart the controller. The read is bounded: it ends in
    an error, and /healthz answers again."""
    import spanmill.kube

    monkeypatch.setattr(spanmill.kube, "API_TIMEOUT_S", 8.0)
    port = free_port()
    settings = RolloutSettings(
        mlflow=MLflowSettings(tracking_uri="http://127.0.0.1:9"),  # never reached
        backend="kubernetes", agents=["calc"], interval_s=30, http_port=port,
        deploy_wait_s=0.5, load_timeout_s=0.5, stall_after_s=1.0,
    )  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(settings, stop), daemon=True)
    base = f"http://127.0.0.1:{port}"
    caplog.set_level("INFO", logger="spanmill.rollout")
    with silent_api(tmp_path, monkeypatch):
        try:
            thread.start()
            statuses: list[int] = []
            idles: list[float] = []
            deadline = time.monotonic() + 60
            # Stuck, then bounded: 503 while the read waits, 200 once it has failed.
            while not (503 in statuses and statuses[-1] == 200):
                assert time.monotonic() < deadline, (statuses, caplog.text)
                with contextlib.suppress(httpx.HTTPError):
                    statuses.append(httpx.get(f"{base}/healthz", timeout=2).status_code)
                if statuses and statuses[-1] == 503:
                    metrics = httpx.get(f"{base}/metrics", timeout=2).text
                    idle = metrics.split("\nspanmill_rollout_pass_idle_seconds ")[1].split()[0]
                    idles.append(float(idle))  # 0 once the pass has ended
                time.sleep(0.1)
        finally:
            stop.set()
            thread.join(timeout=30)
    assert not thread.is_alive()
    assert max(idles) > 1.0, idles
    stalls = [r.getMessage() for r in caplog.records if "has not moved on" in r.getMessage()]
    assert len(stalls) == 1, stalls  # once a stall, however often it is asked
    assert "reading the state and the agents" in stalls[0]
    assert "k8s_backend.py" in stalls[0] and "in load" in stalls[0], stalls[0]
    failed = [r.getMessage() for r in caplog.records if "reconcile failed" in r.getMessage()]
    assert failed and "reading ConfigMap default/spanmill-routing failed" in failed[0], failed


def test_a_controller_that_cannot_bind_its_port_says_which(tmp_path: Path) -> None:
    import socket

    from spanmill.errors import ConfigError

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    settings = RolloutSettings(
        mlflow=MLflowSettings(tracking_uri="http://127.0.0.1:9"),  # never reached
        http_port=port,
    )  # fmt: skip
    with contextlib.closing(taken), pytest.raises(ConfigError) as refused:
        run(settings, threading.Event())
    assert f":{port}:" in str(refused.value)
    assert "SPANMILL_ROLLOUT_HTTP_PORT" in str(refused.value)
