"""The policy being trained, served in-process behind a real gateway.

Reinforcement learning samples from the policy it is updating. On a CPU, or one
GPU, the simplest server of that policy is the training process itself:
:class:`PolicyServer` answers the gateway's upstream calls (the interface of
:class:`spanmill.gateway.upstream.TritonUpstream`) with the live PEFT model, so
a weight update is seen by the very next request. Requests that arrive
together are generated together, as Triton's dynamic batcher would
(:func:`spanmill.serving.generation.generate_all`).

:class:`RolloutGateway` runs spanmill's own gateway application over that
server, on a loopback port of its own: the agent's episode code calls it as it
calls production, and the gateway records each call (prompt and completion
token ids, logprobs, the policy version) with the code that records production
traffic, marked as training traffic and written to the rollout topic, which
the collector does not read.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal

from spanmill.config import GatewaySettings, KafkaSettings
from spanmill.gateway.routing import Backend, Route, RoutingTable
from spanmill.gateway.upstream import Target
from spanmill.serving.generation import Generator, Request, generate_all
from spanmill.serving.protocol import GenerationParams, GenerationResult

log = logging.getLogger(__name__)

POLICY_MODEL = "policy"  # the name the routing table gives the in-process model


@dataclass
class _Pending:
    request: Request
    answer: asyncio.Future[GenerationResult]


class PolicyServer:
    """The live model as the gateway's upstream. ``version`` names the policy serving now."""

    url = "in-process policy"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_tokens_limit: int = 1024,
        batch_window_s: float = 0.05,
        max_batch: int = 64,
    ) -> None:
        self.generator = Generator.around(
            model, tokenizer, max_tokens_limit=max_tokens_limit, version="1"
        )
        self.batch_window_s = batch_window_s
        self.max_batch = max_batch
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._busy: asyncio.Lock | None = None  # made on the serving loop, at first use

    @property
    def version(self) -> str:
        return self.generator.version

    @version.setter
    def version(self, value: str) -> None:
        self.generator.version = value

    async def ready(self) -> bool:
        return True

    async def generate(
        self,
        target: Target,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None,
    ) -> GenerationResult:
        loop = asyncio.get_running_loop()
        pending = _Pending(Request(messages, params, tools), loop.create_future())
        self._pending.append(pending)
        if len(self._pending) >= self.max_batch:
            self._start_flush(0.0)
        elif self._flusher is None or self._flusher.done():
            self._start_flush(self.batch_window_s)
        return await pending.answer

    async def stream(
        self,
        target: Target,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None,
    ) -> AsyncGenerator[list[str] | GenerationResult, None]:
        """Rollouts do not stream: a streamed request gets its whole answer at once."""
        yield await self.generate(target, messages, params, tools)

    def _start_flush(self, delay: float) -> None:
        if self._flusher is not None and not self._flusher.done() and delay > 0:
            return
        self._flusher = asyncio.get_running_loop().create_task(self._flush(delay))

    async def _flush(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        if self._busy is None:
            self._busy = asyncio.Lock()
        async with self._busy:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            if not batch:
                return
            results = await asyncio.to_thread(
                generate_all, self.generator, [p.request for p in batch]
            )
            for pending, result in zip(batch, results, strict=True):
                if pending.answer.done():
                    continue
                if isinstance(result, Exception):
                    pending.answer.set_exception(result)
                else:
                    pending.answer.set_result(result)
        if self._pending:
            self._start_flush(0.0)

    async def close(self) -> None:
        return None


@dataclass
class RolloutGateway:
    """spanmill's gateway over a :class:`PolicyServer`, listening on a loopback port.

    Agents call ``base_url`` with ``model=agent``; every call is recorded on
    ``kafka.spans_topic`` (the rollout topic) with ``spanmill.traffic=training``
    (unless ``traffic`` is None).
    """

    policy: PolicyServer
    agent: str
    kafka: KafkaSettings
    host: str = "127.0.0.1"
    port: int = 0
    # What the calls are marked as: RL rollouts, or (None) production traffic, as when
    # a benchmark plays production with a model it serves in-process.
    traffic: Literal["training"] | None = "training"
    _server: Any = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _app: Any = field(default=None, init=False, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 30.0) -> RolloutGateway:
        import uvicorn

        from spanmill.gateway.app import create_app

        # The socket is bound here, not a port chosen for uvicorn to bind later: nothing can
        # take the port in between.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = int(sock.getsockname()[1])
        settings = GatewaySettings(
            kafka=self.kafka, host=self.host, port=self.port, traffic=self.traffic
        )
        self._app = create_app(settings, upstream=self.policy, table=self._table())
        # Agents wait on a whole batch between turns: keep their connections open longer
        # than that, so no request goes out on a connection the server is closing.
        config = uvicorn.Config(
            self._app, host=self.host, port=self.port, log_level="warning", lifespan="on",
            timeout_keep_alive=300,
        )  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name="rollout-gateway",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the rollout gateway did not start on {self.base_url}")
            time.sleep(0.05)
        return self

    def serve_version(self, version: int) -> None:
        """From now on, calls are answered (and recorded) as policy ``version``."""
        self.policy.version = str(version)
        if self._app is not None:
            self._app.state.gateway.table = self._table()

    def _table(self) -> RoutingTable:
        version = self.policy.version or "1"
        backend = Backend(version=version, weight=1.0, role="policy")
        return RoutingTable(
            revision=int(version),
            routes={self.agent: Route(triton_model=POLICY_MODEL, backends=[backend])},
        )

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> RolloutGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
