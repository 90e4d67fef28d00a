"""The tensor contract between the gateway and a spanmill text-generation model in Triton.

Inputs: ``MESSAGES`` (chat messages as JSON text, roles and string contents,
already normalised by the gateway), optional ``TOOLS`` (OpenAI tool schemas as
JSON text) and optional typed sampling parameters. Outputs: one row per choice,
token ids and logprobs padded to the longest choice, with the true lengths
alongside, and the Triton version that produced them.

The model is batched (``max_batch_size`` > 0): every tensor carries Triton's
batch dimension first, one row per request, so Triton's dynamic batcher can
hand the model several requests at once and the model can generate them together.
The dims below are those of one row.

The model is decoupled: it answers through Triton's response sender, and clients
call it on Triton's generate extension (``POST .../generate_stream``, Server-Sent
Events), which names inputs and outputs as JSON fields. With ``STREAM`` true, each
new piece of text goes out as it is generated, as a partial response holding
``TEXT`` alone (one piece per choice); the final response holds every output. A
client that closes the connection cancels the request, and generation stops at
the next token.

Both sides import this module, so the names and encodings live in one place.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

# name -> (Triton data type, dims)
INPUTS: dict[str, tuple[str, list[int]]] = {
    "MESSAGES": ("TYPE_STRING", [1]),
    "TOOLS": ("TYPE_STRING", [1]),
    "TEMPERATURE": ("TYPE_FP32", [1]),
    "TOP_P": ("TYPE_FP32", [1]),
    "MAX_TOKENS": ("TYPE_INT32", [1]),
    "N": ("TYPE_INT32", [1]),
    "SEED": ("TYPE_INT64", [1]),
    "STOP": ("TYPE_STRING", [-1]),
    "STREAM": ("TYPE_BOOL", [1]),
}
REQUIRED_INPUTS = frozenset({"MESSAGES"})
OUTPUTS: dict[str, tuple[str, list[int]]] = {
    "TEXT": ("TYPE_STRING", [-1]),
    "FINISH_REASON": ("TYPE_STRING", [-1]),
    "TOKEN_IDS": ("TYPE_INT64", [-1, -1]),
    "LOGPROBS": ("TYPE_FP32", [-1, -1]),
    "COMPLETION_LENGTHS": ("TYPE_INT32", [-1]),
    "PROMPT_TOKEN_IDS": ("TYPE_INT64", [-1]),
    "MODEL_VERSION": ("TYPE_STRING", [1]),
}
# The client library names data types without the TYPE_ prefix, and strings BYTES.

# Requests Triton may gather into one execute call, and how long it waits for more:
# none. Requests that arrive while the model is busy queue up and go in together
# anyway, and a lone request pays no delay. On a CPU a batch of 32 short chat turns
# generates in little more time than one, so a busy agent is served 32 at a time.
MAX_BATCH_SIZE = 32
MAX_QUEUE_DELAY_US = 0
# Requests a model holds waiting, at most: eight full batches. Past that Triton refuses a
# request at once ("Exceeds maximum queue size"), and the gateway answers 429 with
# Retry-After, instead of letting every caller wait on an ever longer queue.
MAX_QUEUE_SIZE = 256
MAX_STOP_SEQUENCES = 4
MAX_CHOICES = 8


# The code of a refusal for a prompt that, with its max_tokens, overruns the context
# window: the model puts it first in its error message, the gateway answers with it.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class ProtocolError(ValueError):
    """A request the model cannot serve; the message names the input."""


@dataclass(frozen=True)
class GenerationParams:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 2.0) or math.isnan(self.temperature):
            raise ProtocolError(f"TEMPERATURE must be within [0, 2], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ProtocolError(f"TOP_P must be within (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ProtocolError(f"MAX_TOKENS must be at least 1, got {self.max_tokens}")
        if not (1 <= self.n <= MAX_CHOICES):
            raise ProtocolError(f"N must be within [1, {MAX_CHOICES}], got {self.n}")
        if len(self.stop) > MAX_STOP_SEQUENCES or any(not s for s in self.stop):
            raise ProtocolError(f"STOP takes 1 to {MAX_STOP_SEQUENCES} non-empty strings")

    @property
    def alone(self) -> bool:
        """Whether a request must be generated on its own where requests are generated in
        static batches (:func:`spanmill.serving.generation.generate_all`): several
        choices, or a seed for sampling (which sets torch's global generator for the one
        request). The continuous batcher makes them rows like any other."""
        return self.n != 1 or (self.seed is not None and self.temperature > 0)


@dataclass(frozen=True)
class Choice:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


@dataclass(frozen=True)
class GenerationResult:
    choices: list[Choice]
    prompt_token_ids: list[int]
    model_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def completion_tokens(self) -> int:
        return sum(len(choice.token_ids) for choice in self.choices)


def _scalar(inputs: Mapping[str, np.ndarray], name: str) -> Any:
    value = inputs.get(name)
    if value is None or value.size == 0:
        return None
    item = value.reshape(-1)[0]
    return item.item() if isinstance(item, np.generic) else item


def _json_input(inputs: Mapping[str, np.ndarray], name: str) -> Any:
    raw = _scalar(inputs, name)
    if raw is None:
        return None
    try:
        return json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"{name} must be UTF-8 JSON text: {exc}") from None


def generate_body(
    messages: list[dict[str, Any]],
    params: GenerationParams,
    tools: list[dict[str, Any]] | None = None,
    *,
    stream: bool = False,
) -> dict[str, Any]:
    """Client side: the JSON body of one request on Triton's generate extension."""
    body: dict[str, Any] = {
        "MESSAGES": json.dumps(messages),
        "TEMPERATURE": params.temperature,
        "TOP_P": params.top_p,
        "MAX_TOKENS": params.max_tokens,
        "N": params.n,
        "STREAM": stream,
    }
    if tools:
        body["TOOLS"] = json.dumps(tools)
    if params.seed is not None:
        body["SEED"] = params.seed
    if params.stop:
        body["STOP"] = list(params.stop)
    return body


