"""Calling a spanmill model in Triton over HTTP (async), with errors mapped for clients.

With several Triton replicas behind one Service, each connection goes to one ready
pod. A pod may lack a version another one serves (it joined a moment ago and its
readiness has not caught up, or it is the one whose load failed), so when Triton
answers that the version is missing the call is tried once more on a connection
of its own, which the Service may send to another pod. Nothing else is retried:
another error would happen again, and a generation is not repeated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import tritonclient.http.aio as triton_http
from tritonclient.utils import InferenceServerException

from spanmill.serving import protocol
from spanmill.serving.protocol import GenerationParams, GenerationResult

log = logging.getLogger(__name__)


class UpstreamError(Exception):
    """Triton could not answer. ``status`` is the HTTP status the client gets; ``missing``
    says the server does not hold the version (another replica may)."""

    def __init__(self, message: str, status: int, *, missing: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.missing = missing


class Upstream(Protocol):
    """What the gateway asks of the server behind it: Triton, or a trainer's live policy."""

    url: str

    async def ready(self) -> bool: ...

    async def generate(
        self,
        model: str,
        version: str,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None,
    ) -> GenerationResult: ...

    async def close(self) -> None: ...


class TritonUpstream:
    def __init__(
        self, url: str, timeout_s: float = 300.0, on_retry: Callable[[], None] | None = None
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        # Called for each call tried again on a fresh connection (a metric counts them).
        self.on_retry = on_retry
        self._client: triton_http.InferenceServerClient | None = None

    def _new_client(self) -> triton_http.InferenceServerClient:
        return triton_http.InferenceServerClient(self.url, conn_timeout=self.timeout_s)

    def _get(self) -> triton_http.InferenceServerClient:
        if self._client is None:
            self._client = self._new_client()
        return self._client

    async def ready(self) -> bool:
        try:
            return bool(await self._get().is_server_ready())
        except Exception:
            return False

    async def generate(
        self,
        model: str,
        version: str,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None,
    ) -> GenerationResult:
        tensors = protocol.encode_request(messages, params, tools)
        inputs = []
        for name, array in tensors.items():
            dtype, _ = protocol.INPUTS[name]
            tensor = triton_http.InferInput(name, list(array.shape), protocol.CLIENT_DTYPES[dtype])
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        try:
            result = await self._infer(self._get(), model, version, inputs)
        except UpstreamError as exc:
            if not exc.missing:
                raise
            log.debug("%s; trying another Triton replica", exc)
            if self.on_retry is not None:
                self.on_retry()
            # A client of its own opens a new connection, which the Service balances anew;
            # the shared client's kept-alive connection would reach the same pod again.
            fresh = self._new_client()
            try:
                result = await self._infer(fresh, model, version, inputs)
            finally:
                await fresh.close()
        outputs: dict[str, np.ndarray] = {}
        for name in protocol.OUTPUTS:
            array = result.as_numpy(name)
            if array is None:
                raise UpstreamError(f"Triton model {model} returned no {name}", 502)
            outputs[name] = array
        return protocol.decode_result(outputs)

    async def _infer(
        self, client: triton_http.InferenceServerClient, model: str, version: str, inputs: list[Any]
    ) -> Any:
        try:
            return await client.infer(model, inputs, model_version=version)
        except InferenceServerException as exc:
            raise _classify(exc, model, version) from None
        except Exception as exc:  # connection refused, reset, timeout
            raise UpstreamError(
                f"Triton at {self.url} is unavailable ({type(exc).__name__}: {exc})", 503
            ) from None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _classify(exc: InferenceServerException, model: str, version: str) -> UpstreamError:
    message = exc.message() or str(exc)
    lowered = message.lower()
    if "must be" in lowered or "invalid" in lowered or "takes 1 to" in lowered:
        return UpstreamError(message, 400)
    if "unknown model" in lowered or "not found" in lowered or "unavailable" in lowered:
        return UpstreamError(
            f"model {model} version {version} is not being served: {message}", 503, missing=True
        )
    return UpstreamError(f"Triton failed on {model} version {version}: {message}", 502)
