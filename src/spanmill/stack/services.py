"""The real services of the embedded stack: the tansu Kafka broker, MLflow, tritonserver.

One start/health/stop loop (:class:`Service`) with a subclass per service that says
how to launch it, which ports it needs and how to tell it is healthy. Used both by
``spanmill up`` and by the test fixtures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from spanmill import semconv
from spanmill.errors import StackError
from spanmill.stack import binaries
from spanmill.stack.ports import can_connect, port_in_use
from spanmill.stack.process import ProcessRecord, spawn, wait_until


@dataclass(frozen=True)
class RunningService:
    """A started service: enough to reach it, check it, and stop exactly it."""

    name: str
    process: ProcessRecord
    host: str
    ports: dict[str, int]
    url: str
    log_path: str
    started_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunningService:
        values = dict(data)
        values["process"] = ProcessRecord(**values["process"])
        return cls(**values)

    def stop(self, timeout: float = 15.0) -> None:
        self.process.stop(timeout=timeout)


class Service:
    """Start a service detached, wait until it is healthy, fail with its log if not."""

    name: ClassVar[str]

    def __init__(self, host: str, work_dir: Path, timeout: float = 120.0) -> None:
        self.host = host
        self.work_dir = work_dir
        self.timeout = timeout

    # What each service says about itself.
    def ports(self) -> dict[str, int]:
        raise NotImplementedError

    def argv(self) -> Sequence[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def url(self) -> str:
        raise NotImplementedError

    def healthy(self) -> bool:
        raise NotImplementedError

    def after_start(self) -> None:
        """Work that needs the service up (topics, for the broker)."""

    @property
    def log_path(self) -> Path:
        return self.work_dir / "logs" / f"{self.name}.log"

    def start(self) -> RunningService:
        for role, port in self.ports().items():
            if port_in_use(self.host, port):
                raise StackError(
                    f"{self.name}: port {port} on {self.host} ({role}) is already taken; "
                    f"stop what listens there or choose another port "
                    f"(SPANMILL_STACK_{self.name.upper()}_"
                    f"{'PORT' if role == 'main' else role.upper() + '_PORT'})"
                )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        popen, record = spawn(self.argv(), log_path=self.log_path, env=self.env())
        running = RunningService(
            name=self.name,
            process=record,
            host=self.host,
            ports=self.ports(),
            url=self.url,
            log_path=str(self.log_path),
        )
        try:
            wait_until(
                self.healthy,
                timeout=self.timeout,
                what=self.name,
                popen=popen,
                log_path=self.log_path,
            )
            self.after_start()
        except BaseException:
            running.stop(timeout=5.0)
            raise
        return running


class KafkaBroker(Service):
    """The tansu broker, in-memory storage, with the span and dead-letter topics."""

    name = "kafka"

    def __init__(
        self,
        host: str,
        port: int,
        work_dir: Path,
        *,
        partitions: int = 3,
        topics: Sequence[str] = (semconv.SPANS_TOPIC, semconv.DLQ_TOPIC, semconv.ROLLOUTS_TOPIC),
        timeout: float = 60.0,
    ) -> None:
        super().__init__(host, work_dir, timeout)
        self.port = port
        self.partitions = partitions
        self.topics = tuple(topics)
        self.binary = binaries.tansu_binary()

    def ports(self) -> dict[str, int]:
        return {"main": self.port}

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def argv(self) -> Sequence[str]:
        listener = f"tcp://{self.host}:{self.port}"
        return [
            str(self.binary),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            "memory://tansu/",
        ]

    def healthy(self) -> bool:
        return can_connect(self.host, self.port)

    def after_start(self) -> None:
        for topic in self.topics:
            self.create_topic(topic, self.partitions)

    def create_topic(self, topic: str, partitions: int) -> None:
        result = subprocess.run(
            [
                str(self.binary),
                "topic",
                "create",
                topic,
                "--broker",
                f"tcp://{self.host}:{self.port}",
                "--partitions",
                str(partitions),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if result.returncode != 0:
            raise StackError(
                f"kafka: creating topic {topic!r} failed: {result.stderr.strip() or result.stdout}"
            )


class MLflowServer(Service):
    """An MLflow tracking server with a sqlite backend and served local artifacts."""

    name = "mlflow"

    def __init__(self, host: str, port: int, work_dir: Path, *, timeout: float = 120.0) -> None:
        super().__init__(host, work_dir, timeout)
        self.port = port
        self.binary = binaries.mlflow_binary()

    def ports(self) -> dict[str, int]:
        return {"main": self.port}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> Sequence[str]:
        data = self.work_dir / "mlflow"
        data.mkdir(parents=True, exist_ok=True)
        return [
            str(self.binary),
            "server",
            "--backend-store-uri",
            f"sqlite:///{data / 'mlflow.db'}",
            "--artifacts-destination",
            str(data / "artifacts"),
            "--serve-artifacts",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]

    def env(self) -> dict[str, str]:
        env = super().env()
        # Without it MLflow starts a job runner: ten processes and 2.4 GB instead of one.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        return env

    def healthy(self) -> bool:
        return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200


class TritonServer(Service):
    """tritonserver with explicit model control and the Python backend."""

    name = "triton"

    def __init__(
        self,
        host: str,
        work_dir: Path,
        model_repository: Path,
        *,
        http_port: int,
        grpc_port: int,
        metrics_port: int,
        timeout: float = 120.0,
    ) -> None:
        super().__init__(host, work_dir, timeout)
        self.model_repository = model_repository
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.metrics_port = metrics_port
        self.install = binaries.triton_install(work_dir)

    def ports(self) -> dict[str, int]:
        return {"main": self.http_port, "grpc": self.grpc_port, "metrics": self.metrics_port}

    @property
    def url(self) -> str:
        return f"{self.host}:{self.http_port}"

    def argv(self) -> Sequence[str]:
        self.model_repository.mkdir(parents=True, exist_ok=True)
        return [
            str(self.install.binary),
            f"--model-repository={self.model_repository}",
            "--model-control-mode=explicit",
            f"--backend-directory={self.install.backend_dir}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--pinned-memory-pool-byte-size=0",
            "--allow-gpu-metrics=false",
            "--disable-auto-complete-config",
            "--exit-on-error=false",
            "--strict-readiness=false",
        ]

    def env(self) -> dict[str, str]:
        return dict(self.install.env)

    def healthy(self) -> bool:
        response = httpx.get(f"http://{self.url}/v2/health/ready", timeout=2.0)
        return response.status_code == 200


class SpanmillProcess(Service):
    """One of spanmill's own services, run as ``spanmill <command>`` with env settings."""

    command: ClassVar[tuple[str, ...]]
    health_path: ClassVar[str]

    def __init__(
        self,
        host: str,
        port: int,
        work_dir: Path,
        *,
        settings_env: dict[str, str],
        timeout: float = 60.0,
    ) -> None:
        super().__init__(host, work_dir, timeout)
        self.port = port
        self.settings_env = settings_env

    def ports(self) -> dict[str, int]:
        return {"main": self.port}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> Sequence[str]:
        return [sys.executable, "-m", "spanmill.cli.main", *self.command]

    def env(self) -> dict[str, str]:
        return {**super().env(), **self.settings_env}

    def healthy(self) -> bool:
        return httpx.get(f"{self.url}{self.health_path}", timeout=2.0).status_code == 200