def streamed(inputs: Mapping[str, np.ndarray]) -> bool:
    """Server side: whether the request asks for its text as it is generated."""
    return bool(_scalar(inputs, "STREAM"))


def decode_request(
    inputs: Mapping[str, np.ndarray],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, GenerationParams]:
    """Server side: messages, tools and parameters from the input tensors."""
    messages = _json_input(inputs, "MESSAGES")
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("MESSAGES must be a non-empty JSON array of chat messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ProtocolError(f"MESSAGES[{i}] must be an object with a string 'role'")
        if not isinstance(message.get("content", ""), str):
            raise ProtocolError(f"MESSAGES[{i}].content must be a string")
    tools = _json_input(inputs, "TOOLS")
    if tools is not None and not isinstance(tools, list):
        raise ProtocolError("TOOLS must be a JSON array of tool schemas")
    defaults = GenerationParams()
    stop_tensor = inputs.get("STOP")
    stop = tuple(
        s.decode() if isinstance(s, bytes) else str(s)
        for s in (stop_tensor.reshape(-1) if stop_tensor is not None else ())
    )
    params = GenerationParams(
        temperature=float(_pick(_scalar(inputs, "TEMPERATURE"), defaults.temperature)),
        top_p=float(_pick(_scalar(inputs, "TOP_P"), defaults.top_p)),
        max_tokens=int(_pick(_scalar(inputs, "MAX_TOKENS"), defaults.max_tokens)),
        n=int(_pick(_scalar(inputs, "N"), defaults.n)),
        seed=_scalar(inputs, "SEED"),
        stop=stop,
    )
    return messages, tools, params


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def encode_result(result: GenerationResult) -> dict[str, np.ndarray]:
    """Server side: the output tensors for one result (a batch of one)."""
    width = max((len(c.token_ids) for c in result.choices), default=0)
    token_ids = np.full((len(result.choices), width), -1, dtype=np.int64)
    logprobs = np.zeros((len(result.choices), width), dtype=np.float32)
    for row, choice in enumerate(result.choices):
        token_ids[row, : len(choice.token_ids)] = choice.token_ids
        logprobs[row, : len(choice.logprobs)] = choice.logprobs
    tensors = {
        "TEXT": np.array([c.text.encode() for c in result.choices], dtype=object),
        "FINISH_REASON": np.array([c.finish_reason.encode() for c in result.choices], dtype=object),
        "TOKEN_IDS": token_ids,
        "LOGPROBS": logprobs,
        "COMPLETION_LENGTHS": np.array([len(c.token_ids) for c in result.choices], dtype=np.int32),
        "PROMPT_TOKEN_IDS": np.array(result.prompt_token_ids, dtype=np.int64),
        "MODEL_VERSION": np.array([result.model_version.encode()], dtype=object),
    }
    return {name: array[np.newaxis] for name, array in tensors.items()}


def encode_partial(pieces: list[str]) -> dict[str, np.ndarray]:
    """Server side: a partial response, the new piece of text of each choice."""
    return {"TEXT": np.array([[piece.encode() for piece in pieces]], dtype=object)}


def _listed(value: Any) -> list[Any]:
    """A generate-extension output as a flat list (it sends one element as a scalar)."""
    return list(value) if isinstance(value, list) else [value]


def is_final(event: Mapping[str, Any]) -> bool:
    """Client side: whether a response of the stream is the final one (it has every output)."""
    return "COMPLETION_LENGTHS" in event


def decode_partial(event: Mapping[str, Any]) -> list[str]:
    """Client side: the new piece of text of each choice, from a partial response."""
    return [str(piece) for piece in _listed(event.get("TEXT", []))]


def decode_final(event: Mapping[str, Any]) -> GenerationResult:
    """Client side: the result from the final response of the generate extension.

    Outputs come flattened: the padded ``[choices, width]`` token ids and logprobs
    are cut back into rows with the lengths alongside.
    """
    lengths = [int(n) for n in _listed(event["COMPLETION_LENGTHS"])]
    texts = [str(t) for t in _listed(event["TEXT"])]
    reasons = [str(r) for r in _listed(event["FINISH_REASON"])]
    token_ids = [int(t) for t in _listed(event.get("TOKEN_IDS", []))]
    logprobs = [float(x) for x in _listed(event.get("LOGPROBS", []))]
    width = len(token_ids) // len(lengths) if lengths else 0
    if (
        len(texts) != len(lengths)
        or len(reasons) != len(lengths)
        or width * len(lengths) != len(token_ids)
    ):
        raise ProtocolError(
            f"a final response with {len(lengths)} choices has {len(texts)} texts, "
            f"{len(reasons)} finish reasons and {len(token_ids)} token ids"
        )
    choices = []
    for row, length in enumerate(lengths):
        start = row * width
        choices.append(
            Choice(
                text=texts[row],
                token_ids=token_ids[start : start + length],
                logprobs=logprobs[start : start + length],
                finish_reason="length" if reasons[row] == "length" else "stop",
            )
        )
    version = _listed(event.get("MODEL_VERSION", ""))[0]
    return GenerationResult(
        choices=choices,
        prompt_token_ids=[int(t) for t in _listed(event.get("PROMPT_TOKEN_IDS", []))],
        model_version=str(version),
    )
