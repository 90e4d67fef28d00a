"""The Triton Python-backend entry point of a spanmill text-generation model.

The model repository writer copies this file into each version folder as
``model.py``. It only moves tensors: generation lives in
:mod:`spanmill.serving.generation` and the tensor contract in
:mod:`spanmill.serving.protocol`, both imported from the environment that runs the
backend stub (the venv locally, the serving image on a cluster).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from spanmill.serving import protocol
from spanmill.serving.generation import (
    Cancellation,
    Generator,
    Listener,
    Request,
    TextStream,
    generate_all,
    instance_device,
)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version = str(args["model_version"])
        version_dir = Path(args["model_repository"]) / version
        # A KIND_GPU instance generates on its own GPU; the others on the CPU.
        device = instance_device(
            str(args.get("model_instance_kind", "CPU")), args.get("model_instance_device_id", 0)
        )
        self.generator = Generator.from_version_dir(version_dir, version=version, device=device)
        self.metrics = _Metrics(str(args.get("model_name", "")), version)

    def execute(self, requests: list[Any]) -> None:
        # Triton's dynamic batcher hands over the requests that arrived together. The
        # model is decoupled: every answer goes out through its request's sender, the
        # streamed pieces as they come, and a final response that closes the request.
        senders = []
        decoded: list[Request] = []
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = {}
                for name in protocol.INPUTS:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is not None:
                        inputs[name] = tensor.as_numpy()
                messages, tools, params = protocol.decode_request(inputs)
                self.generator.check_fits(messages, params, tools)
            except protocol.ProtocolError as exc:
                self.metrics.count("refused")
                _close(sender, _error(str(exc), pb_utils.TritonError.INVALID_ARG))
                continue
            send = _sending(sender)
            listener: Listener = Cancellation(sender.is_cancelled, beat=_beat(send, params.n))
            if protocol.streamed(inputs):
                listener = TextStream(
                    self.generator.tokenizer,
                    self.generator.eos_ids,
                    params,
                    send=send,
                    cancelled=sender.is_cancelled,
                )
            senders.append(sender)
            decoded.append(Request(messages, params, tools, listener))
        for sender, answer in zip(senders, generate_all(self.generator, decoded), strict=True):
            tokens = 0 if isinstance(answer, Exception) else answer.completion_tokens
            if sender.is_cancelled():
                self.metrics.count("cancelled", tokens)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif isinstance(answer, Exception):
                self.metrics.count("failed")
                _close(sender, _error(f"generation failed: {type(answer).__name__}: {answer}"))
            else:
                self.metrics.count("answered", tokens)
                outputs = protocol.encode_result(answer)
                _close(
                    sender,
                    pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()]),
                )


class _Metrics:
    """Requests and generated tokens by outcome, on Triton's metrics endpoint: answered,
    cancelled (the client went away; its tokens are the work done before it stopped),
    failed, or refused (out of protocol)."""

    def __init__(self, model: str, version: str) -> None:
        counter = pb_utils.MetricFamily.COUNTER
        requests = pb_utils.MetricFamily(
            name="spanmill_generation_requests_total",
            description="Generation requests by outcome",
            kind=counter,
        )
        tokens = pb_utils.MetricFamily(
            name="spanmill_generation_tokens_total",
            description="Tokens generated, by the outcome of their request",
            kind=counter,
        )
        # The families must outlive their metrics: Triton deletes a metric with its family.
        self.families = (requests, tokens)
        self.requests = {}
        self.tokens = {}
        for outcome in ("answered", "cancelled", "failed", "refused"):
            labels = {"model": model, "version": version, "outcome": outcome}
            self.requests[outcome] = requests.Metric(labels=labels)
            self.tokens[outcome] = tokens.Metric(labels=labels)

    def count(self, outcome: str, tokens: int = 0) -> None:
        self.requests[outcome].increment(1)
        if tokens:
            self.tokens[outcome].increment(tokens)


def _beat(send: Callable[[list[str]], None], choices: int) -> Callable[[], None]:
    """An empty partial response: written so that a departed client is noticed."""
    return lambda: send([""] * choices)


def _sending(sender: Any) -> Callable[[list[str]], None]:
    """Sends each choice's new piece of text as a partial response."""

    def send(pieces: list[str]) -> None:
        outputs = protocol.encode_partial(pieces)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()]))

    return send


def _close(sender: Any, response: Any) -> None:
    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _error(message: str, code: Any = None) -> Any:
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(error=error)
