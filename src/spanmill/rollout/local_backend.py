"""The controller's backend on one machine: a JSON state file, and the routing table in the
gateway's routing file or through its admin API.

Decisions are appended to ``<state file>.events.jsonl`` beside the state, one
JSON object a line, so ``spanmill rollout status`` (and a person with ``tail``)
can see the history.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
from pydantic import ValidationError

from spanmill.errors import ConfigError
from spanmill.gateway.routing import RoutingFile, RoutingTable
from spanmill.rollout.backend import BackendError
from spanmill.rollout.schemas import ControllerState, Decision

_EVENTS_KEPT = 2000


class LocalBackend:
    def __init__(
        self,
        state_file: Path,
        *,
        routing_file: Path | None = None,
        gateway_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        if (routing_file is None) == (gateway_url is None):
            raise ConfigError(
                "the local rollout backend writes routes to a routing file or to a gateway's "
                "admin API: set exactly one of SPANMILL_ROLLOUT_ROUTING_FILE and "
                "SPANMILL_ROLLOUT_GATEWAY_ADMIN_URL"
            )
        self.state_file = Path(state_file)
        self.events_file = self.state_file.with_name(self.state_file.name + ".events.jsonl")
        self.routing = RoutingFile(routing_file) if routing_file is not None else None
        self.gateway_url = gateway_url.rstrip("/") if gateway_url else None
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s

    def describe(self) -> str:
        routes = (
            self.routing.path if self.routing is not None else f"{self.gateway_url}/admin/routes"
        )
        return f"state {self.state_file}, routes {routes}"

    def load(self) -> tuple[ControllerState, RoutingTable]:
        return self._state(), self._routes()

    def _state(self) -> ControllerState:
        try:
            text = self.state_file.read_text()
        except FileNotFoundError:
            return ControllerState()
        try:
            return ControllerState.model_validate_json(text)
        except ValidationError as exc:
            raise BackendError(
                f"rollout state {self.state_file} is unreadable "
                f"({exc.errors()[0]['msg']}); fix it, or delete it to start over from the MLflow "
                "aliases (an unfinished canary then starts again)"
            ) from None

    def _routes(self) -> RoutingTable:
        if self.routing is not None:
            return self.routing.current()
        try:
            response = httpx.get(f"{self.gateway_url}/admin/routes", headers=self.headers,
                                 timeout=self.timeout_s)  # fmt: skip
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise BackendError(
                f"cannot read routes from {self.gateway_url}/admin/routes: {exc}"
            ) from None
        return RoutingTable.parse(response.content, f"{self.gateway_url}/admin/routes")

    def save(self, state: ControllerState, table: RoutingTable | None) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f".{self.state_file.name}.tmp")
        tmp.write_text(state.model_dump_json(indent=2))
        os.replace(tmp, self.state_file)
        if table is None:
            return
        if self.routing is not None:
            self.routing.write(table)
            return
        try:
            response = httpx.put(f"{self.gateway_url}/admin/routes", content=table.dumps(),
                                 headers=self.headers, timeout=self.timeout_s)  # fmt: skip
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise BackendError(
                f"cannot write routes to {self.gateway_url}/admin/routes: {exc}"
            ) from None

    def event(self, decision: Decision) -> None:
        self.events_file.parent.mkdir(parents=True, exist_ok=True)
        with self.events_file.open("a") as handle:
            handle.write(decision.model_dump_json() + "\n")
        if self.events_file.stat().st_size > _EVENTS_KEPT * 400:
            lines = self.events_file.read_text().splitlines()[-_EVENTS_KEPT:]
            tmp = self.events_file.with_name(f".{self.events_file.name}.tmp")
            tmp.write_text("\n".join(lines) + "\n")
            os.replace(tmp, self.events_file)

    def events(self, limit: int = 50) -> list[Decision]:
        try:
            lines = self.events_file.read_text().splitlines()[-limit:]
        except FileNotFoundError:
            return []
        found = []
        for line in lines:
            try:
                found.append(Decision.model_validate(json.loads(line)))
            except (ValueError, ValidationError):
                continue
        return found
