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
from spanmill.serving.generation import Generator


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version = str(args["model_version"])
        version_dir = Path(args["model_repository"]) / version
        self.generator = Generator.from_version_dir(version_dir, version=version)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                inputs = {}
                for name in protocol.INPUTS:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is not None:
                        inputs[name] = tensor.as_numpy()
                messages, tools, params = protocol.decode_request(inputs)
                result = self.generator.generate(messages, params, tools=tools)
                outputs = protocol.encode_result(result)
                responses.append(
                    pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()])
                )
            except protocol.ProtocolError as exc:
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                    )
                )
            except Exception as exc:
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            f"generation failed: {type(exc).__name__}: {exc}"
                        )
                    )
                )
        return responses
