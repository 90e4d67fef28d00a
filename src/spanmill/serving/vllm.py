"""The tensor contract of Triton's vLLM backend, as spanmill speaks it.

The backend (the release the chart names, see infra/triton/README.md) takes the
prompt as text, already rendered with the model's chat template: the gateway
renders it (:func:`spanmill.serving.generation.render_prompt`, the same function
the Python flavour renders with inside Triton). Inputs:

* ``text_input``: the prompt;
* ``sampling_parameters``: vLLM's sampling parameters as JSON text, with
  ``lora_name`` naming an adapter the model's ``multi_lora.json`` lists (absent: the
  base model answers);
* ``stream``: each response carries only what is new since the previous one;
* ``exclude_input_in_output``: leave the prompt out of the text;
* ``return_finish_reason``, ``return_logprobs``, ``return_num_input_tokens``,
  ``return_num_output_tokens``: the backend's optional outputs.

Outputs, one element per choice (vLLM's ``n``): ``text_output``, ``finish_reason``
(``None`` until the choice ends), ``logprobs`` (JSON: for each new token, a map from
token id to ``{logprob, rank, decoded_token}``; with ``"logprobs": 0`` asked, the
map holds the sampled token alone), ``num_output_tokens``, and ``num_input_tokens``
once. The backend returns no token ids: the completion's ids are the keys of its
logprobs; where an answer has none, they are made by tokenising the text again
(:attr:`TOKEN_IDS_RETOKENIZED`), which can differ from the ids sampled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spanmill.serving.protocol import (
    Choice,
    GenerationParams,
    GenerationResult,
    ProtocolError,
)

# name -> (Triton data type, dims), as the backend declares them; config.pbtxt spells
# them out (the chart runs Triton with auto-complete off).
INPUTS: dict[str, tuple[str, list[int]]] = {
    "text_input": ("TYPE_STRING", [1]),
    "stream": ("TYPE_BOOL", [1]),
    "sampling_parameters": ("TYPE_STRING", [1]),
    "exclude_input_in_output": ("TYPE_BOOL", [1]),
    "return_finish_reason": ("TYPE_BOOL", [1]),
    "return_cumulative_logprob": ("TYPE_BOOL", [1]),
    "return_logprobs": ("TYPE_BOOL", [1]),
    "return_num_input_tokens": ("TYPE_BOOL", [1]),
    "return_num_output_tokens": ("TYPE_BOOL", [1]),
}
REQUIRED_INPUTS = frozenset({"text_input"})
OUTPUTS: dict[str, tuple[str, list[int]]] = {
    "text_output": ("TYPE_STRING", [-1]),
    "finish_reason": ("TYPE_STRING", [-1]),
    "cumulative_logprob": ("TYPE_FP32", [-1]),
    "logprobs": ("TYPE_STRING", [-1]),
    "num_input_tokens": ("TYPE_UINT32", [1]),
    "num_output_tokens": ("TYPE_UINT32", [-1]),
}

# Where a span's completion token ids came from: the backend's record of the tokens it
# sampled, or the answer's text tokenised again.
TOKEN_IDS_SAMPLED = "sampled"
TOKEN_IDS_RETOKENIZED = "retokenized"


def generate_body(
    prompt: str, params: GenerationParams, lora_name: str | None, *, stream: bool
) -> dict[str, Any]:
    """The JSON body of one request on Triton's generate extension."""
    sampling: dict[str, Any] = {
        "n": params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        # The sampled token's own logprob alone, for every token: the ids and the
        # logprobs a trainer's importance ratios need.
        "logprobs": 0,
    }
    if params.seed is not None:
        sampling["seed"] = params.seed
    if params.stop:
        sampling["stop"] = list(params.stop)
    if lora_name is not None:
        sampling["lora_name"] = lora_name
    return {
        "text_input": prompt,
        "stream": stream,
        "exclude_input_in_output": True,
        "sampling_parameters": json.dumps(sampling),
        "return_finish_reason": True,
        "return_logprobs": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
    }


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


class Answer:
    """The responses of one request, gathered into pieces of text and one result.

    Every response of the stream goes through :meth:`add`, which returns the new
    text of each choice; :meth:`result` makes the whole answer once the stream ends.
    """

    def __init__(self, n: int, prompt_token_ids: list[int], tokenizer: Any) -> None:
        self.n = n
        self.prompt_token_ids = prompt_token_ids
        self.tokenizer = tokenizer
        self.texts = [""] * n
        self.token_ids: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.sampled = [True] * n
        self.finish: list[str | None] = [None] * n
        self.num_input_tokens: int | None = None

    def add(self, event: Mapping[str, Any]) -> list[str]:
        if "text_output" not in event:
            raise ProtocolError(f"a vLLM response without text_output: {dict(event)}")
        pieces = [str(t) for t in _listed(event["text_output"])]
        if len(pieces) != self.n:
            raise ProtocolError(f"a vLLM response has {len(pieces)} texts for {self.n} choices")
        for index, piece in enumerate(pieces):
            self.texts[index] += piece
        if "finish_reason" in event:
            for index, reason in enumerate(_listed(event["finish_reason"])[: self.n]):
                if reason not in (None, "None", ""):
                    self.finish[index] = str(reason)
        if "logprobs" in event:
            for index, raw in enumerate(_listed(event["logprobs"])[: self.n]):
                self._tokens(index, raw)
        else:
            self.sampled = [False] * self.n
        if "num_input_tokens" in event:
            self.num_input_tokens = int(_listed(event["num_input_tokens"])[0])
        return pieces

    def _tokens(self, index: int, raw: Any) -> None:
        entries = json.loads(raw) if isinstance(raw, str) else raw
        if entries is None:
            self.sampled[index] = False
            return
        for entry in entries:
            if not entry:
                raise ProtocolError("a vLLM logprobs entry names no token")
            # The sampled token comes first (with "logprobs": 0 it is the only one).
            token, detail = next(iter(entry.items()))
            self.token_ids[index].append(int(token))
            self.logprobs[index].append(float(detail["logprob"]))

    def result(self, model_version: str = "") -> GenerationResult:
        """The whole answer; ``extra["token_ids"]`` says where its token ids came from.

        The prompt's ids are the gateway's tokenisation of the text it sent, as the
        backend tokenises it; a count other than the backend's own marks them, too.
        """
        matched = self.num_input_tokens in (None, len(self.prompt_token_ids))
        source = TOKEN_IDS_SAMPLED if all(self.sampled) and matched else TOKEN_IDS_RETOKENIZED
        choices = []
        for index in range(self.n):
            token_ids, logprobs = self.token_ids[index], self.logprobs[index]
            if not self.sampled[index]:
                token_ids = list(
                    self.tokenizer(self.texts[index], add_special_tokens=False)["input_ids"]
                )
                logprobs = []
            choices.append(
                Choice(
                    text=self.texts[index],
                    token_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason="length" if self.finish[index] == "length" else "stop",
                )
            )
        return GenerationResult(
            choices=choices,
            prompt_token_ids=list(self.prompt_token_ids),
            model_version=model_version,
            extra={"token_ids": source},
        )
