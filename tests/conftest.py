"""Fixtures shared by every test: the real services, each started once per session.

Each service binds 127.0.0.1 on free ports, keeps its files under the session's
temporary folder, and is stopped (with everything it spawned) at the end. `kube` is
kmock's in-memory Kubernetes API (kube_emulator.py), one per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kube_emulator import KubeAPI, VersionedEmulator

from spanmill.stack.ports import free_port, port_in_use
from spanmill.stack.process import wait_until
from spanmill.stack.services import (
    KafkaBroker,
    MLflowServer,
    RunningService,
    TritonServer,
)


@dataclass(frozen=True)
class KafkaService:
    running: RunningService
    broker: KafkaBroker

    @property
    def bootstrap_servers(self) -> str:
        return self.running.url

    def create_topic(self, name: str, partitions: int = 1) -> str:
        self.broker.create_topic(name, partitions)
        return name


@dataclass(frozen=True)
class MLflowService:
    running: RunningService

    @property
    def tracking_uri(self) -> str:
        return self.running.url


@dataclass
class TritonService:
    running: RunningService
    model_repository: Path
    server: TritonServer

    def restart_if_dead(self) -> str | None:
        """Start the session's server again, on the same ports and repository, if it has
        exited; what happened (its exit status, the end of its log), or None if it runs."""
        if self.running.process.alive():
            return None
        # Its stubs, if any outlived it, before it is reaped (its pid names their group).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.running.process.pid, signal.SIGKILL)
        try:  # ours to reap: the child's status, and no zombie left
            _, status = os.waitpid(self.running.process.pid, os.WNOHANG)
            how = f"exit status {os.waitstatus_to_exitcode(status)}" if status else "no status"
        except ChildProcessError:
            how = "no status"
        log = Path(self.running.log_path).read_text(errors="replace").splitlines()[-15:]
        # Its ports are held until the last of its processes is gone.
        host, ports = self.running.host, self.running.ports.values()
        wait_until(lambda: not any(port_in_use(host, port) for port in ports),
                   timeout=30, what="the dead tritonserver's ports being let go")  # fmt: skip
        self.running = self.server.start()
        return f"the session's tritonserver had exited ({how}); started again. Its log ended:\n" + (
            "\n".join(log)
        )

    @property
    def http_url(self) -> str:
        return self.running.url

    @property
    def grpc_url(self) -> str:
        return f"{self.running.host}:{self.running.ports['grpc']}"


class ServiceRestarted(UserWarning):
    """A session service died during a test and was started again for the tests after."""


# `make test` hands whole test files to two pytest-xdist workers (`--dist loadfile`,
# `--no-loadscope-reorder`), in collection order, the files of tests marked slow first:
# the longest start at once and the short ones fill in around them. A worker running an
# end-to-end file is given no second one to queue behind it: the loops (the cluster
# rehearsal, the own-agent flywheel) run side by side on the two workers. With torch's
# idle threads asleep (`src/spanmill/__init__.py`) they share the cores; one after the
# other they took longer than all the rest of the suite.
END_TO_END = "tests/e2e/"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class EndToEndApart(LoadFileScheduling):  # type: ignore[misc]
        def _assign_work_unit(self, node: Any) -> None:
            if any(
                scope.startswith(END_TO_END) and not all(tests.values())
                for scope, tests in self.assigned_work.get(node, {}).items()
            ):
                # The first file in the queue that is not end-to-end goes first.
                for scope in self.workqueue:
                    if not scope.startswith(END_TO_END):
                        self.workqueue.move_to_end(scope, last=False)
                        break
            super()._assign_work_unit(node)

    return EndToEndApart(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def kafka(services_dir: Path) -> Iterator[KafkaService]:
    broker = KafkaBroker("127.0.0.1", free_port(), services_dir / "kafka", partitions=3)
    running = broker.start()
    try:
        yield KafkaService(running, broker)
    finally:
        running.stop()


@pytest.fixture(scope="session")
def mlflow_server(services_dir: Path) -> Iterator[MLflowService]:
    server = MLflowServer("127.0.0.1", free_port(), services_dir / "mlflow")
    running = server.start()
    try:
        yield MLflowService(running)
    finally:
        running.stop()


@pytest.fixture(scope="session")
def triton(services_dir: Path) -> Iterator[TritonService]:
    repository = services_dir / "model-repository"
    server = TritonServer(
        "127.0.0.1",
        services_dir / "triton",
        repository,
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
    )
    # The vLLM backend cannot run without a GPU: its stand-in takes its place, as a
    # Python-based backend, as NVIDIA's image installs the real one (see the file).
    standin = server.install.backend_dir / "vllm"
    standin.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("vllm_backend_standin.py"), standin / "model.py")
    service = TritonService(server.start(), repository, server)
    _TRITON.append(service)
    try:
        yield service
    finally:
        _TRITON.remove(service)
        service.running.stop()


# The session's Triton, once a test has asked for it. One server serves every test of a
# worker: were it to die, every later test would fail with "connection refused".
_TRITON: list[TritonService] = []


@pytest.fixture(autouse=True)
def _triton_outlives_each_test() -> Iterator[None]:
    """After each test, the session's Triton runs: started again if it died, and the test
    during which it died named in the warnings summary with the end of its log."""
    yield
    for service in _TRITON:
        died = service.restart_if_dead()
        if died is not None:
            warnings.warn(died, ServiceRestarted, stacklevel=1)


@pytest.fixture(scope="session")
def s3() -> Iterator[dict[str, Any]]:
    """The local S3 endpoint (moto's server on 127.0.0.1) standing in for a real object
    store; its fsspec storage options. ``object_store.s3_bucket`` makes a fresh bucket in it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "key": "test",
        "secret": "test",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    try:
        yield options
    finally:
        server.stop()


@pytest.fixture(params=["folder", "s3"])
def store_at(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A new span store's URL and storage options: a folder, then a bucket on the local
    S3 endpoint."""
    from object_store import s3_bucket

    if request.param == "folder":
        return str(tmp_path / "store"), {}
    options: dict[str, Any] = request.getfixturevalue("s3")
    return s3_bucket(options), options


@pytest.fixture(scope="session")
def taught_adapters(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two adapters of SmolLM2 whose answers tell them apart (tests/taught_adapters.py)."""
    from taught_adapters import both

    return both(smollm2_dir, tmp_path_factory.mktemp("taught-adapters"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real SmolLM2-135M-Instruct as a Hugging Face folder.

    Pulling is idempotent: the Makefile pre-pulls into $SPANMILL_HOME, which makes
    this instant; otherwise the first test using it pays the conversion once.
    """
    from spanmill.models import pull_model
    from spanmill.paths import models_dir

    return pull_model("smollm2-135m", models_dir())


@contextmanager
def _serve(app: Any, health_path: str = "/healthz") -> Iterator[str]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}{health_path}", timeout=1).status_code < 500:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@pytest.fixture
def serve_app() -> Callable[..., AbstractContextManager[str]]:
    """``with serve_app(app) as url:`` runs an ASGI app with uvicorn on a free port."""
    return _serve


@pytest.fixture
def kube() -> Iterator[KubeAPI]:
    """kmock's in-memory Kubernetes API on a port, served from a thread of its own.

    The official client is synchronous, so the emulator cannot share the test's
    event loop. kmock takes ``?watch=true`` only in lower case; the official
    client sends ``watch=True``, which the real API server reads as true too, so
    the emulator is taught the same. It also keeps resource versions as the real API
    server does (kube_emulator.py): writes with a stale one are answered 409 Conflict.
    """
    import kmock
    from kmock._internal import parsing

    original = parsing.guess_k8s

    def guess(k8s: Any, method: Any, query: dict[str, str]) -> Any:
        if str(query.get("watch", "")).lower() == "true":
            query = {**query, "watch": "true"}
        return original(k8s, method, query)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stack = AsyncExitStack()

    async def start() -> tuple[str, Any]:
        emulator = await stack.enter_async_context(VersionedEmulator())
        server = await stack.enter_async_context(kmock.Server(emulator))
        return str(server.url).rstrip("/"), emulator

    parsing.guess_k8s = guess
    try:
        url, emulator = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
        yield KubeAPI(url, emulator)
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stack.aclose(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        parsing.guess_k8s = original
