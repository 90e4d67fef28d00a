"""Calling a spanmill model in Triton over HTTP (async), with errors mapped for clients."""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.http.aio as triton_http
from tritonclient.utils import InferenceServerException

from spanmill.serving import protocol
from spanmill.serving.protocol import GenerationParams, GenerationResult


class UpstreamError(Exception):
    """Triton could not answer. ``status`` is the HTTP status the client gets."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class TritonUpstream:
    def __init__(self, url: str, timeout_s: float = 300.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._client: triton_http.InferenceServerClient | None = None

    def _get(self) -> triton_http.InferenceServerClient:
        if self._client is None:
            self._client = triton_http.InferenceServerClient(self.url, conn_timeout=self.timeout_s)
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
            result = await self._get().infer(model, inputs, model_version=version)
        except InferenceServerException as exc:
            raise _classify(exc, model, version) from None
        except Exception as exc:  # connection refused, reset, timeout
            raise UpstreamError(
                f"Triton at {self.url} is unavailable ({type(exc).__name__}: {exc})", 503
            ) from None
        outputs: dict[str, np.ndarray] = {}
        for name in protocol.OUTPUTS:
            array = result.as_numpy(name)
            if array is None:
                raise UpstreamError(f"Triton model {model} returned no {name}", 502)
            outputs[name] = array
        return protocol.decode_result(outputs)

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
        return UpstreamError(f"model {model} version {version} is not being served: {message}", 503)
    return UpstreamError(f"Triton failed on {model} version {version}: {message}", 502)
