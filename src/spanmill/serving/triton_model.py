"""The Triton Python-backend entry point of a spanmill text-generation model.

The model repository writer copies this file into each version folder as
``model.py``. It only moves tensors: generation lives in
:mod:`spanmill.serving.generation` and the tensor contract in
:mod:`spanmill.serving.protocol`, both imported from the environment that runs the
backend stub (the venv locally, the serving image on a cluster).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from spanmill.serving import protocol
from spanmill.serving.generation import Generator, Request, generate_all


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version = str(args["model_version"])
        version_dir = Path(args["model_repository"]) / version
        self.generator = Generator.from_version_dir(version_dir, version=version)

    def execute(self, requests: list[Any]) -> list[Any]:
        # Triton's dynamic batcher hands over the requests that arrived together.
        decoded: list[Request | protocol.ProtocolError] = []
        for request in requests:
            try:
                inputs = {}
                for name in protocol.INPUTS:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is not None:
                        inputs[name] = tensor.as_numpy()
                messages, tools, params = protocol.decode_request(inputs)
                decoded.append(Request(messages, params, tools))
            except protocol.ProtocolError as exc:
                decoded.append(exc)
        valid = [d for d in decoded if isinstance(d, Request)]
        answers = iter(generate_all(self.generator, valid))
        responses = []
        for item in decoded:
            if isinstance(item, protocol.ProtocolError):
                responses.append(_error(str(item), pb_utils.TritonError.INVALID_ARG))
                continue
            answer = next(answers)
            if isinstance(answer, Exception):
                responses.append(_error(f"generation failed: {type(answer).__name__}: {answer}"))
                continue
            outputs = protocol.encode_result(answer)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()])
            )
        return responses


def _error(message: str, code: Any = None) -> Any:
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(error=error)
