"""A Triton replica's readiness: up, and holding every version the routing table sends to.

Served in each Triton pod by a container of its own beside Triton (``spanmill triton
ready --serve PORT``, :func:`serve`), whose readiness probe asks it, reading the
routing ConfigMap mounted as a file: one check for both flavours (the vLLM image
carries no spanmill), answered by a process that stays up, where a probe that ran a
command started Python and imported spanmill every ten seconds. A new replica starts
with nothing loaded; the rollout controller finds it through the headless Service's
EndpointSlices and loads the routed versions onto it (see
:mod:`spanmill.rollout.fleet`), and only then does the replica count as ready, so the
gateway's Service never sends it a request it would answer with "unknown model".

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

import logging
import signal
import threading
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from spanmill.errors import ConfigError, SpanmillError
from spanmill.gateway.routing import RoutingTable

log = logging.getLogger(__name__)

READY_PATH = "/ready"


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


def judge(url: str, routing_file: Path, *, timeout_s: float = 3.0) -> str:
    """Raise ReadinessError unless the server at ``url`` is ready for the table in
    ``routing_file``; what it is ready for. A table that cannot be read is reported and
    otherwise ignored: a bad edit of it must not take every replica out of service."""
    try:
        table = read_routes(routing_file)
        note = ""
    except ConfigError as exc:
        table, note = RoutingTable(), f" (ignoring the routing table: {exc})"
    try:
        check(url, table, timeout_s=timeout_s)
    except ReadinessError as exc:
        raise ReadinessError(f"{exc}{note}") from None
    return f"ready for routing revision {table.revision}{note}"


def server(
    url: str, routing_file: Path, port: int, *, host: str = "0.0.0.0", timeout_s: float = 3.0
) -> ThreadingHTTPServer:
    """An HTTP server answering ``GET /ready`` with 200 where :func:`judge` finds the
    server at ``url`` ready, else 503 and what it lacks; the pod's readiness probe asks
    it. Each request judges afresh (the mounted table changes under it); a change of
    answer is logged."""
    last: dict[str, int] = {}
    lock = threading.Lock()

    def changed(status: int, text: str) -> None:
        with lock:
            if last.get("status") == status:
                return
            last["status"] = status
        log.log(logging.INFO if status == 200 else logging.WARNING, "%s", text)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != READY_PATH:
                self._answer(404, f"only {READY_PATH} is served here")
                return
            try:
                status, text = 200, judge(url, routing_file, timeout_s=timeout_s)
            except ReadinessError as exc:
                status, text = 503, str(exc)
            changed(status, text)
            self._answer(status, text)

        def _answer(self, status: int, text: str) -> None:
            body = (text + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a probe every few seconds is not news; a change of answer is

    return ThreadingHTTPServer((host, port), Handler)


def serve(
    url: str, routing_file: Path, port: int, *, host: str = "0.0.0.0", timeout_s: float = 3.0
) -> None:
    """Serve :func:`server` until SIGTERM or SIGINT."""
    httpd = server(url, routing_file, port, host=host, timeout_s=timeout_s)
    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        if not stopping.is_set():
            stopping.set()
            # shutdown() waits for serve_forever, which runs on this thread: from another.
            threading.Thread(target=httpd.shutdown, daemon=True).start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    log.info("answering readiness of Triton at %s on %s:%d%s", url, host, port, READY_PATH)
    with httpd:
        httpd.serve_forever(poll_interval=0.5)
