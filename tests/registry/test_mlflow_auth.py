"""MLflow with its basic-auth app, started the way the chart starts it
(services/mlflow/mlflow-with-auth.sh): anonymous requests are refused, and spanmill's
own users, made by ``spanmill models users`` (the chart's hook Job), work through
MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD with the model registry.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from test_registry import trained_folder
from typer.testing import CliRunner

from spanmill.cli.main import app
from spanmill.registry import CHALLENGER, CHAMPION, ModelRegistry, RegistryError
from spanmill.stack.ports import free_port
from spanmill.stack.services import MLflowServer

pytestmark = pytest.mark.services
runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
START = ROOT / "services" / "mlflow" / "mlflow-with-auth.sh"
CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


class AuthMLflowServer(MLflowServer):
    """The embedded stack's MLflow server, run through the image's start script."""

    def __init__(self, port: int, work_dir: Path, auth_db: Path, admin: tuple[str, str]) -> None:
        super().__init__("127.0.0.1", port, work_dir)
        self.auth_db = auth_db
        self.admin = admin

    def argv(self) -> Sequence[str]:
        _binary, *args = super().argv()
        return ["sh", str(START), *args, "--app-name", "basic-auth"]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in super().env().items() if k not in CREDENTIAL_ENV}
        env.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            TMPDIR=str(self.work_dir),
            # URL-encoded, as a database password in a URI is: "%" is "%25".
            MLFLOW_AUTH_DATABASE_URI=f"sqlite:///{str(self.auth_db).replace('%', '%25')}",
            MLFLOW_AUTH_ADMIN_USERNAME=self.admin[0],
            MLFLOW_AUTH_ADMIN_PASSWORD=self.admin[1],
        )
        return env


@dataclass(frozen=True)
class AuthServer:
    url: str
    admin: tuple[str, str]
    work_dir: Path
    auth_db: Path


@pytest.fixture(scope="module")
def auth_mlflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    work = tmp_path_factory.mktemp("mlflow-auth")
    # A % in the database URI, as a URL-encoded database password has: the start
    # script must double it for MLflow's ini reader, or the server does not start.
    auth_db = work / "users%db" / "mlflow-auth.db"  # users%25db in the URI
    auth_db.parent.mkdir()
    admin = ("spanmill-admin", secrets.token_hex(12))
    server = AuthMLflowServer(free_port(), work, auth_db, admin)
    running = server.start()
    try:
        yield AuthServer(server.url, admin, work, auth_db)
    finally:
        running.stop()


def secret_folder(root: Path, name: str, username: str, password: str) -> Path:
    """A Secret with the keys username and password, as Kubernetes mounts it."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "username").write_text(username)
    (folder / "password").write_text(password + "\n")
    return folder


def signed_in(monkeypatch: pytest.MonkeyPatch, username: str, password: str) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)


def make_users(server: AuthServer, *options: str) -> str:
    env = dict(zip(CREDENTIAL_ENV, server.admin, strict=True))
    result = runner.invoke(
        app, ["models", "users", *options, "--tracking-uri", server.url, "--wait", "30"], env=env
    )
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())  # as one line: the console wraps long ones


def test_anonymous_requests_are_refused_and_nothing_secret_is_left_readable(
    auth_mlflow: AuthServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)
    search = f"{auth_mlflow.url}/api/2.0/mlflow/registered-models/search"
    anonymous = httpx.get(search, timeout=10)
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Basic")
    assert httpx.get(search, auth=("spanmill-admin", "wrong"), timeout=10).status_code == 401
    assert httpx.get(search, auth=auth_mlflow.admin, timeout=10).status_code == 200
    # The probes of the chart need no credentials.
    assert httpx.get(f"{auth_mlflow.url}/health", timeout=10).status_code == 200
    with pytest.raises(RegistryError, match="401"):
        ModelRegistry(auth_mlflow.url).agents()
    # The users' database is where the URI (with its %) said; the ini holds no password
    # and only its owner can read it.
    assert auth_mlflow.auth_db.is_file()
    ini = auth_mlflow.work_dir / "mlflow-auth" / "basic_auth.ini"
    assert "default_permission = READ" in ini.read_text()
    assert "users%%25db" in ini.read_text()
    assert auth_mlflow.admin[1] not in ini.read_text()
    assert stat.S_IMODE(ini.stat().st_mode) == 0o600


