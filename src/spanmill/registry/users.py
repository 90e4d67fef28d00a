"""spanmill's own users on an MLflow server that runs the basic-auth app.

On a cluster the rollout controller and the pipeline each sign in as their own
MLflow user (every MLflow client reads ``MLFLOW_TRACKING_USERNAME`` and
``MLFLOW_TRACKING_PASSWORD``). The chart's hook Job runs :func:`ensure_users` after
every install and upgrade, signed in as the admin: a missing user is created, an
existing one is given the password of its Secret again (a rotated Secret takes
effect), and its grants are applied again. Running it twice changes nothing.

The grants cover every resource of a type (``*``), so they hold for agents that do
not exist yet. People who sign in without a grant get the server's
``default_permission`` (READ in the chart: they see everything and change nothing).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from spanmill.registry.names import RegistryError

# The controller moves and deletes aliases (deleting one needs MANAGE) and tags
# versions; it reads runs for their lineage and artifacts.
CONTROLLER_GRANTS: Final[Mapping[str, str]] = {"registered_model": "MANAGE", "experiment": "READ"}
# The pipeline logs runs (training, evaluation), registers versions and sets
# ``challenger``; models it creates are its own (MANAGE) in any case.
PIPELINE_GRANTS: Final[Mapping[str, str]] = {"registered_model": "EDIT", "experiment": "EDIT"}
ROLES: Final[Mapping[str, Mapping[str, str]]] = {
    "controller": CONTROLLER_GRANTS,
    "pipeline": PIPELINE_GRANTS,
}
# A mounted Secret holds one file per key; these are the keys the chart and the
# pipeline's Secret "spanmill-mlflow" use.
USERNAME_FILE: Final = "username"
PASSWORD_FILE: Final = "password"
# MLflow's own client variables: the admin signs in with them here.
ADMIN_ENV: Final = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


@dataclass(frozen=True)
class ServiceUser:
    """An MLflow user spanmill signs in as, and what it is granted."""

    role: str
    username: str
    password: str = field(repr=False)
    grants: Mapping[str, str] = field(default_factory=dict)


def user_from_folder(role: str, folder: Path) -> ServiceUser:
    """The user of ``role`` from a mounted Secret: files ``username`` and ``password``."""
    if role not in ROLES:
        raise RegistryError(f"unknown MLflow user role {role!r}: one of {sorted(ROLES)}")
    values: dict[str, str] = {}
    for key in (USERNAME_FILE, PASSWORD_FILE):
        path = folder / key
        try:
            values[key] = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise RegistryError(
                f"the {role} user's credentials: cannot read {path} ({exc.strerror}); mount "
                f"a Secret with the keys {USERNAME_FILE!r} and {PASSWORD_FILE!r} there"
            ) from None
        if not values[key]:
            raise RegistryError(f"the {role} user's credentials: {path} is empty")
    return ServiceUser(role, values[USERNAME_FILE], values[PASSWORD_FILE], ROLES[role])


def wait_for_server(tracking_uri: str, timeout_s: float) -> None:
    """Return once ``/health`` answers 200 (it needs no credentials), or raise after
    ``timeout_s``: on install, the server may still be starting."""
    url = f"{tracking_uri.rstrip('/')}/health"
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            response = httpx.get(url, timeout=5.0)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last = str(exc) or type(exc).__name__
        if time.monotonic() >= deadline:
            raise RegistryError(f"MLflow at {tracking_uri} is not up after {timeout_s:g}s: {last}")
        time.sleep(2.0)


def ensure_users(tracking_uri: str, users: Sequence[ServiceUser]) -> list[str]:
    """Create or update each user and apply its grants, signed in with the admin's
    credentials from ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``.

    Returns one line per user saying what was done.
    """
    from mlflow.server.auth.client import AuthServiceClient

    missing = [v for v in ADMIN_ENV if not os.environ.get(v)]
    if missing:
        raise RegistryError(f"set {' and '.join(missing)} to the MLflow admin's credentials")
    names = [u.username for u in users]
    if len(set(names)) != len(names):
        raise RegistryError(f"each spanmill role needs a user of its own, got {names}")
    client = AuthServiceClient(tracking_uri)
    done = []
    for user in users:
        created = _ensure_user(client, tracking_uri, user)
        for resource_type, permission in user.grants.items():
            _grant(client, tracking_uri, user.username, resource_type, permission)
        grants = ", ".join(f"{p} on every {t}" for t, p in user.grants.items())
        verb = "created" if created else "updated"
        done.append(f"{user.role} user {user.username!r} {verb}; {grants or 'no grants'}")
    return done


def _ensure_user(client: Any, tracking_uri: str, user: ServiceUser) -> bool:
    """True when the user was created, False when it existed (its password is reset)."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_user(user.username, user.password)
        return True
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise _error(exc, tracking_uri, f"creating the {user.role} user") from None
    try:
        client.update_user_password(user.username, user.password)
    except MlflowException as exc:
        raise _error(exc, tracking_uri, f"setting the {user.role} user's password") from None
    return False


def _grant(
    client: Any, tracking_uri: str, username: str, resource_type: str, permission: str
) -> None:
    from mlflow.exceptions import MlflowException

    what = f"granting {username!r} {permission} on every {resource_type}"
    try:
        client.grant_user_permission(username, resource_type, "*", permission)
        return
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise _error(exc, tracking_uri, what) from None
    # A grant exists, maybe at another level: replace it.
    try:
        client.revoke_user_permission(username, resource_type, "*")
        client.grant_user_permission(username, resource_type, "*", permission)
    except MlflowException as exc:
        raise _error(exc, tracking_uri, what) from None


def _error(exc: Exception, tracking_uri: str, what: str) -> RegistryError:
    text = str(exc)
    if "401" in text:
        hint = (
            "MLflow refused the admin's credentials (MLFLOW_TRACKING_USERNAME/"
            "MLFLOW_TRACKING_PASSWORD). The server takes the admin's password only when it "
            "first creates the admin: change it afterwards through MLflow's update-password "
            "API, then in the Secret"
        )
    elif "403" in text:
        hint = "the user in MLFLOW_TRACKING_USERNAME is not an MLflow admin"
    else:
        hint = text
    return RegistryError(f"MLflow at {tracking_uri}: {what} failed: {hint}")
