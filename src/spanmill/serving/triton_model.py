"""The Triton Python-backend entry point of a spanmill text-generation model.

The model repository writer copies this file into each version folder as
``model.py``. It only moves tensors: generation lives in
:mod:`spanmill.serving.generation` and the tensor contract in
:mod:`spanmill.serving.protocol`, both imported from the environment that runs the
backend stub (the venv locally, the serving image on a cluster).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from spanmill.serving import protocol
from spanmill.serving.batcher import QueueFull, batch_limits, scheduler_for
from spanmill.serving.generation import (
    Cancellation,
    Generator,
    Listener,
    Request,
    TextStream,
    instance_device,
)
from spanmill.serving.protocol import GenerationResult


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
        rows, waiting = batch_limits(json.loads(args.get("model_config") or "{}"))
        self.scheduler = scheduler_for(
            self.generator, max_rows=rows, max_waiting=waiting, on_step=self.metrics.step
        )
        self.scheduler.start()

    def execute(self, requests: list[Any]) -> None:
        # The model is decoupled: execute hands each request to the scheduler and
        # returns, so Triton passes on the next requests at once and they join the
        # running batch between two tokens. Every answer goes out through its
        # request's sender, the streamed pieces as they come, and a final response
        # that closes the request.
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
            except Exception as exc:  # never out of execute: Triton would fail every
                # request of the call, those already running in the batch among them
                self.metrics.count("failed")
                _close(sender, _error(f"the request could not be read: {type(exc).__name__}: "
                                      f"{exc}", pb_utils.TritonError.INVALID_ARG))  # fmt: skip
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
            try:
                self.scheduler.submit(
                    Request(messages, params, tools, listener), self._answering(sender)
                )
            except QueueFull as exc:
                # In the words of Triton's own refusal, which the gateway answers with 429.
                _close(sender, _error(str(exc), pb_utils.TritonError.UNAVAILABLE))
            except Exception as exc:  # this request alone: the scheduler runs the others
                self.metrics.count("failed")
                _close(sender, _error(f"generation failed: {type(exc).__name__}: {exc}"))

    def _answering(self, sender: Any) -> Callable[[GenerationResult | Exception], None]:
        def answer(result: GenerationResult | Exception) -> None:
            tokens = 0 if isinstance(result, Exception) else result.completion_tokens
            if sender.is_cancelled():
                self.metrics.count("cancelled", tokens)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif isinstance(result, Exception):
                self.metrics.count("failed")
                _close(sender, _error(f"generation failed: {type(result).__name__}: {result}"))
            else:
                self.metrics.count("answered", tokens)
                outputs = protocol.encode_result(result)
                _close(
                    sender,
                    pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()]),
                )

        return answer

    def finalize(self) -> None:
        self.scheduler.stop()


class _Metrics:
    """Requests and generated tokens by outcome, on Triton's metrics endpoint: answered,
    cancelled (the client went away; its tokens are the work done before it stopped),
    failed, or refused (out of protocol); and the decode steps with the rows they
    advanced."""

    def __init__(self, model: str, version: str) -> None:
        families = {
            name: pb_utils.MetricFamily(
                name=name, description=description, kind=pb_utils.MetricFamily.COUNTER
            )
            for name, description in (
                ("spanmill_generation_requests_total", "Generation requests by outcome"),
                (
                    "spanmill_generation_tokens_total",
                    "Tokens generated, by the outcome of their request",
                ),
                (
                    "spanmill_generation_steps_total",
                    "Decode steps: one token for every row generating",
                ),
                (
                    "spanmill_generation_step_rows_total",
                    "Rows the decode steps advanced (over steps: the mean batch)",
                ),
            )
        }
        # The families must outlive their metrics: Triton deletes a metric with its family.
        self.families = families
        requests = families["spanmill_generation_requests_total"]
        tokens = families["spanmill_generation_tokens_total"]
        labels = {"model": model, "version": version}
        self.steps = families["spanmill_generation_steps_total"].Metric(labels=labels)
        self.rows = families["spanmill_generation_step_rows_total"].Metric(labels=labels)
        self.requests = {}
        self.tokens = {}
        for outcome in ("answered", "cancelled", "failed", "refused"):
            labels = {"model": model, "version": version, "outcome": outcome}
            self.requests[outcome] = requests.Metric(labels=labels)
            self.tokens[outcome] = tokens.Metric(labels=labels)

    def step(self, rows: int) -> None:
        self.steps.increment(1)
        self.rows.increment(rows)

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