def test_the_controller_and_the_pipeline_work_as_their_own_users(
    auth_mlflow: AuthServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline_password, controller_password = secrets.token_hex(8), secrets.token_hex(8)
    pipeline = secret_folder(tmp_path, "pipeline", "spanmill-pipeline", pipeline_password)
    controller = secret_folder(tmp_path, "controller", "spanmill-controller", controller_password)
    output = make_users(auth_mlflow, "--controller", str(controller), "--pipeline", str(pipeline))
    assert "controller user 'spanmill-controller' created" in output
    assert "MANAGE on every registered_model" in output
    assert pipeline_password not in output and controller_password not in output

    # The pipeline registers a version that passed the gate: it becomes the challenger.
    agent = f"auth-{uuid.uuid4().hex[:8]}"
    adapter, metrics = trained_folder(tmp_path)
    signed_in(monkeypatch, "spanmill-pipeline", pipeline_password)
    registered = ModelRegistry(auth_mlflow.url).register_trained(agent, adapter, metrics)
    assert registered.challenger
    version = registered.version.version

    # A person who signs in without a grant reads, and changes nothing.
    from mlflow.server.auth.client import AuthServiceClient

    signed_in(monkeypatch, *auth_mlflow.admin)
    AuthServiceClient(auth_mlflow.url).create_user("someone", "someone-password-1")
    signed_in(monkeypatch, "someone", "someone-password-1")
    reader = ModelRegistry(auth_mlflow.url)
    assert reader.aliases(agent) == {CHALLENGER: version}
    with pytest.raises(RegistryError, match="403"):
        reader.set_alias(agent, CHAMPION, version)

    # The controller promotes it: champion set, challenger alias deleted (MANAGE).
    signed_in(monkeypatch, "spanmill-controller", controller_password)
    controller_registry = ModelRegistry(auth_mlflow.url)
    assert controller_registry.promote(agent, version, reason="canary passed") is None
    assert controller_registry.aliases(agent) == {CHAMPION: version}
    assert controller_registry.version(agent, version).rollout_status == "promoted"

    signed_in(monkeypatch, "spanmill-controller", "not-the-password")
    with pytest.raises(RegistryError, match="401"):
        ModelRegistry(auth_mlflow.url).aliases(agent)


def test_users_again_changes_nothing_but_a_rotated_password(
    auth_mlflow: AuthServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = secrets.token_hex(8), secrets.token_hex(8)
    pipeline = secret_folder(tmp_path, "pipeline", "rotating-pipeline", old)
    assert "created" in make_users(auth_mlflow, "--pipeline", str(pipeline))
    assert "updated" in make_users(auth_mlflow, "--pipeline", str(pipeline))
    secret_folder(tmp_path, "pipeline", "rotating-pipeline", new)
    assert "updated" in make_users(auth_mlflow, "--pipeline", str(pipeline))
    search = f"{auth_mlflow.url}/api/2.0/mlflow/registered-models/search"
    assert httpx.get(search, auth=("rotating-pipeline", old), timeout=10).status_code == 401
    signed_in(monkeypatch, "rotating-pipeline", new)
    agent = f"rot-{uuid.uuid4().hex[:8]}"
    ModelRegistry(auth_mlflow.url).ensure_model(agent)
    assert agent in ModelRegistry(auth_mlflow.url).agents()


def test_users_fails_clearly_on_bad_credentials(auth_mlflow: AuthServer, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "username").write_text("spanmill-pipeline")
    (empty / "password").write_text("\n")
    args = ["models", "users", "--tracking-uri", auth_mlflow.url, "--wait", "5"]
    admin_env = dict(zip(CREDENTIAL_ENV, auth_mlflow.admin, strict=True))
    result = runner.invoke(app, [*args, "--pipeline", str(empty)], env=admin_env)
    assert result.exit_code == 1 and "password is empty" in " ".join(result.output.split())
    result = runner.invoke(app, [*args, "--pipeline", str(tmp_path / "none")], env=admin_env)
    assert result.exit_code == 1 and "cannot read" in result.output
    good = secret_folder(tmp_path, "good", "spanmill-pipeline-2", secrets.token_hex(8))
    wrong_admin = {CREDENTIAL_ENV[0]: auth_mlflow.admin[0], CREDENTIAL_ENV[1]: "wrong"}
    result = runner.invoke(app, [*args, "--pipeline", str(good)], env=wrong_admin)
    assert result.exit_code == 1 and "refused the admin's" in " ".join(result.output.split())
    no_admin = {name: "" for name in CREDENTIAL_ENV}
    result = runner.invoke(app, [*args, "--pipeline", str(good)], env=no_admin)
    assert result.exit_code == 1 and "MLFLOW_TRACKING_USERNAME" in result.output
