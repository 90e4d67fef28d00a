"""The local backend: a state file, and routes in a file or through the gateway's admin API."""

from __future__ import annotations

from pathlib import Path

import pytest

from spanmill.config import GatewaySettings, KafkaSettings
from spanmill.errors import ConfigError
from spanmill.gateway.app import create_app
from spanmill.gateway.routing import RoutingTable
from spanmill.rollout.backend import BackendError
from spanmill.rollout.local_backend import LocalBackend
from spanmill.rollout.schemas import AgentState, ControllerState, Decision, Phase
from spanmill.stack.ports import free_port

CANARY = AgentState(
    agent="calc", phase=Phase.CANARY, champion=1, challenger=2, step=1, step_started_at=9.0
)
STATE = ControllerState(agents={"calc": CANARY})
BACKENDS = [{"version": "1", "weight": 50}, {"version": "2", "weight": 50, "role": "challenger"}]
TABLE = RoutingTable.model_validate(
    {"revision": 4, "routes": {"calc": {"triton_model": "calc", "backends": BACKENDS}}}
)


def test_state_file_and_routing_file(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json", routing_file=tmp_path / "routes.json")
    assert backend.load() == (ControllerState(), RoutingTable())
    backend.save(STATE, TABLE)
    assert backend.load() == (STATE, TABLE)
    backend.save(ControllerState(), None)  # the routes stay as they were
    assert backend.load() == (ControllerState(), TABLE)
    for action in ("canary", "advance", "promote"):
        backend.event(Decision(agent="calc", action=action, version=2, reason="r"))
    assert [d.action for d in backend.events()] == ["canary", "advance", "promote"]
    (tmp_path / "state.json").write_text('{"agents": {"calc": {"phase": "flying"}}}')
    with pytest.raises(BackendError, match="delete it to start over"):
        backend.load()


def test_routes_through_the_gateway_admin_api(tmp_path: Path, serve_app) -> None:  # type: ignore[no-untyped-def]
    settings = GatewaySettings(kafka=KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"),
                               api_key="client", admin_api_key="admin")  # fmt: skip
    with serve_app(create_app(settings)) as url:
        backend = LocalBackend(tmp_path / "state.json", gateway_url=url, api_key="admin")
        backend.save(STATE, TABLE)
        assert backend.load() == (STATE, TABLE)
        # A client's key is not the admin credential.
        for key in ("nope", "client"):
            wrong = LocalBackend(tmp_path / "state.json", gateway_url=url, api_key=key)
            with pytest.raises(BackendError, match="401"):
                wrong.load()
    with pytest.raises(ConfigError, match="exactly one"):
        LocalBackend(tmp_path / "s.json")
