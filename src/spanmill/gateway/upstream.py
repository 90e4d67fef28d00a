"""Calling a model in Triton over HTTP (async), with errors mapped for clients.

Calls go to Triton's generate extension, in either flavour: spanmill's own model
(:mod:`spanmill.serving.protocol`), or Triton's vLLM backend
(:mod:`spanmill.serving.vllm`), for which the prompt is rendered here.

With several Triton replicas behind one Service, each connection goes to one ready
pod. A pod may lack a version another one serves (it joined a moment ago and its
readiness has not caught up, or it is the one whose load failed), so when Triton
answers that the version is missing the call is tried once more on a connection
of its own, which the Service may send to another pod. So is a call whose connection
broke before any of its answer reached the caller: a kept-alive connection Triton
closed as the request went out, a pod that went away (killed, drained) while it
generated, or one whose connect went unanswered (gone with its node while the Service
still names it); a generation has no effect but its answer. Nothing else is
retried: another error would happen again, a timeout once connected would only double
the load of a slow server, and an answer part of which the caller holds is not begun
again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import aiohttp

from spanmill.gateway.prompts import PromptError, Tokenizers
from spanmill.serving import protocol, vllm
from spanmill.serving.protocol import GenerationParams, GenerationResult
from spanmill.serving.repository import ENGINE_VERSION

log = logging.getLogger(__name__)


class UpstreamError(Exception):
    """Triton could not answer. ``status`` is the HTTP status the client gets; ``missing``
    says the server does not hold the version (another replica may); ``dropped``, that the
    connection broke before an answer (another connection may get one)."""

    def __init__(
        self,
        message: str,
        status: int,
        *,
        missing: bool = False,
        dropped: bool = False,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.missing = missing
        self.dropped = dropped
        self.code = code


@dataclass(frozen=True)
class Target:
    """Which model answers a call: a Triton model and the registered version asked for.

    In the vLLM flavour the version is served by an engine, the model's Triton version
    ``engine`` (the agent's one, or an evaluation's candidates'), as the adapter
    ``lora_name`` (or as the base model, with none), and the prompt is rendered with the
    tokenizer of ``base_model``.
    """

    model: str
    version: str
    flavour: Literal["python", "vllm"] = "python"
    lora_name: str | None = None
    base_model: str | None = None
    engine: int = ENGINE_VERSION


class Upstream(Protocol):
    """What the gateway asks of the server behind it: Triton, or a trainer's live policy."""

    url: str

    async def ready(self) -> bool: ...

    async def generate(
        self,
        target: Target,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None,
    ) -> GenerationResult: ...

    def stream(
        self,
        target: Target,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None,
    ) -> AsyncGenerator[list[str] | GenerationResult, None]:
        """The new piece of text of each choice as it comes, then the whole result."""
        ...

    async def close(self) -> None: ...


class _SpanmillAnswer:
    """The responses of a spanmill model: partial ones with new text, then the result."""

    def __init__(self) -> None:
        self.final: GenerationResult | None = None

    def add(self, event: Mapping[str, Any]) -> list[str] | None:
        if protocol.is_final(event):
            self.final = protocol.decode_final(event)
            return None
        return protocol.decode_partial(event)

    def result(self) -> GenerationResult | None:
        return self.final


class _VllmAnswer:
    """The responses of a vLLM model: every one carries new text; the stream's end is
    the answer's end."""

    def __init__(self, answer: vllm.Answer, version: str) -> None:
        self.answer = answer
        self.version = version
        self.seen = False

    def add(self, event: Mapping[str, Any]) -> list[str] | None:
        self.seen = True
        return self.answer.add(event)

    def result(self) -> GenerationResult | None:
        return self.answer.result(self.version) if self.seen else None


@dataclass(frozen=True)
class _Prepared:
    path: str
    body: dict[str, Any]
    n: int
    prompt: Any = None  # the rendered prompt of a vLLM call
    version: str = ""

    def answer(self) -> _SpanmillAnswer | _VllmAnswer:
        if self.prompt is None:
            return _SpanmillAnswer()
        return _VllmAnswer(
            vllm.Answer(self.n, self.prompt.token_ids, self.prompt.tokenizer), self.version
        )


# How long the readiness probe's question to Triton may take.
READY_TIMEOUT_S = 2.0


class TritonUpstream:
    """A model in Triton, on the generate extension's Server-Sent Events.

    Every call streams (``generate_stream``), a plain one too: the request then
    asks for no partial responses, and closing the connection is how a request
    is cancelled (Triton stops generating at the next token).
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = 300.0,
        on_retry: Callable[[], None] | None = None,
        tokenizers: Tokenizers | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.connect_timeout_s = min(timeout_s, connect_timeout_s)
        # Called for each call tried again on a fresh connection (a metric counts them).
        self.on_retry = on_retry
        self.tokenizers = tokenizers or Tokenizers()
        self._client: aiohttp.ClientSession | None = None

    def _new_client(self) -> aiohttp.ClientSession:
        # aiohttp rather than httpx: a call costs well under half the CPU, which on a busy
        # gateway is most of its own share of the latency (bench/gateway_overhead.py).
        # No bound on the connections: each generation holds one to its end, and a pool
        # of aiohttp's default 100 would make the 101st call wait for a free one and fail
        # at the connect timeout; Triton's own queue says when it is full (429).
        return aiohttp.ClientSession(
            base_url=f"http://{self.url}",
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=self.connect_timeout_s),
        )

    def _get(self) -> aiohttp.ClientSession:
        if self._client is None or self._client.closed:
            self._client = self._new_client()
        return self._client

    async def ready(self) -> bool:
        """Whether Triton says it is ready, within READY_TIMEOUT_S: under the session's bound
        for a generation (minutes), a Triton that never answers left a probe's call open
        long after the kubelet had given up on it, one more every few seconds."""
        try:
            bound = aiohttp.ClientTimeout(total=READY_TIMEOUT_S)
            async with self._get().get("/v2/health/ready", timeout=bound) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def _prepare(
        self,
        target: Target,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None,
        *,
        stream: bool,
    ) -> _Prepared:
        if target.flavour == "python":
            return _Prepared(
                path=f"/v2/models/{target.model}/versions/{target.version}/generate_stream",
                body=protocol.generate_body(messages, params, tools, stream=stream),
                n=params.n,
            )
        if target.base_model is None:
            raise UpstreamError(f"the vllm route to {target.model} names no base model", 500)
        try:
            prompt = await self.tokenizers.render(target.base_model, messages, tools)
        except PromptError as exc:
            raise UpstreamError(str(exc), 400 if "refused" in str(exc) else 503) from None
        # The engine is a Triton version of the model; the adapter names the version.
        return _Prepared(
            path=f"/v2/models/{target.model}/versions/{target.engine}/generate_stream",
            body=vllm.generate_body(prompt.text, params, target.lora_name, stream=stream),
            n=params.n,
            prompt=prompt,
            version=target.version,
        )

    async def generate(
        self,
        target: Target,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None,
    ) -> GenerationResult:
        prepared = await self._prepare(target, messages, params, tools, stream=False)
        # aclosing: a call cancelled midway (a deadline) closes its stream to Triton at
        # once, which stops the generation, instead of whenever the generator is collected.
        async with aclosing(self._events(target, prepared)) as events:
            async for event in events:
                if isinstance(event, GenerationResult):
                    return event
        raise UpstreamError(f"Triton model {target.model} ended without an answer", 502)

    async def stream(
        self,
        target: Target,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None,
    ) -> AsyncGenerator[list[str] | GenerationResult, None]:
        prepared = await self._prepare(target, messages, params, tools, stream=True)
        async with aclosing(self._events(target, prepared)) as events:
            async for event in events:
                yield event

    async def _events(
        self, target: Target, prepared: _Prepared
    ) -> AsyncGenerator[list[str] | GenerationResult, None]:
        streamed = False
        try:
            async with aclosing(self._post(self._get(), target, prepared)) as events:
                async for event in events:
                    streamed = True
                    yield event
            return
        except UpstreamError as exc:
            # Only before anything streamed: the caller has none of this answer yet.
            if not (exc.missing or exc.dropped) or streamed:
                raise
            log.debug("%s; trying again on a fresh connection", exc)
        if self.on_retry is not None:
            self.on_retry()
        # A client of its own opens a new connection, which the Service balances anew;
        # the shared client's kept-alive connection would reach the same pod again.
        fresh = self._new_client()
        try:
            async with aclosing(self._post(fresh, target, prepared)) as events:
                async for event in events:
                    yield event
        finally:
            await fresh.close()

    async def _post(
        self, client: aiohttp.ClientSession, target: Target, prepared: _Prepared
    ) -> AsyncGenerator[list[str] | GenerationResult, None]:
        model, version = target.model, target.version
        answer = prepared.answer()
        try:
            async with client.post(prepared.path, json=prepared.body) as response:
                if response.status != 200:
                    raise _classify(_error_text(await response.read()), model, version)
                try:
                    async for line in _lines(response.content):
                        if not line.startswith(b"data:"):
                            continue
                        event = json.loads(line[5:])
                        if "error" in event:
                            raise _classify(str(event["error"]), model, version)
                        pieces = answer.add(event)
                        if pieces is not None:
                            yield pieces
                except BaseException:
                    # An answer left midway closes its connection, which is how Triton
                    # learns to stop generating.
                    response.close()
                    raise
                # Read to the end of the body first: the connection then goes back to
                # the pool for the next call instead of being closed.
                final = answer.result()
                if final is not None:
                    yield final
                    return
        except (aiohttp.ClientError, TimeoutError) as exc:  # refused, reset, timeout
            raise UpstreamError(
                f"Triton at {self.url} is unavailable ({type(exc).__name__}: {exc})",
                503,
                dropped=_dropped(exc),
            ) from None
        except (ValueError, KeyError, TypeError, protocol.ProtocolError) as exc:
            raise UpstreamError(
                f"Triton model {model} answered out of protocol: {exc}", 502
            ) from None
        raise UpstreamError(f"Triton model {model} ended the stream without an answer", 502)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _dropped(exc: BaseException) -> bool:
    """Whether the connection failed (closed, reset, refused, cut mid-answer, or never made:
    a pod gone with its node answers no connect), which another connection may not; a
    timeout once connected is the server being slow."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # nothing reached the server
        return True
    if isinstance(exc, TimeoutError):
        return False
    return isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError)


