"""A Triton replica's readiness: up, and holding every version the routing table sends to.

Run in each Triton pod as its readiness probe (``spanmill triton ready``), reading
the routing ConfigMap mounted as a file. A new replica starts with nothing loaded;
the rollout controller finds it through the headless Service's EndpointSlices and
loads the routed versions onto it (see :mod:`spanmill.rollout.fleet`), and only
then does the replica count as ready, so the gateway's Service never sends it a
request it would answer with "unknown model".

The mounted file follows the ConfigMap after the kubelet's sync (up to a minute or
two), so it may still route to a version the controller has since rolled back and
unloaded. Requiring that version would take every replica out of service at once,
so a version is required only where this replica can still hold it:

- a model this server's repository does not have (no such model, or a typo in a
  hand-written route) is nobody's to serve: not required;
- a version this server unloaded (the controller took it out) or never saw while
  it holds the model (its folder is not in the repository): not required;
- a model in the repository that this server has not loaded at all, or a version
  that is loading or failed to load: missing, and the replica is not ready.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spanmill.errors import ConfigError, SpanmillError
from spanmill.gateway.routing import RoutingTable


class ReadinessError(SpanmillError):
    """The replica is not ready; the message says what it lacks."""


def routed_versions(table: RoutingTable) -> set[tuple[str, int]]:
    """(Triton model, version) of every backend that takes a share of traffic (in the
    vLLM flavour every version is served by the model's one engine version)."""
    from spanmill.serving.repository import ENGINE_VERSION

    return {
        (route.triton_model, ENGINE_VERSION if route.flavour == "vllm" else int(backend.version))
        for route in table.routes.values()
        for backend in route.backends
        if backend.weight > 0
    }


def missing_versions(
    routed: Iterable[tuple[str, int]], index: Iterable[Mapping[str, Any]]
) -> list[str]:
    """What this server lacks of ``routed``, judged on its repository index (see above).

    ``index`` is Triton's ``POST /v2/repository/index`` answer: one entry per model in
    the repository, or per version for a model it has loaded or unloaded.
    """
    in_repository: set[str] = set()
    states: dict[str, dict[int, tuple[str, str]]] = {}
    for entry in index:
        name = str(entry.get("name", ""))
        in_repository.add(name)
        number = str(entry.get("version", ""))
        if number.isdigit():
            found = (str(entry.get("state", "")), str(entry.get("reason", "")))
            states.setdefault(name, {})[int(number)] = found
    missing: list[str] = []
    for model, version in sorted(routed):
        if model not in in_repository:
            continue
        versions = states.get(model, {})
        if not versions:
            missing.append(f"{model} version {version}: the model is not loaded")
            continue
        if version not in versions:
            continue
        state, reason = versions[version]
        # Loaded, or taken out on purpose by the controller (see above).
        if state in ("READY", "UNLOADING") or (state, reason) == ("UNAVAILABLE", "unloaded"):
            continue
        why = f" ({reason.splitlines()[0][:200]})" if reason.strip() else ""
        missing.append(f"{model} version {version}: {state}{why}")
    return missing


def read_routes(path: Path) -> RoutingTable:
    """The routing table in ``path``; an empty one when there is no file yet."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return RoutingTable()
    except OSError as exc:
        raise ConfigError(f"cannot read the routing table {path}: {exc}") from None
    return RoutingTable.parse(text, str(path)) if text.strip() else RoutingTable()


def check(url: str, table: RoutingTable, *, timeout_s: float = 3.0) -> None:
    """Raise ReadinessError unless the server at ``url`` is ready and holds what ``table``
    routes to."""
    import httpx

    base = url if "://" in url else f"http://{url}"
    routed = routed_versions(table)
    try:
        with httpx.Client(base_url=base, timeout=timeout_s) as client:
            health = client.get("/v2/health/ready")
            if health.status_code != 200:
                raise ReadinessError(f"Triton at {url} is not ready (HTTP {health.status_code})")
            if not routed:
                return
            answer = client.post("/v2/repository/index", json={})
            answer.raise_for_status()
            index = answer.json()
    except httpx.HTTPError as exc:
        raise ReadinessError(f"cannot ask Triton at {url}: {type(exc).__name__}: {exc}") from None
    except ValueError as exc:
        raise ReadinessError(f"Triton at {url} answered its repository index with {exc}") from None
    if not isinstance(index, list):
        raise ReadinessError(f"Triton at {url} answered its repository index with {index!r}")
    missing = missing_versions(routed, index)
    if missing:
        raise ReadinessError(
            f"not ready for routing revision {table.revision}: " + "; ".join(missing)
        )
