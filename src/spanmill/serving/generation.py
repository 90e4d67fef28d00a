"""Text generation with transformers: what a spanmill model runs inside Triton.

Kept free of Triton so it can be tested and benchmarked on its own. The model's
own chat template renders the messages, and the facts a trainer needs later
(prompt and completion token ids, per-token logprobs, the serving version) are
captured here, where they happen, instead of being reconstructed from text.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from spanmill import precision
from spanmill.cpus import set_torch_threads
from spanmill.precision import ServingDtype
from spanmill.serving import protocol
from spanmill.serving.prefix_cache import Entry, PrefixCache
from spanmill.serving.protocol import Choice, GenerationParams, GenerationResult, ProtocolError

SERVING_SPEC = "spanmill-serving.json"
# What a request generated on its own (several choices, or a seeded sample) may hold in
# the scores its logprobs are read from: every step's distribution over the vocabulary,
# for each choice, about four times over while they are normalised. Past it, refused: one
# request must not take the model's memory, and every version served beside it, down.
SOLO_SCORES_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class ServingSpec:
    """What a Triton version folder serves: a base model plus an optional LoRA adapter.

    ``base_model`` and ``adapter`` are paths relative to the version folder when
    they are copied into it, absolute paths, or (for the base) a Hugging Face id.
    """

    base_model: str
    adapter: str | None = None
    # "transformers" serves base_model; "echo" answers with the last user message,
    # token ids being its UTF-8 bytes: a model with no compute, to measure overhead.
    engine: Literal["transformers", "echo"] = "transformers"
    # "auto": bf16 where the instance's device computes it natively, else fp32.
    dtype: ServingDtype = "auto"
    num_threads: int = 0  # 0: the CPUs the process may use (spanmill.cpus)
    max_tokens_limit: int = 1024
    # Keys and values of earlier prompts and replies kept for prompts that begin with
    # them (spanmill.serving.prefix_cache); 0 keeps none.
    prefix_cache_mb: int = 512

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2)

    @classmethod
    def load(cls, version_dir: Path) -> ServingSpec:
        data = json.loads((version_dir / SERVING_SPEC).read_text())
        return cls(**data)

    def resolve(self, version_dir: Path, value: str) -> str:
        candidate = version_dir / value
        return str(candidate) if candidate.exists() else value


@dataclass
class _Batch:
    """A batch of prompts ready for ``generate``: see :meth:`Generator._batch`."""

    input_ids: Any
    attention_mask: Any
    past: Any
    kept: int
    width: int
    # Per row: the first column of its kept tokens and of the rest of its prompt.
    starts: list[tuple[int, int]]


class ContextLengthError(ProtocolError):
    """A request whose prompt and answer cannot fit the model's context window."""

    code = protocol.CONTEXT_LENGTH_EXCEEDED


class Listener(Protocol):
    """Told each choice's tokens so far after every generated token; True stops the request
    (its client is gone). Streaming and cancellation both hang on it."""

    def step(self, tokens: list[list[int]]) -> bool: ...


