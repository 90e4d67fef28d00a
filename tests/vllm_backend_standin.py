"""A stand-in for Triton's vLLM backend, installed as the ``vllm`` backend of the tests' Triton.

Why: vLLM needs a GPU, and this machine has none, so the real backend cannot run in
the tests. This file implements the backend's documented contract instead (the
inputs, outputs and files of the vLLM backend of the Triton release the chart
names, see infra/triton/README.md and spanmill/serving/vllm.py), on
transformers and PEFT, so that what spanmill writes and sends for the vLLM flavour
is served exactly as the real backend would take it:

* it is a Python-based backend: Triton runs ``backends/vllm/model.py`` for a
  model whose config says ``backend: "vllm"``, as with NVIDIA's image;
* the version folder holds ``model.json`` (vLLM's engine arguments: ``model``,
  ``enable_lora``, ``max_model_len``...) and, with LoRA enabled, ``multi_lora.json``
  (adapter name -> folder), both read once, when the model loads;
* ``text_input`` is the prompt as text, tokenised with the tokenizer's special
  tokens; ``sampling_parameters`` is JSON (``n``, ``temperature``, ``top_p``,
  ``max_tokens``, ``seed``, ``stop``, ``logprobs``, ``lora_name``); a ``lora_name``
  the engine does not list is refused with the backend's message;
* streamed responses carry what is new since the last one; ``logprobs`` is, per
  choice, JSON of one ``{token id: {logprob, rank, decoded_token}}`` per new token,
  the sampled token first; ``finish_reason`` is ``None`` until a choice ends;
* a cancelled request stops at the next token.

Unlike vLLM it serves one request at a time; the tests measure behaviour, not speed.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModelForCausalLM, AutoTokenizer

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        folder = pb_utils.get_model_dir()
        with open(os.path.join(folder, "model.json")) as handle:
            engine = json.load(handle)
        self.max_model_len = int(engine.get("max_model_len") or 8192)
        self.tokenizer = AutoTokenizer.from_pretrained(engine["model"])
        model = AutoModelForCausalLM.from_pretrained(engine["model"], torch_dtype=torch.float32)
        self.loras: dict[str, str] = {}
        if str(engine.get("enable_lora", False)).lower() == "true":
            with open(os.path.join(folder, "multi_lora.json")) as handle:
                self.loras = json.load(handle)
        if self.loras:
            from peft import PeftModel

            names = list(self.loras)
            model = PeftModel.from_pretrained(model, self.loras[names[0]], adapter_name=names[0])
            for name in names[1:]:
                model.load_adapter(self.loras[name], adapter_name=name)
        self.model = model.eval()
        self.eos = {self.tokenizer.eos_token_id}

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._serve(request, sender)
            except Exception as exc:  # every failure is the request's answer
                sender.send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"Error generating stream: {exc}")
                    ),
                    flags=_FINAL,
                )
        return None

    def _input(self, request: Any, name: str, default: Any = None) -> Any:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            return default
        value = tensor.as_numpy().reshape(-1)[0]
        return value.decode() if isinstance(value, bytes) else value

    def _serve(self, request: Any, sender: Any) -> None:
        prompt = self._input(request, "text_input")
        stream = bool(self._input(request, "stream", False))
        exclude = self._input(request, "exclude_input_in_output", None)
        prepend = (not bool(exclude)) if exclude is not None else not stream
        if prepend and stream:
            raise ValueError("When streaming, `exclude_input_in_output` = False is not allowed.")
        sampling = json.loads(self._input(request, "sampling_parameters", "{}"))
        wanted = {
            name: bool(self._input(request, name, False))
            for name in ("return_finish_reason", "return_logprobs", "return_num_input_tokens",
                         "return_num_output_tokens")
        }  # fmt: skip
        lora = sampling.pop("lora_name", None)
        if lora is not None and lora not in self.loras:
            sender.send(
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(
                        f"LoRA {lora} is not supported, we currently support {list(self.loras)}"
                    )
                ),
                flags=_FINAL,
            )
            return
        prompt_ids = self.tokenizer(prompt)["input_ids"]
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"The decoder prompt (length {len(prompt_ids)}) is longer than the maximum "
                f"model length of {self.max_model_len}."
            )
        n = int(sampling.get("n", 1))
        temperature = float(sampling.get("temperature", 1.0))
        top_p = float(sampling.get("top_p", 1.0))
        max_tokens = min(int(sampling.get("max_tokens", 16)), self.max_model_len - len(prompt_ids))
        stops = list(sampling.get("stop") or [])
        logprobs_asked = sampling.get("logprobs") is not None
        generator = torch.Generator().manual_seed(int(sampling.get("seed", 0) or 0))

        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        texts = [""] * n
        sent_text = [0] * n
        sent_tokens = [0] * n
        first = True

        def respond(final: bool) -> None:
            nonlocal first
            if stream or final:
                pieces = []
                for i in range(n):
                    start = sent_text[i] if stream else 0
                    pieces.append(texts[i][start:])
                    sent_text[i] = len(texts[i])
                if prepend and first:
                    pieces = [prompt + p for p in pieces]
                outputs = [pb_utils.Tensor("text_output", np.array(
                    [p.encode() for p in pieces], dtype=np.object_))]  # fmt: skip
                if wanted["return_finish_reason"]:
                    outputs.append(pb_utils.Tensor("finish_reason", np.array(
                        [str(f) for f in finish], dtype=np.object_)))  # fmt: skip
                if wanted["return_logprobs"]:
                    entries = []
                    for i in range(n):
                        start = sent_tokens[i] if stream else 0
                        if not logprobs_asked:
                            entries.append(b"null")
                            continue
                        entries.append(json.dumps([
                            {str(t): {"logprob": lp, "rank": 1,
                                      "decoded_token": self.tokenizer.decode([t])}}
                            for t, lp in logprobs[i][start:]
                        ]).encode())  # fmt: skip
                    outputs.append(pb_utils.Tensor("logprobs", np.array(entries, dtype=np.object_)))
                if wanted["return_num_input_tokens"]:
                    outputs.append(pb_utils.Tensor("num_input_tokens", np.asarray(
                        len(prompt_ids), dtype=np.uint32)))  # fmt: skip
                if wanted["return_num_output_tokens"]:
                    counts = [len(tokens[i]) - (sent_tokens[i] if stream else 0) for i in range(n)]
                    outputs.append(pb_utils.Tensor("num_output_tokens", np.asarray(
                        counts, dtype=np.uint32)))  # fmt: skip
                for i in range(n):
                    sent_tokens[i] = len(tokens[i])
                sender.send(pb_utils.InferenceResponse(outputs), flags=_FINAL if final else 0)
                first = False

        with torch.inference_mode(), self._adapter(lora):
            past = None
            step_input = torch.tensor([prompt_ids] * n)
            for _ in range(max_tokens):
                if sender.is_cancelled():
                    sender.send(
                        pb_utils.InferenceResponse(error=pb_utils.TritonError(
                            "Request was cancelled", pb_utils.TritonError.CANCELLED)),
                        flags=_FINAL,
                    )  # fmt: skip
                    return
                out = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[:, -1, :].float()
                if temperature > 0:
                    logits = logits / temperature
                    probs = torch.softmax(logits, dim=-1)
                    if top_p < 1.0:
                        ordered, order = probs.sort(descending=True, dim=-1)
                        cut = ordered.cumsum(-1) - ordered > top_p
                        ordered[cut] = 0
                        probs = torch.zeros_like(probs).scatter(-1, order, ordered)
                        probs = probs / probs.sum(-1, keepdim=True)
                    chosen = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
                    scores = torch.log(probs)
                else:
                    chosen = logits.argmax(-1)
                    scores = torch.log_softmax(logits, dim=-1)
                for i in range(n):
                    if finish[i] is not None:
                        continue
                    token = int(chosen[i])
                    # vLLM keeps the end-of-sequence token in a reply's ids and logprobs
                    # (its text leaves it out): check_stop reads it as the last output token.
                    tokens[i].append(token)
                    logprobs[i].append((token, float(scores[i, token])))
                    if token in self.eos:
                        finish[i] = "stop"
                        continue
                    text = self.tokenizer.decode(tokens[i], skip_special_tokens=True)
                    hit = [text.find(s) for s in stops if s in text]
                    if hit:
                        text, finish[i] = text[: min(hit)], "stop"
                    # vLLM holds back a partial character until it is whole.
                    texts[i] = text.rstrip("\ufffd") if finish[i] is None else text
                if all(f is not None for f in finish):
                    break
                respond(final=False)
                step_input = chosen.unsqueeze(-1)
            for i in range(n):
                if finish[i] is None:
                    finish[i] = "length"
                    texts[i] = self.tokenizer.decode(tokens[i], skip_special_tokens=True)
            respond(final=True)

    def _adapter(self, lora: str | None) -> Any:
        import contextlib

        if not self.loras:
            return contextlib.nullcontext()
        if lora is None:
            return self.model.disable_adapter()
        self.model.set_adapter(lora)
        return contextlib.nullcontext()
