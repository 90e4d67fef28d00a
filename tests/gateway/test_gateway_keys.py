"""Client API keys and the admin credential (no services: the app with a recording emitter)."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from test_gateway_feedback import TRACE, EchoUpstream, FakeEmitter
from typer.testing import CliRunner

from spanmill import keys as keyring
from spanmill import semconv as sc
from spanmill.cli.main import app as cli
from spanmill.config import GatewaySettings
from spanmill.errors import ConfigError
from spanmill.gateway.app import create_app
from spanmill.gateway.routing import RoutingTable
from spanmill.keys import KeyRing, key_line, new_key
from spanmill.producers import GATEWAY

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def client_with(emitter: FakeEmitter, **settings: Any) -> TestClient:
    table = RoutingTable.model_validate(
        {"routes": {"echo": {"triton_model": "echo", "backends": [{"version": "1", "weight": 1}]}}}
    )
    app = create_app(GatewaySettings(**settings), emitter=emitter, upstream=EchoUpstream(),  # type: ignore[arg-type]
                     table=table)  # fmt: skip
    return TestClient(app)


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
def two_clients(tmp_path: Path) -> tuple[Path, str, str]:
    support, billing = new_key(), new_key()
    keys_file = tmp_path / "keys"
    keys_file.write_text(
        f"# client keys\n{key_line('support', support)}\n{key_line('billing', billing)}\n"
    )
    return keys_file, support, billing


def test_each_client_is_known_by_its_key_id_and_the_key_is_never_recorded(
    two_clients: tuple[Path, str, str],
) -> None:
    keys_file, support, billing = two_clients
    emitter = FakeEmitter()
    with client_with(emitter, client_keys_file=keys_file) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 401
        unknown = client.post("/v1/chat/completions", json=CHAT, headers=auth(new_key()))
        assert unknown.status_code == 401
        assert unknown.json()["error"]["type"] == "authentication_error"
        for key in (support, billing):
            assert client.post("/v1/chat/completions", json=CHAT, headers=auth(key)).is_success
        feedback = {"trace_id": TRACE, "name": "thumbs", "value": 1}
        assert client.post("/v1/feedback", json=feedback, headers=auth(billing)).is_success
        assert client.get("/healthz").status_code == 200  # probes need no key
    callers = [span.attributes[sc.SPANMILL_CLIENT_KEY_ID] for span in emitter.emitted]
    assert callers == ["support", "billing"]
    assert emitter.delivered[0].attributes[sc.SPANMILL_FEEDBACK_PRINCIPAL] == "billing"
    # The gateway produced the calls' spans; the feedback's producer is the key that sent it.
    assert {s.resource_attributes[sc.SPANMILL_PRODUCER] for s in emitter.emitted} == {GATEWAY}
    assert emitter.delivered[0].resource_attributes[sc.SPANMILL_PRODUCER] == "billing"
    for span in emitter.emitted + emitter.delivered:
        assert support not in repr(span.attributes) and billing not in repr(span.attributes)


def test_a_key_is_revoked_by_deleting_its_line_without_a_restart(
    two_clients: tuple[Path, str, str],
) -> None:
    keys_file, support, billing = two_clients
    with client_with(FakeEmitter(), client_keys_file=keys_file) as client:
        assert client.post("/v1/chat/completions", json=CHAT, headers=auth(support)).is_success
        keys_file.write_text(key_line("billing", billing) + "\n")
        refused = client.post("/v1/chat/completions", json=CHAT, headers=auth(support))
        assert refused.status_code == 401
        assert client.post("/v1/chat/completions", json=CHAT, headers=auth(billing)).is_success
        # A broken edit keeps the keys read before, rather than opening or closing the door.
        keys_file.write_text("billing not-a-digest\n")
        assert client.post("/v1/chat/completions", json=CHAT, headers=auth(billing)).is_success
        assert (
            client.post("/v1/chat/completions", json=CHAT, headers=auth(support)).status_code == 401
        )


def test_the_admin_routes_take_their_own_credential(two_clients: tuple[Path, str, str]) -> None:
    keys_file, support, _ = two_clients
    admin = new_key()
    routes = RoutingTable(revision=3).dumps()
    with client_with(FakeEmitter(), client_keys_file=keys_file,
                     admin_api_key=SecretStr(admin)) as client:  # fmt: skip
        assert client.put("/admin/routes", content=routes, headers=auth(support)).status_code == 401
        assert client.get("/admin/routes").status_code == 401
        assert client.put("/admin/routes", content=routes, headers=auth(admin)).json() == {
            "revision": 3
        }
        # A bad table is the request's fault, answered in the API's error shape.
        bad = client.put("/admin/routes", content=b'{"routes": 7}', headers=auth(admin))
        assert bad.status_code == 400
        assert "request body is invalid" in bad.json()["error"]["message"]
        assert client.get("/admin/routes", headers=auth(admin)).json()["revision"] == 3
        # ... and the admin credential is no client key.
        assert (
            client.post("/v1/chat/completions", json=CHAT, headers=auth(admin)).status_code == 401
        )
    # Client keys and no admin credential: the admin routes are shut.
    with client_with(FakeEmitter(), client_keys_file=keys_file) as client:
        shut = client.get("/admin/routes", headers=auth(support))
        assert shut.status_code == 403 and "ADMIN_API_KEY" in shut.json()["error"]["message"]
    # No keys at all (one machine, the demo): everything is open, as before.
    with client_with(FakeEmitter()) as client:
        assert client.get("/admin/routes").status_code == 200
        assert client.post("/v1/chat/completions", json=CHAT).is_success


def test_every_key_is_compared_whichever_matches(
    two_clients: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys_file, support, _ = two_clients
    ring = KeyRing(keys_file)
    compared: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(keyring.hmac, "compare_digest", counting)
    assert ring.identify(support.encode()) == "support"  # the first line
    assert len(compared) == 2
    assert ring.identify(b"wrong") is None and len(compared) == 4


def test_a_bad_keys_file_stops_the_gateway_from_starting(tmp_path: Path) -> None:
    bad = tmp_path / "keys"
    bad.write_text("support sha256:1234\n")
    with pytest.raises(ConfigError, match="line 1"):
        KeyRing(bad)
    twice = tmp_path / "twice"
    twice.write_text(f"{key_line('a', new_key())}\n{key_line('a', new_key())}\n")
    with pytest.raises(ConfigError, match="appears twice"):
        KeyRing(twice)
    with pytest.raises(ConfigError, match="cannot read"):
        KeyRing(tmp_path / "missing")
    with pytest.raises(ConfigError, match="key id"):
        key_line("no spaces", new_key())


def test_the_cli_makes_a_key_and_keeps_only_its_hash(tmp_path: Path) -> None:
    keys_file = tmp_path / "secret" / "keys"
    made = CliRunner().invoke(cli, ["gateway-key", "support", "--keys-file", str(keys_file)])
    assert made.exit_code == 0, made.output
    key = made.output.strip().splitlines()[-1]
    assert key.startswith("sk-spanmill-") and key not in keys_file.read_text()
    assert KeyRing(keys_file).identify(key.encode()) == "support"
    again = CliRunner().invoke(cli, ["gateway-key", "support", "--keys-file", str(keys_file)])
    assert again.exit_code != 0 and "already holds" in again.output
    assert len(keys_file.read_text().splitlines()) == 1  # the first key alone