async def _lines(content: aiohttp.StreamReader) -> AsyncGenerator[bytes, None]:
    """The lines of a body as they arrive, however long (a final answer's token ids and
    logprobs can pass any line limit a reader would set)."""
    pending = b""
    async for chunk in content.iter_any():
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line.rstrip(b"\r")
    if pending:
        yield pending


def _error_text(raw: bytes) -> str:
    """Triton's error message from an error answer (JSON, or one SSE event of it)."""
    text = raw.decode(errors="replace").strip()
    if text.startswith("data:"):
        text = text[5:]
    try:
        return str(json.loads(text)["error"])
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")[:500]


# Words of a model that failed while serving a request: spanmill's model says
# "generation failed", Triton's Python backend "Failed to process the request(s)" for
# an exception its model raised, and a traceback is one in any case.
_SERVER_FAULTS = ("generation failed", "failed to process the request", "traceback")


def _classify(message: str, model: str, version: str) -> UpstreamError:
    lowered = message.lower()
    if "maximum queue size" in lowered:
        return UpstreamError(
            f"model {model} version {version} is busy, its queue is full; try again shortly",
            429,
            code="overloaded",
        )
    if "lora" in lowered and "is not supported" in lowered:
        # The engine does not list the adapter (yet): another replica may.
        return UpstreamError(
            f"model {model} version {version} is not being served: {message}", 503, missing=True
        )
    if protocol.CONTEXT_LENGTH_EXCEEDED in lowered:
        start = lowered.find(protocol.CONTEXT_LENGTH_EXCEEDED) + len(
            protocol.CONTEXT_LENGTH_EXCEEDED
        )
        said = message[start:].lstrip(": ").strip() or message
        return UpstreamError(said, 400, code=protocol.CONTEXT_LENGTH_EXCEEDED)
    if "maximum model length" in lowered:
        # vLLM's words for a prompt longer than the engine's max_model_len.
        return UpstreamError(message, 400, code=protocol.CONTEXT_LENGTH_EXCEEDED)
    if any(marker in lowered for marker in _SERVER_FAULTS):
        # The model failed on a request it took (its words may say "invalid" too: a
        # ValueError's): the server's fault, which a canary counts against its version.
        return UpstreamError(f"Triton failed on {model} version {version}: {message}", 502)
    if "must be" in lowered or "invalid" in lowered or "takes 1 to" in lowered:
        return UpstreamError(message, 400)
    if "unknown model" in lowered or "not found" in lowered or "unavailable" in lowered:
        return UpstreamError(
            f"model {model} version {version} is not being served: {message}", 503, missing=True
        )
    return UpstreamError(f"Triton failed on {model} version {version}: {message}", 502)
