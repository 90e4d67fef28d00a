"""Continuous batching: requests join and leave a running generation between tokens.

A static batch runs until its longest reply ends, and a request that arrives a moment
after it started waits for all of it. Here one decode step advances every running
row by one token; a row whose reply ended leaves at once, with its answer, and the
requests waiting join before the next step (their prompts computed together, from
the prefix cache where it holds their first tokens). An agent's episodes then keep
the batch full: the next turn of a conversation joins as soon as its tool returns,
instead of waiting for the other conversations' slowest reply (vLLM and TGI schedule
this way; this is the same idea for the transformers engine on a CPU or one GPU).

Rows are right-aligned: the last column of the key/value cache is every row's latest
token, a row that joins is left-padded to the running width, and the attention mask
hides the padding; positions come from the mask, so padding changes no row's result.

A request for several choices is that many rows, answered together once the last
has ended; a seeded sample draws from a generator of its own (choice ``i`` from
``seed + i``, as vLLM seeds a request's choices), so no request stops the batch to be
generated alone.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spanmill.serving import protocol
from spanmill.serving.generation import EchoGenerator, Generator, Request, generate_all
from spanmill.serving.kv_cache import RoomyCache, RoomyLayer
from spanmill.serving.prefix_cache import PrefixCache
from spanmill.serving.protocol import GenerationResult

log = logging.getLogger(__name__)

# Decode steps a request may wait for others to join with it, at most.
MAX_WAIT_STEPS = 4
# The share of a GPU's free memory the running batch's keys and values may take.
KV_MEMORY_FRACTION = 0.8

Done = Callable[[GenerationResult | Exception], None]


class QueueFull(RuntimeError):
    """The batcher holds as many waiting requests as it may: try again shortly."""


@dataclass
class _Answer:
    """One request's rows (one a choice), answered together once each has ended, or
    failed once, with the first failure of any."""

    request: Request
    done: Done
    rows: list[_Row] = field(default_factory=list)
    answered: bool = False

    def fail(self, exc: Exception) -> None:
        if not self.answered:
            self.answered = True
            _deliver(self.done, exc)

    def settle(self, generator: Generator) -> None:
        if self.answered or not all(row.finished for row in self.rows):
            return
        self.answered = True
        params, first = self.request.params, self.rows[0]
        choices = [generator._choice(row.tokens, row.logprobs, params) for row in self.rows]
        result = GenerationResult(
            choices=choices, prompt_token_ids=first.prompt, model_version=first.version
        )
        _deliver(self.done, result)


@dataclass
class _Row:
    answer: _Answer
    prompt: list[int]
    max_new: int
    # The generator's prefix cache and version when the row joined: its keys and values
    # are kept there, never in a cache made since for new weights (PolicyServer.version),
    # and its answer is that version's.
    cache: PrefixCache
    version: str
    # Its own draws, where the request named a seed; None: torch's default generator.
    rng: Any = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False

    @property
    def request(self) -> Request:
        return self.answer.request

    @property
    def width(self) -> int:
        return len(self.prompt) + self.max_new


@dataclass
class _Waiting:
    request: Request
    done: Done
    prompt: list[int]
    max_new: int
    since: int = 0  # the step it arrived at

    @property
    def width(self) -> int:
        """The most columns its rows can take: the prompt and the longest reply."""
        return len(self.prompt) + self.max_new


class ContinuousBatcher:
    """Generates for ``generator``, up to ``max_rows`` rows at once.

    ``submit`` hands a request over with the callback that receives its answer (or
    the exception it ended with). ``start`` runs the loop on a thread of its own;
    ``drain`` runs it on the caller's thread until nothing is left. ``max_waiting``
    bounds the requests held beyond the running rows (0: no bound); past it
    ``submit`` raises :class:`QueueFull`. ``max_batch_tokens`` bounds the keys and
    values the running rows may come to hold (0: no bound; see :func:`token_budget`):
    rows are right-aligned in one cache, so that is the rows times the widest row's
    prompt and ``max_tokens``; a request that would pass it waits for rows to leave
    (alone, it runs whatever its width).
    """

    def __init__(
        self,
        generator: Generator,
        *,
        max_rows: int = 32,
        max_waiting: int = 0,
        max_batch_tokens: int = 0,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        self.generator = generator
        self.max_rows = max_rows
        self.max_waiting = max_waiting
        self.max_batch_tokens = max_batch_tokens
        self.on_step = on_step  # told how many rows each decode step advanced
        self._torch = generator._torch
        self._waiting: deque[_Waiting] = deque()
        self._rows: list[_Row] = []
        self._mask: Any = None  # (rows, columns), 1 where a column holds a token
        self._past: Any = None
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.joined = 0

    # -- the caller's side ---------------------------------------------------------

    def submit(self, request: Request, done: Done) -> None:
        """Queue ``request``; one whose prompt cannot be made is answered with why."""
        generator = self.generator
        try:
            prompt = generator.tokenizer(
                generator.render(request.messages, request.tools), add_special_tokens=False
            )["input_ids"]
        except Exception as exc:
            _deliver(done, exc)
            return
        max_new = min(request.params.max_tokens, generator.max_tokens_limit)
        with self._wake:
            if self.max_waiting and len(self._waiting) >= self.max_waiting:
                raise QueueFull(
                    f"Exceeds maximum queue size: {len(self._waiting)} requests wait "
                    f"beside {len(self._rows)} generating"
                )
            self._waiting.append(_Waiting(request, done, list(prompt), max_new, self.steps))
            self._wake.notify()

    @property
    def busy(self) -> int:
        """Requests generating or waiting."""
        with self._wake:
            return len(self._rows) + len(self._waiting)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="spanmill-batcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def drain(self) -> None:
        """Run until every request submitted so far has its answer."""
        while self.step():
            pass

    # -- the loop ------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._waiting and not self._rows:
                    self._wake.wait()
                if self._stopping:
                    break
            self.step()
        error = RuntimeError("the model is shutting down")
        for row in self._rows:
            row.answer.fail(error)
        for waiting in self._waiting:
            _deliver(waiting.done, error)

    def step(self) -> bool:
        """Admit what waits, advance every row one token; False when there was nothing."""
        admitted: list[_Waiting] = []
        with self._wake:
            room = self.max_rows - len(self._rows) if self._admitting() else 0
            taken, widest = 0, max((row.width for row in self._rows), default=0)
            while self._waiting:
                # A request takes a row a choice; one with more choices than max_rows,
                # or wider than the token budget, runs once nothing else does.
                head = self._waiting[0]
                wanted, width = head.request.params.n, max(widest, head.width)
                rows = len(self._rows) + taken + wanted
                over = bool(self.max_batch_tokens) and rows * width > self.max_batch_tokens
                if (taken + wanted > room or over) and (taken or self._rows or not room):
                    break
                admitted.append(self._waiting.popleft())
                taken, widest = taken + wanted, width
        if not admitted and not self._rows:
            return False
        try:
            with self.generator._lock, self._torch.inference_mode():
                if admitted:
                    self._admit(admitted)
                if self._rows:
                    self._decode()
        except Exception as exc:  # a failed step fails the rows it held, not the model
            for row in self._rows:
                row.answer.fail(exc)
            self._rows, self._mask, self._past = [], None, None
        self.steps += 1
        return True

    def _admitting(self) -> bool:
        """Whether the requests waiting join now. A join costs a forward pass of its
        own, which holds up every running row, so a few that arrive together join
        together: at once when nothing runs, when they are a quarter of the running
        rows, or when the first has waited ``MAX_WAIT_STEPS`` steps."""
        if not self._waiting:
            return False
        if not self._rows or len(self._waiting) * 4 >= len(self._rows):
            return True
        return self.steps - self._waiting[0].since >= MAX_WAIT_STEPS

    def _admit(self, admitted: list[_Waiting]) -> None:
        """Compute the new rows' prompts, pick their first tokens, join them to the batch.

        Rows whose prompts need about as many tokens computed go together: a row that
        continues a conversation (its last turn in the prefix cache) computes tens of
        tokens, a new one hundreds, and in one left-padded forward every row would pay
        for the longest.
        """
        generator = self.generator
        cache, version = generator.prefix_cache, generator.version
        rows: list[_Row] = []
        found = []
        for waiting in admitted:
            request, prompt = waiting.request, waiting.prompt
            answer = _Answer(request, waiting.done)
            for choice in range(request.params.n):
                rng = self._rng(request, choice)
                answer.rows.append(_Row(answer, prompt, waiting.max_new, cache, version, rng))
                found.append(cache.lookup(prompt))
            rows += answer.rows
        # What each row must compute: its prompt past the kept run.
        costs = [len(row.prompt) - n for row, (n, _) in zip(rows, found, strict=True)]
        order = sorted(range(len(rows)), key=costs.__getitem__)
        for group in _similar(order, [costs[i] for i in order]):
            self._prefill([rows[i] for i in group], [found[i] for i in group])

    def _rng(self, request: Request, choice: int) -> Any:
        params = request.params
        if params.seed is None or params.temperature <= 0:
            return None
        rng = self._torch.Generator(device=self.generator.device)
        return rng.manual_seed(params.seed + choice)

    def _prefill(self, rows: list[_Row], found: list[Any]) -> None:
        generator = self.generator
        try:
            batch = generator._batch([row.prompt for row in rows], found, rows[0].cache)
            mask = batch.attention_mask
            out = generator.model(
                input_ids=batch.input_ids[:, batch.kept :],
                attention_mask=mask,
                position_ids=_positions(mask)[:, batch.kept :],
                cache=batch.past,
                use_cache=True,
                # The next token's distribution alone: every prompt position's logits
                # over the vocabulary would take rows x tokens x vocabulary floats.
                logits_to_keep=1,
            )
        except Exception as exc:  # these rows fail; the running ones go on
            for row in rows:
                row.answer.fail(exc)
            return
        # Kept now, not only when the reply ends: a conversation that joins later and
        # opens the same way (an agent's system prompt, tools and examples) starts from
        # it while this one still generates.
        for index, row in enumerate(rows):
            if row.cache.enabled:
                columns = mask[index].nonzero().flatten()
                try:
                    row.cache.store_row(row.prompt, out.cache, index, columns)
                except Exception:  # a prefix kept is a saving, never the row's failure
                    log.warning("a prompt's prefix was not kept", exc_info=True)
        self._join(rows, mask, out.cache)
        self.joined += len(rows)
        self._advance(rows, out.logits[:, -1, :])

    def _join(self, rows: list[_Row], mask: Any, past: Any) -> None:
        """Put new rows (their mask and cache) below the running ones, right-aligned."""
        torch = self._torch
        if not self._rows:
            self._rows, self._mask, self._past = rows, mask, past
            return
        width = max(self._mask.shape[1], mask.shape[1])
        old_pad = width - self._mask.shape[1]
        new_pad = width - mask.shape[1]
        self._mask = torch.cat([_pad_left(self._mask, old_pad), _pad_left(mask, new_pad)])
        merged = RoomyCache(self.generator.model.config)
        for index, (old, new) in enumerate(zip(self._past.layers, past.layers, strict=True)):
            keys = torch.cat([_pad_left(old.keys, old_pad, 2), _pad_left(new.keys, new_pad, 2)])
            values = torch.cat(
                [_pad_left(old.values, old_pad, 2), _pad_left(new.values, new_pad, 2)]
            )
            merged.update(keys, values, index)
        self._past = merged
        self._rows = self._rows + rows

    def _decode(self) -> None:
        """Feed every row its last token; pick the next."""
        torch = self._torch
        last = torch.tensor([[row.tokens[-1]] for row in self._rows], dtype=torch.long)
        ones = self._mask.new_ones((len(self._rows), 1))
        mask = torch.cat([self._mask, ones], dim=1)
        out = self.generator.model(
            input_ids=last.to(mask.device),
            attention_mask=mask,
            position_ids=_positions(mask)[:, -1:],
            cache=self._past,
            use_cache=True,
        )
        self._mask, self._past = mask, out.cache
        rows = len(self._rows)
        self._advance(self._rows, out.logits[:, -1, :])
        if self.on_step is not None:
            self.on_step(rows)

    def _advance(self, rows: list[_Row], logits: Any) -> None:
        """Give each row its next token; answer and drop the rows that ended."""
        tokens, logprobs = _pick(
            self._torch, logits, [row.request.params for row in rows], [row.rng for row in rows]
        )
        generator = self.generator
        listened: dict[int, _Answer] = {}
        for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            stop_text = row.request.params.stop
            if (
                token in generator.eos_ids
                or len(row.tokens) >= row.max_new
                or (stop_text and _has_stop(generator, row))
            ):
                row.finished = True
            if row.request.listener is not None:
                listened[id(row.answer)] = row.answer
        # A listener sees every choice of its request at once, and its stop ends them all.
        for answer in listened.values():
            assert answer.request.listener is not None
            if answer.request.listener.step([row.tokens for row in answer.rows]):
                for row in answer.rows:
                    row.finished = True
        if any(row.finished for row in self._rows):
            self._retire()

    def _retire(self) -> None:
        torch = self._torch
        generator = self.generator
        keep = [i for i, row in enumerate(self._rows) if not row.finished]
        for index, row in enumerate(self._rows):
            if not row.finished:
                continue
            if row.cache.enabled:
                self._store(index, row)
            row.answer.settle(generator)
        if not keep:
            self._rows, self._mask, self._past = [], None, None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self._mask.device)
        mask = self._mask.index_select(0, index)
        # Columns that only the rows gone used: the cache shrinks with the batch.
        first = int(mask.any(dim=0).nonzero()[0])
        self._mask = mask[:, first:]
        trimmed = RoomyCache(generator.model.config)
        for layer_index, layer in enumerate(self._past.layers):
            trimmed.update(
                layer.keys.index_select(0, index)[:, :, first:],
                layer.values.index_select(0, index)[:, :, first:],
                layer_index,
            )
        self._past = trimmed
        self._rows = [self._rows[i] for i in keep]

    def _store(self, index: int, row: _Row) -> None:
        """Keep the row's prompt and reply, with their keys and values, for its next turn."""
        # The last token picked was never fed, so it has no keys; nor does what follows
        # an end-of-sequence token belong to the conversation.
        reply = row.tokens[: min(self.generator._end(row.tokens), len(row.tokens) - 1)]
        columns = self._mask[index].nonzero().flatten()[: len(row.prompt) + len(reply)]
        row.cache.store_row(row.prompt + reply, self._past, index, columns)


