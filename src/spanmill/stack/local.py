"""The embedded stack on one machine: start, inspect and stop what ``spanmill up`` runs.

The state folder holds ``stack.json`` with each service's pid (and its creation
time, so a recycled pid is never mistaken for ours), ports and log file. ``down``
stops exactly the processes recorded there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from spanmill.config import StackSettings
from spanmill.errors import StackError
from spanmill.stack.services import (
    CollectorProcess,
    GatewayProcess,
    KafkaBroker,
    MLflowServer,
    RunningService,
    Service,
    TritonServer,
)

SERVICE_NAMES = ("kafka", "mlflow", "triton", "gateway", "collector")


def build_services(settings: StackSettings) -> list[Service]:
    """The services of the stack, in start order."""
    work = settings.state_dir
    return [
        KafkaBroker(
            settings.host,
            settings.kafka_port,
            work,
            partitions=settings.kafka_partitions,
            timeout=settings.startup_timeout_s,
        ),
        MLflowServer(settings.host, settings.mlflow_port, work, timeout=settings.startup_timeout_s),
        TritonServer(
            settings.host,
            work,
            settings.model_repository,
            http_port=settings.triton_http_port,
            grpc_port=settings.triton_grpc_port,
            metrics_port=settings.triton_metrics_port,
            timeout=settings.startup_timeout_s,
        ),
        GatewayProcess(
            settings.host,
            settings.gateway_port,
            work,
            routing_file=settings.routing_file,
            kafka_bootstrap=f"{settings.host}:{settings.kafka_port}",
            triton_url=f"{settings.host}:{settings.triton_http_port}",
            timeout=settings.startup_timeout_s,
        ),
        CollectorProcess(
            settings.host,
            settings.collector_port,
            work,
            store_url=settings.span_store,
            kafka_bootstrap=f"{settings.host}:{settings.kafka_port}",
            timeout=settings.startup_timeout_s,
        ),
    ]


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    url: str
    log_path: str


class LocalStack:
    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.state_file = settings.state_dir / "stack.json"

    def _read(self) -> dict[str, RunningService]:
        if not self.state_file.exists():
            return {}
        try:
            raw = json.loads(self.state_file.read_text())
            return {name: RunningService.from_json(s) for name, s in raw["services"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise StackError(
                f"state file {self.state_file} is unreadable ({exc}); "
                "stop the services by hand and delete it"
            ) from None

    def _write(self, services: dict[str, RunningService]) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        if not services:
            self.state_file.unlink(missing_ok=True)
            return
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"services": {n: s.to_json() for n, s in services.items()}}, indent=2)
        )
        os.replace(tmp, self.state_file)

    def up(
        self, on_started: Callable[[RunningService], None] | None = None
    ) -> list[RunningService]:
        """Start every service not already running; recorded as each one becomes healthy."""
        recorded = {n: s for n, s in self._read().items() if s.process.alive()}
        self._write(recorded)
        for service in build_services(self.settings):
            if service.name in recorded:
                continue
            running = service.start()
            recorded[service.name] = running
            self._write(recorded)
            if on_started:
                on_started(running)
        return [recorded[n] for n in SERVICE_NAMES if n in recorded]

    def down(self, on_stopped: Callable[[str], None] | None = None) -> list[str]:
        """Stop what the state file records, in reverse start order."""
        recorded = self._read()
        stopped = []
        for name in reversed(SERVICE_NAMES):
            service = recorded.pop(name, None)
            if service is None:
                continue
            service.stop()
            stopped.append(name)
            self._write(recorded)
            if on_stopped:
                on_stopped(name)
        self._write({})
        return stopped

    def status(self) -> list[ServiceStatus]:
        recorded = self._read()
        checks = {s.name: s for s in build_services(self.settings)}
        rows = []
        for name in SERVICE_NAMES:
            service = recorded.get(name)
            if service is None:
                rows.append(ServiceStatus(name, None, False, False, checks[name].url, ""))
                continue
            alive = service.process.alive()
            healthy = False
            if alive:
                try:
                    healthy = checks[name].healthy()
                except Exception:
                    healthy = False
            rows.append(
                ServiceStatus(
                    name, service.process.pid, alive, healthy, service.url, service.log_path
                )
            )
        return rows