class Cancellation:
    """A listener that stops a request whose client is gone.

    A server notices a closed connection only when it writes to it, and a request
    answered at its end writes nothing until then: ``beat``, when given, is called
    once ``every_s`` seconds have passed since the request began or last beat, to
    write something (an empty partial response), so that a departed client is
    noticed within about that time. A quick answer writes no beat at all.
    """

    def __init__(
        self,
        cancelled: Callable[[], bool],
        beat: Callable[[], None] | None = None,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cancelled = cancelled
        self.beat = beat
        self.every_s = every_s
        self.clock = clock
        self.last = clock()

    def step(self, tokens: list[list[int]]) -> bool:
        if self.beat is not None and self.clock() - self.last >= self.every_s:
            self.last = self.clock()
            self.beat()
        return self.cancelled()


class TextStream:
    """Each choice's text as it grows, sent on in pieces that the final text begins with.

    A piece holds back what may still change: an unfinished UTF-8 character (the
    tokenizer shows it as U+FFFD) and, when the request has stop strings, a tail
    that may be the start of one (the final text is cut before a stop string).
    """

    def __init__(
        self,
        tokenizer: Any,
        eos_ids: list[int],
        params: GenerationParams,
        send: Callable[[list[str]], None],
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_ids)
        self.stop = params.stop
        self.hold = max((len(s) for s in params.stop), default=1) - 1
        self.send = send
        self.cancelled = cancelled
        self.sent: list[str] = [""] * params.n

    def visible(self, tokens: list[int]) -> str:
        end = next((i for i, t in enumerate(tokens) if t in self.eos_ids), len(tokens))
        text = str(self.tokenizer.decode(tokens[:end], skip_special_tokens=True))
        for stop in self.stop:
            cut = text.find(stop)
            if cut != -1:
                return text[:cut]
        if self.hold:
            text = text[: len(text) - self.hold] if len(text) > self.hold else ""
        return text.rstrip("\ufffd")

    def step(self, tokens: list[list[int]]) -> bool:
        if self.cancelled():
            return True
        pieces = []
        for choice, ids in enumerate(tokens):
            text = self.visible(ids)
            done = self.sent[choice]
            piece = text[len(done) :] if text.startswith(done) and len(text) > len(done) else ""
            self.sent[choice] = done + piece
            pieces.append(piece)
        if any(pieces):
            self.send(pieces)
        return False


def render_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> str:
    """The prompt text of a conversation: the model's chat template, with its tools.

    One rendering for both flavours: the Python flavour renders inside Triton, the
    gateway renders for the vLLM flavour, which takes text.
    """
    text = tokenizer.apply_chat_template(
        messages,
        tools=list(tools) if tools else None,
        add_generation_prompt=True,
        tokenize=False,
    )
    return str(text)


def instance_device(kind: str, device_id: int | str = 0) -> str:
    """The torch device of a Triton model instance: its GPU for ``KIND_GPU``, else the CPU.

    ``kind`` and ``device_id`` are what Triton passes the Python backend
    (``model_instance_kind``: ``GPU``, ``CPU`` or ``MODEL``; ``model_instance_device_id``).
    """
    return f"cuda:{int(device_id)}" if kind.upper() in ("GPU", "KIND_GPU") else "cpu"


class Generator:
    """A causal LM with its tokenizer, ready to answer chat requests."""

    def __init__(
        self,
        model_path: str,
        adapter_path: str | None = None,
        *,
        dtype: ServingDtype = ServingSpec.dtype,
        num_threads: int = ServingSpec.num_threads,
        max_tokens_limit: int = ServingSpec.max_tokens_limit,
        version: str = "",
        device: str = "cpu",
        prefix_cache_mb: int = ServingSpec.prefix_cache_mb,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(
                f"generation was placed on {device} (a KIND_GPU Triton instance), but torch "
                "sees no CUDA device here: install a CUDA build of torch, or serve KIND_CPU"
            )
        set_torch_threads(num_threads)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model: Any = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=getattr(torch, precision.resolve(dtype, device))
        )
        if adapter_path:
            from peft import PeftModel

            # Merged once at load: serving then costs what the base model costs.
            model = PeftModel.from_pretrained(model, adapter_path).merge_and_unload()
        model.to(device).eval()
        self._attach(model, tokenizer, max_tokens_limit=max_tokens_limit, version=version)
        # The weights stay as loaded, so what was computed for a prompt stays true.
        self.prefix_cache = PrefixCache(prefix_cache_mb << 20)

    @classmethod
    def around(
        cls,
        model: Any,
        tokenizer: Any,
        *,
        max_tokens_limit: int = ServingSpec.max_tokens_limit,
        version: str = "",
        prefix_cache_mb: int = 0,
    ) -> Generator:
        """A generator over a model already in memory (the policy a trainer is updating).

        The model is used as it is: the caller puts it in eval mode for generation.
        Nothing is kept between generations unless ``prefix_cache_mb`` says so: the
        weights may change under it, and whoever changes them must drop what was kept
        (:meth:`spanmill.train.policy.PolicyServer.version`).
        """
        generator = cls.__new__(cls)
        generator._attach(model, tokenizer, max_tokens_limit=max_tokens_limit, version=version)
        generator.prefix_cache = PrefixCache(prefix_cache_mb << 20)
        return generator

    def _attach(self, model: Any, tokenizer: Any, *, max_tokens_limit: int, version: str) -> None:
        import torch

        self._torch = torch
        self.version = version
        self.max_tokens_limit = max_tokens_limit
        self.tokenizer = tokenizer
        self.model: Any = model
        # Inputs go where the weights are (a trainer's policy may be on a GPU).
        self.device = next(model.parameters()).device
        self.eos_ids = _eos_ids(model, self.tokenizer)
        # 0: the model states no window, and no request is refused for its length.
        config = getattr(model, "config", None)
        self.context_window = int(getattr(config, "max_position_embeddings", 0) or 0)
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.eos_ids[0]
        )
        # Seeded sampling sets torch's global generator: one request at a time.
        self._lock = threading.Lock()

    @classmethod
    def from_version_dir(
        cls, version_dir: Path, version: str = "", device: str = "cpu"
    ) -> Generator | EchoGenerator:
        """The generator a version folder describes, its weights on ``device``."""
        spec = ServingSpec.load(version_dir)
        if spec.engine == "echo":
            return EchoGenerator(version or version_dir.name)
        return cls(
            spec.resolve(version_dir, spec.base_model),
            spec.resolve(version_dir, spec.adapter) if spec.adapter else None,
            dtype=spec.dtype,
            num_threads=spec.num_threads,
            max_tokens_limit=spec.max_tokens_limit,
            version=version or version_dir.name,
            device=device,
            prefix_cache_mb=spec.prefix_cache_mb,
        )

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return render_prompt(self.tokenizer, messages, tools)

    def check_fits(
        self,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> int:
        """The prompt's length in tokens; raises ContextLengthError when the prompt and
        ``max_tokens`` (as far as the server's limit lets it go) overrun the context window.

        Checked before a request joins a batch: an oversized prompt is refused at once
        instead of occupying the model (and every request batched with it) for minutes,
        and a conversation the chat template refuses is the client's error (ProtocolError).
        """
        try:
            text = self.render(messages, tools)
        except Exception as exc:  # the template's raise_exception, a TypeError of a tool...
            raise ProtocolError(
                f"MESSAGES/TOOLS: this model's chat template refused them: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        prompt = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        answer = min(params.max_tokens, self.max_tokens_limit)
        vocabulary = int(getattr(self.model.config, "vocab_size", 0) or 0)
        if params.alone and params.n * answer * vocabulary * 4 * 4 > SOLO_SCORES_BYTES:
            raise ProtocolError(
                f"N {params.n} with MAX_TOKENS {answer} would hold "
                f"{params.n * answer * vocabulary * 16 / 1024**3:.1f} GiB of scores on this "
                f"model (a vocabulary of {vocabulary}), over the "
                f"{SOLO_SCORES_BYTES / 1024**3:g} GiB a request may: ask fewer choices or "
                "fewer tokens"
            )
        if self.context_window and prompt + answer > self.context_window:
            raise ContextLengthError(
                f"{ContextLengthError.code}: this model's maximum context length is "
                f"{self.context_window} tokens; the messages take {prompt} and max_tokens "
                f"asks for {answer} more: shorten the messages or lower max_tokens"
            )
        return prompt

    def generate(
        self,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
        listener: Listener | None = None,
    ) -> GenerationResult:
        """``params.n`` choices for one conversation; ``listener`` sees every token."""
        torch = self._torch
        prompt = self.render(messages, tools)
        encoded = self.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
        prompt_ids = encoded["input_ids"]
        sampling = params.temperature > 0
        options: dict[str, Any] = {
            "max_new_tokens": min(params.max_tokens, self.max_tokens_limit),
            "do_sample": sampling,
            "num_return_sequences": params.n,
            "return_dict_in_generate": True,
            "output_scores": True,
            "pad_token_id": self.pad_id,
            "eos_token_id": self.eos_ids,
        }
        if sampling:
            # top_k=0: no top-k cut (transformers' default keeps 50). The chat API has no
            # top_k, and the logprobs recorded must be those of the distribution sampled
            # from, temperature and top_p alone, for a trainer's importance ratios.
            options.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        else:
            # Greedy: neutralise sampling defaults a generation_config may carry.
            options.update(temperature=None, top_p=None, top_k=None)
        if params.stop:
            options.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        sampled: dict[int, int] = {}
        if listener is not None:
            rows = list(range(params.n))
            options.update(
                stopping_criteria=_watch(prompt_ids.shape[1], [(listener, rows)], sampled)
            )
        from spanmill.serving.kv_cache import RoomyCache

        with self._lock, torch.inference_mode():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.model.generate(
                input_ids=prompt_ids.to(self.device),
                attention_mask=encoded["attention_mask"].to(self.device),
                cache=RoomyCache(self.model.config),
                **options,
            )
            scores = self.model.compute_transition_scores(
                out.sequences, out.scores, normalize_logits=True
            )
        new_tokens = out.sequences[:, prompt_ids.shape[1] :]
        choices = [
            self._choice(new_tokens[row].tolist(), scores[row].tolist(), params, sampled.get(row))
            for row in range(new_tokens.shape[0])
        ]
        return GenerationResult(
            choices=choices,
            prompt_token_ids=prompt_ids[0].tolist(),
            model_version=self.version,
        )

    def generate_batch(
        self,
        conversations: list[list[dict[str, Any]]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
        listeners: list[Listener | None] | None = None,
    ) -> list[GenerationResult]:
        """One choice for each conversation, generated together in one left-padded batch.

        Offline work (evaluation) uses it: one forward pass per token for the whole
        batch costs little more than for one conversation on a CPU. ``listeners``
        (one per conversation, or None) see every token of their conversation, and
        one that says stop ends its conversation alone.
        """
        if not conversations:
            return []
        if params.n != 1:
            raise ValueError("batch generation gives one choice per conversation; use n=1")
        torch = self._torch
        prompts = [
            self.tokenizer(self.render(messages, tools), add_special_tokens=False)["input_ids"]
            for messages in conversations
        ]
        options: dict[str, Any] = {
            "max_new_tokens": min(params.max_tokens, self.max_tokens_limit),
            "return_dict_in_generate": True,
            "output_scores": True,
            "pad_token_id": self.pad_id,
            "eos_token_id": self.eos_ids,
        }
        if params.temperature > 0:
            options.update(
                do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0
            )
        else:
            options.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.stop:
            options.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        with self._lock, torch.inference_mode():
            batch = self._batch(prompts)
            watched = [(lst, [row]) for row, lst in enumerate(listeners or []) if lst is not None]
            sampled: dict[int, int] = {}
            if watched:
                options.update(stopping_criteria=_watch(batch.width, watched, sampled))
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.model.generate(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                cache=batch.past,
                use_cache=True,
                **options,
            )
            scores = self.model.compute_transition_scores(
                out.sequences, out.scores, normalize_logits=True
            )
            new_tokens = out.sequences[:, batch.width :].tolist()
            if self.prefix_cache.enabled:
                self._keep(batch, prompts, new_tokens, out.cache)
        return [
            GenerationResult(
                choices=[
                    self._choice(new_tokens[row], scores[row].tolist(), params, sampled.get(row))
                ],
                prompt_token_ids=list(prompts[row]),
                model_version=self.version,
            )
            for row in range(len(prompts))
        ]

    def _batch(
        self,
        prompts: list[list[int]],
        found: list[tuple[int, Entry | None]] | None = None,
        cache: PrefixCache | None = None,
    ) -> _Batch:
        """The prompts as one batch, each starting from the longest run of its first
        tokens that the prefix cache holds (``cache``, where the caller looked them up
        in one it holds: the generator's may have been replaced since).

        A row is laid out as [padding, kept tokens | padding, the rest of its prompt]:
        the kept tokens' keys and values fill the cache part (columns before ``kept``),
        and the model computes the columns after it. Left padding within each part
        keeps every prompt's last token in the last column, where generation goes on.
        """
        torch = self._torch
        cache = cache if cache is not None else self.prefix_cache
        if found is None:
            found = [cache.lookup(ids) for ids in prompts]
        kept = max(n for n, _ in found)
        width = kept + max(len(ids) - n for ids, (n, _) in zip(prompts, found, strict=True))
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, (ids, (n, _)) in enumerate(zip(prompts, found, strict=True)):
            input_ids[row, kept - n : kept] = torch.tensor(ids[:n], dtype=torch.long)
            attention_mask[row, kept - n : kept] = 1
            rest = ids[n:]
            input_ids[row, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            attention_mask[row, width - len(rest) :] = 1
        cache.stats.reused_tokens += sum(n for n, _ in found)
        cache.stats.computed_tokens += sum(len(ids) for ids in prompts) - sum(n for n, _ in found)
        from spanmill.serving.kv_cache import RoomyCache

        # Always a cache of spanmill's own, so that decoding writes in place.
        past = RoomyCache(self.model.config)
        if kept:
            sample = next(entry for _, entry in found if entry is not None)
            for layer, (keys, values) in enumerate(zip(sample.keys, sample.values, strict=True)):
                heads, _, dim = keys.shape
                shape = (len(prompts), heads, kept, dim)
                layer_keys = keys.new_zeros(shape)
                layer_values = values.new_zeros(shape)
                for row, (n, entry) in enumerate(found):
                    if entry is not None and n:
                        layer_keys[row, :, kept - n :] = entry.keys[layer][:, :n]
                        layer_values[row, :, kept - n :] = entry.values[layer][:, :n]
                past.update(layer_keys, layer_values, layer)
        return _Batch(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            past=past,
            kept=kept,
            width=width,
            starts=[
                (kept - n, width - (len(ids) - n))
                for ids, (n, _) in zip(prompts, found, strict=True)
            ],
        )

    def _keep(
        self, batch: _Batch, prompts: list[list[int]], new_tokens: list[list[int]], past: Any
    ) -> None:
        """Put each row's prompt and reply, with their keys and values, in the prefix cache."""
        torch = self._torch
        computed = int(past.layers[0].keys.shape[2])
        for row, (ids, tokens) in enumerate(zip(prompts, new_tokens, strict=True)):
            # The last token generated was never fed back, so it has no keys yet.
            reply = tokens[: min(self._end(tokens), max(0, computed - batch.width))]
            first, rest = batch.starts[row]
            columns = torch.cat(
                [
                    torch.arange(first, batch.kept),
                    torch.arange(rest, batch.width + len(reply)),
                ]
            ).to(past.layers[0].keys.device)
            self.prefix_cache.store_row(list(ids) + list(reply), past, row, columns)

    def _end(self, tokens: list[int]) -> int:
        """Where the reply ends: its first end-of-sequence token, or the first pad token
        (what generate writes into a row after its stop string ended it, while the other
        rows of its request go on: never a sampled token), or its length."""
        ends = {*self.eos_ids, self.pad_id}
        return next((i for i, token in enumerate(tokens) if token in ends), len(tokens))

    def _choice(
        self,
        tokens: list[int],
        logprobs: list[float],
        params: GenerationParams,
        sampled: int | None = None,
    ) -> Choice:
        """A row's answer. Its ids keep the end-of-sequence token the model sampled, with
        its logprob, as vLLM's do: a trainer learns when to stop from it (the text leaves
        it out). ``sampled``: how many of ``tokens`` the model chose (a listener stopped
        the row there); what follows them, or a stop string, is padding, never recorded."""
        end = self._end(tokens)
        finish: Literal["stop", "length"] = "stop" if end < len(tokens) else "length"
        text = str(self.tokenizer.decode(tokens[:end], skip_special_tokens=True))
        chosen = len(tokens) if sampled is None else sampled
        for stop in params.stop:
            cut = text.find(stop)
            if cut != -1:
                text, finish, chosen = text[:cut], "stop", end
        ended = end < min(len(tokens), chosen) and tokens[end] in self.eos_ids
        kept = end + 1 if ended else end
        return Choice(
            text=text, token_ids=tokens[:kept], logprobs=logprobs[:kept], finish_reason=finish
        )


def _watch(
    prompt_width: int, groups: list[tuple[Listener, list[int]]], sampled: dict[int, int]
) -> Any:
    """A stopping criterion that shows each listener its rows' new tokens after every
    token, and stops the rows of a listener that says stop; ``sampled`` gets how many
    tokens each row it stopped had then (generate pads the rest)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Watch(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            new = input_ids[:, prompt_width:].tolist()
            stop = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            for listener, rows in groups:
                if listener.step([new[row] for row in rows]):
                    stop[rows] = True
                    for row in rows:
                        sampled.setdefault(row, len(new[row]))
            return stop

    return StoppingCriteriaList([Watch()])


@dataclass(frozen=True)
class Request:
    """One decoded request: what :func:`generate_all` answers."""

    messages: list[dict[str, Any]]
    params: GenerationParams
    tools: list[dict[str, Any]] | None = None
    listener: Listener | None = None

    def batch_key(self) -> tuple[GenerationParams, str] | None:
        """Requests with equal keys can be generated as one batch; None: on its own
        (``GenerationParams.alone``)."""
        if self.params.alone:
            return None
        return self.params, json.dumps(self.tools, sort_keys=True)


def generate_all(
    generator: Generator | EchoGenerator, requests: list[Request]
) -> list[GenerationResult | Exception]:
    """Answer ``requests`` in order, generating together those that can share a batch.

    Triton's dynamic batcher hands the model the requests that arrived together;
    greedy and unseeded sampled requests with the same parameters and tools go
    through one left-padded generation. A failure is returned in the place of
    each result it cost, so one bad request fails only its own batch.
    """
    results: dict[int, GenerationResult | Exception] = {}
    groups: dict[tuple[GenerationParams, str], list[int]] = {}
    alone: list[int] = []
    for index, request in enumerate(requests):
        key = request.batch_key()
        if key is None:
            alone.append(index)
        else:
            groups.setdefault(key, []).append(index)
    for indices in groups.values():
        # A group of one goes the batch way too: that way reuses cached prompt prefixes.
        first = requests[indices[0]]
        try:
            batch = generator.generate_batch(
                [requests[i].messages for i in indices],
                first.params,
                tools=first.tools,
                listeners=[requests[i].listener for i in indices],
            )
            for index, result in zip(indices, batch, strict=True):
                results[index] = result
        except Exception as exc:
            for index in indices:
                results[index] = exc
    for index in alone:
        request = requests[index]
        try:
            results[index] = generator.generate(
                request.messages, request.params, request.tools, request.listener
            )
        except Exception as exc:
            results[index] = exc
    return [results[index] for index in range(len(requests))]


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokens that end a reply: the generation config's and the tokenizer's, both (a
    fine-tune whose turns end with the tokenizer's end-of-turn token, while its generation
    config still names the base model's end of text, would otherwise never stop)."""
    configured = model.generation_config.eos_token_id
    ids = configured if isinstance(configured, list) else [configured]
    found = [int(i) for i in [*ids, tokenizer.eos_token_id] if i is not None]
    return list(dict.fromkeys(found))


class _Bytes:
    """The echo engine's tokenizer: a token is a byte."""

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(tokens).decode(errors="replace")


class EchoGenerator:
    """Answers with the last user message, cut to ``max_tokens`` bytes."""

    def __init__(self, version: str = "") -> None:
        self.version = version
        self.tokenizer = _Bytes()
        self.eos_ids: list[int] = []

    def check_fits(
        self,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> int:
        """The echo has no context window: any request fits."""
        return len(json.dumps(messages).encode())

    def generate(
        self,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
        listener: Listener | None = None,
    ) -> GenerationResult:
        """The echo; a listener sees its tokens one at a time, as a model would make them."""
        users = [m.get("content", "") for m in messages if m.get("role") == "user"]
        data = (users[-1] if users else "").encode()
        prompt = json.dumps(messages).encode()
        tokens = list(data[: params.max_tokens])
        if listener is not None:
            for end in range(1, len(tokens) + 1):
                if listener.step([tokens[:end]] * params.n):
                    tokens = tokens[:end]
                    break
        finish: Literal["stop", "length"] = "stop" if len(tokens) == len(data) else "length"
        choice = Choice(
            text=bytes(tokens).decode(errors="ignore"),
            token_ids=tokens,
            logprobs=[0.0] * len(tokens),
            finish_reason=finish,
        )
        return GenerationResult(
            choices=[choice] * params.n, prompt_token_ids=list(prompt), model_version=self.version
        )

    def generate_batch(
        self,
        conversations: list[list[dict[str, Any]]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
        listeners: list[Listener | None] | None = None,
    ) -> list[GenerationResult]:
        given = listeners or [None] * len(conversations)
        return [
            self.generate(messages, params, tools, listener)
            for messages, listener in zip(conversations, given, strict=True)
        ]