class Immediate:
    """The scheduler of an engine that answers at once (the echo engine): each request
    is answered on the caller's thread, as it is submitted."""

    def __init__(self, generator: Generator | EchoGenerator) -> None:
        self.generator = generator

    def submit(self, request: Request, done: Done) -> None:
        _deliver(done, generate_all(self.generator, [request])[0])

    def start(self) -> None:
        return None

    def stop(self, timeout: float | None = None) -> None:
        return None


def kv_bytes_per_token(model: Any) -> int:
    """What one token's keys and values take, over every layer of ``model``."""
    config = model.config
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    element = next(model.parameters()).element_size()
    return int(config.num_hidden_layers) * 2 * heads * head_dim * element


def token_budget(generator: Generator, free_bytes: int | None = None) -> int:
    """The running batch's bound in token positions (rows times width) on a GPU: the
    memory free once the weights are loaded, less the prefix cache's budget, times
    :data:`KV_MEMORY_FRACTION` (the rest for each step's activations), over what a
    token's keys and values take. 0 on a CPU: no bound (its memory is the machine's).

    Without it, rows that joined by count alone could take more than the GPU holds: the
    step fails every running row, and the next joins fail the same way.
    """
    if free_bytes is None:
        if generator.device.type != "cuda":
            return 0
        free_bytes, _ = generator._torch.cuda.mem_get_info(generator.device)
    room = (free_bytes - generator.prefix_cache.budget_bytes) * KV_MEMORY_FRACTION
    return max(1, int(room // kv_bytes_per_token(generator.model)))


def scheduler_for(
    generator: Generator | EchoGenerator,
    *,
    max_rows: int,
    max_waiting: int,
    on_step: Callable[[int], None] | None = None,
) -> ContinuousBatcher | Immediate:
    """A running model's scheduler: continuous batching for a language model whose
    cache grows in place in every layer; one request after another otherwise (a model
    with sliding-window layers, Mistral's or Gemma's: the batcher's joins and retirements
    index a layer's keys by the whole width of the batch's mask, which such a layer does
    not keep)."""
    if isinstance(generator, Generator) and continuous(generator.model.config):
        budget = token_budget(generator)
        if budget:
            log.info("the running batch holds at most %d token positions", budget)
        return ContinuousBatcher(
            generator,
            max_rows=max_rows,
            max_waiting=max_waiting,
            max_batch_tokens=budget,
            on_step=on_step,
        )
    if isinstance(generator, Generator):
        log.warning("this model has layers whose cache does not grow in place (a sliding "
                    "window): its requests are generated one after another")  # fmt: skip
    return Immediate(generator)


def continuous(config: Any) -> bool:
    """Whether every layer of the model's cache grows in place, as the batcher needs."""
    return all(isinstance(layer, RoomyLayer) for layer in RoomyCache(config).layers)


def batch_limits(model_config: dict[str, Any]) -> tuple[int, int]:
    """Rows generated at once and requests held waiting, from a Triton model's config:
    its ``max_batch_size`` and its dynamic batcher's ``max_queue_size``."""
    rows = int(model_config.get("max_batch_size") or protocol.MAX_BATCH_SIZE)
    policy = (model_config.get("dynamic_batching") or {}).get("default_queue_policy") or {}
    waiting = int(policy.get("max_queue_size") or protocol.MAX_QUEUE_SIZE)
    return rows, waiting


def _similar(order: list[int], costs: list[int]) -> list[list[int]]:
    """``order`` (sorted by cost) cut into runs whose padding wastes at most a third:
    in a run, every row computes as many tokens as its costliest."""
    groups: list[list[int]] = []
    total = 0
    for index, cost in zip(order, costs, strict=True):
        if groups and (len(groups[-1]) + 1) * cost <= 1.5 * (total + cost) + 16:
            groups[-1].append(index)
            total += cost
        else:
            groups.append([index])
            total = cost
    return groups


def _deliver(done: Done, result: GenerationResult | Exception) -> None:
    try:
        done(result)
    except Exception:  # a callback's failure is its request's, not the batch's
        log.exception("answering a request failed")


def _positions(mask: Any) -> Any:
    """Each column's position in its row: the count of tokens before it (padding: 1)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0) * mask + (1 - mask)


def _pad_left(tensor: Any, columns: int, dim: int = 1) -> Any:
    if columns == 0:
        return tensor
    import torch

    shape = list(tensor.shape)
    shape[dim] = columns
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _has_stop(generator: Generator, row: _Row) -> bool:
    text = generator.tokenizer.decode(row.tokens, skip_special_tokens=True)
    return any(stop in text for stop in row.request.params.stop)


def _pick(
    torch: Any, logits: Any, params: list[Any], rngs: list[Any] | None = None
) -> tuple[list[int], list[float]]:
    """The next token of each row and its log-probability under the distribution it was
    drawn from: greedy rows take the most likely token; sampled rows draw after
    temperature and top-p (no top-k), as :meth:`Generator.generate` does, a row with a
    generator of its own (``rngs``) from it."""
    logits = logits.float()
    temperatures = torch.tensor([p.temperature for p in params], device=logits.device)
    sampled = temperatures > 0
    scores = logits.clone()
    if bool(sampled.any()):
        scores[sampled] = scores[sampled] / temperatures[sampled, None]
        top_p = torch.tensor([p.top_p for p in params], device=logits.device)
        nucleus = sampled & (top_p < 1.0)
        if bool(nucleus.any()):
            scores[nucleus] = _top_p(torch, scores[nucleus], top_p[nucleus])
    logprobs = torch.log_softmax(scores, dim=-1)
    chosen = logprobs.argmax(dim=-1)
    generators = rngs or [None] * len(params)
    own = [i for i, rng in enumerate(generators) if rng is not None and params[i].temperature > 0]
    shared = sampled.clone()
    if own:
        shared[own] = False
    if bool(shared.any()):
        chosen[shared] = torch.multinomial(logprobs[shared].exp(), 1).squeeze(1)
    for i in own:
        chosen[i] = torch.multinomial(logprobs[i].exp(), 1, generator=generators[i])[0]
    picked = logprobs.gather(1, chosen[:, None]).squeeze(1)
    return chosen.tolist(), picked.tolist()


def _top_p(torch: Any, scores: Any, top_p: Any) -> Any:
    """Scores outside each row's nucleus set to -inf (the most likely token always kept)."""
    ordered, order = torch.sort(scores, descending=False, dim=-1)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p[:, None])
    remove[:, -1] = False
    mask = remove.scatter(1, order, remove)
    return scores.masked_fill(mask, float("-inf"))