class GatewayProcess(SpanmillProcess):
    """The spanmill gateway, routing by a table file the rollout controller rewrites."""

    name = "gateway"
    command = ("gateway",)
    health_path = "/healthz"

    def __init__(
        self,
        host: str,
        port: int,
        work_dir: Path,
        *,
        routing_file: Path,
        kafka_bootstrap: str,
        triton_url: str,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(
            host,
            port,
            work_dir,
            settings_env={
                "SPANMILL_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                "SPANMILL_TRITON_HTTP_URL": triton_url,
                "SPANMILL_GATEWAY_HOST": host,
                "SPANMILL_GATEWAY_PORT": str(port),
                "SPANMILL_GATEWAY_ROUTING_FILE": str(routing_file),
            },
            timeout=timeout,
        )


class CollectorProcess(SpanmillProcess):
    """The spanmill collector: the span topic into the Parquet span store."""

    name = "collector"
    command = ("collector",)
    health_path = "/readyz"

    def __init__(
        self,
        host: str,
        port: int,
        work_dir: Path,
        *,
        store_url: str,
        kafka_bootstrap: str,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(
            host,
            port,
            work_dir,
            settings_env={
                "SPANMILL_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                "SPANMILL_COLLECTOR_STORE_URL": store_url,
                "SPANMILL_COLLECTOR_HTTP_HOST": host,
                "SPANMILL_COLLECTOR_HTTP_PORT": str(port),
            },
            timeout=timeout,
        )

    def env(self) -> dict[str, str]:
        env = super().env()
        # One consumer process unless set: on one machine the collector shares the
        # cores with Triton, the gateway and training, and an agent's traffic is light.
        env.setdefault("SPANMILL_COLLECTOR_PROCESSES", "1")
        return env
