"""Continuous batching on SmolLM2: rows join and leave a running batch between tokens
and answer as they would alone; the key/value cache grows in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DynamicCache
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from spanmill.evaluate.play import play_episodes
from spanmill.messages import to_model_messages
from spanmill.serving.batcher import ContinuousBatcher, QueueFull, _pick
from spanmill.serving.generation import Cancellation, Generator, Request
from spanmill.serving.kv_cache import RoomyCache, RoomyLayer
from spanmill.serving.protocol import GenerationParams, GenerationResult
from spanmill.tasks import get_task


def test_decode_steps_write_into_the_room_left_and_read_as_a_concatenation() -> None:
    layer = RoomyLayer()
    reference_keys = torch.randn(2, 3, 5, 4)
    reference_values = torch.randn(2, 3, 5, 4)
    layer.update(reference_keys, reference_values)
    buffer = layer.keys.untyped_storage().data_ptr()
    for _ in range(10):
        keys, values = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
        got_keys, got_values = layer.update(keys, values)
        reference_keys = torch.cat([reference_keys, keys], dim=2)
        reference_values = torch.cat([reference_values, values], dim=2)
        assert torch.equal(got_keys, reference_keys)
        assert torch.equal(got_values, reference_values)
    # Fifteen columns fit in the first buffer's room: no step copied the cache.
    assert layer.keys.untyped_storage().data_ptr() == buffer
    assert layer.get_seq_length() == 15
    # Past the room the buffer grows, and keeps what it held.
    big = torch.randn(2, 3, 100, 4)
    got_keys, _ = layer.update(big, big)
    assert torch.equal(got_keys, torch.cat([reference_keys, big], dim=2))


def test_tensors_replaced_from_outside_are_taken_as_they_are() -> None:
    layer = RoomyLayer()
    layer.update(torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4))
    layer.batch_select_indices(torch.tensor([0, 2]))  # what generate does to finished rows
    kept = layer.keys.clone()
    got_keys, _ = layer.update(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4))
    assert got_keys.shape == (2, 2, 5, 4)
    assert torch.equal(got_keys[:, :, :4], kept)
    assert torch.equal(got_keys[:, :, 4], torch.ones(2, 2, 4))


def test_sampled_rows_are_drawn_after_temperature_and_top_p_and_logprobs_are_theirs() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    params = [
        GenerationParams(),  # greedy
        GenerationParams(temperature=0.7, top_p=0.5),
        GenerationParams(temperature=1.3),
    ]
    for _ in range(20):
        tokens, logprobs = _pick(torch, logits, params)
        assert tokens[0] == int(logits[0].argmax())
        assert logprobs[0] == pytest.approx(float(logits[0].log_softmax(-1).max()), abs=1e-5)
        for row, p in ((1, params[1]), (2, params[2])):
            warpers = LogitsProcessorList([TemperatureLogitsWarper(p.temperature)])
            if p.top_p < 1.0:
                warpers.append(TopPLogitsWarper(p.top_p))
            scores = warpers(None, logits[row : row + 1].clone()).log_softmax(-1)[0]
            assert torch.isfinite(scores[tokens[row]])  # drawn from inside the nucleus
            assert logprobs[row] == pytest.approx(float(scores[tokens[row]]), abs=1e-5)


@pytest.fixture(scope="module")
def generator(smollm2_dir: Path) -> Generator:
    return Generator(str(smollm2_dir), dtype="float32", prefix_cache_mb=0)


def conversations(n: int) -> list[list[dict[str, Any]]]:
    task = get_task("calculator")
    return [
        to_model_messages(task.messages(instance, "few_shot"))
        for instance in task.instances("heldout", n, seed=3)
    ]


def collect(batcher: ContinuousBatcher, requests: list[Request]) -> list[Any]:
    results: list[Any] = [None] * len(requests)
    for index, request in enumerate(requests):
        batcher.submit(request, lambda result, index=index: results.__setitem__(index, result))
    return results


def test_rows_that_join_a_running_batch_answer_as_they_would_alone(
    generator: Generator,
) -> None:
    chats = conversations(5)
    params = GenerationParams(max_tokens=20)
    alone = [generator.generate_batch([chat], params)[0] for chat in chats]
    batcher = ContinuousBatcher(generator, max_rows=4)
    first = collect(batcher, [Request(chat, params) for chat in chats[:2]])
    for _ in range(6):
        batcher.step()
    assert len(batcher._rows) == 2 and all(r is None for r in first)
    # Three more join the two running, one waits for a row to leave.
    later = collect(batcher, [Request(chat, params) for chat in chats[2:]])
    batcher.step()
    assert len(batcher._rows) == 4 and len(batcher._waiting) == 1
    batcher.drain()
    for got, want in zip(first + later, alone, strict=True):
        assert isinstance(got, GenerationResult)
        assert got.prompt_token_ids == want.prompt_token_ids
        assert got.choices[0].token_ids == want.choices[0].token_ids
        assert got.choices[0].text == want.choices[0].text
        assert got.choices[0].logprobs == pytest.approx(want.choices[0].logprobs, abs=1e-3)
    assert batcher.joined == 5 and not batcher._rows and batcher._mask is None


def test_each_row_leaves_at_its_own_limit_stop_or_listener(generator: Generator) -> None:
    chat = conversations(1)[0]
    stopped = {"after": 0}

    def cancelled() -> bool:
        stopped["after"] += 1
        return stopped["after"] > 4

    batcher = ContinuousBatcher(generator, max_rows=8)
    results = collect(
        batcher,
        [
            Request(chat, GenerationParams(max_tokens=3)),
            Request(chat, GenerationParams(max_tokens=40)),
            Request(chat, GenerationParams(max_tokens=40, stop=('"',))),
            Request(chat, GenerationParams(max_tokens=40), listener=Cancellation(cancelled)),
        ],
    )
    batcher.drain()
    short, full, cut, gone = (r.choices[0] for r in results)
    assert len(short.token_ids) == 3 and short.finish_reason == "length"
    assert full.token_ids[:3] == short.token_ids and len(full.token_ids) > 3
    assert '"' in full.text and '"' not in cut.text and cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index('"')]
    assert len(gone.token_ids) == 5  # the listener said stop after its fifth token


def test_several_choices_and_seeded_samples_join_the_running_batch(generator: Generator) -> None:
    """A request for several choices, or a seeded sample, was generated alone between two
    steps: every running row stood still for its whole reply (one client asking n=8 long
    answers stalled everyone). Now each choice is a row of the batch, a seeded one drawing
    from a generator of its own, and the request is answered once its last choice ends."""
    chat = conversations(1)[0]
    seeded = GenerationParams(max_tokens=12, n=2, temperature=0.9, seed=11)
    batcher = ContinuousBatcher(generator, max_rows=8)
    running = collect(batcher, [Request(chat, GenerationParams(max_tokens=40))])
    for _ in range(3):
        batcher.step()
    seen: list[int] = []

    class Sees:
        def step(self, tokens: list[list[int]]) -> bool:
            seen.append(len(tokens))
            return False

    one = GenerationParams(max_tokens=6, seed=4, temperature=0.5)
    joined = collect(batcher, [Request(chat, seeded, listener=Sees()), Request(chat, one)])
    steps = batcher.steps
    batcher.step()
    # All four rows generate together; the running one moved on by one token only.
    assert len(batcher._rows) == 4 and batcher.steps == steps + 1
    assert running[0] is None and len(batcher._rows[0].tokens) == 5
    batcher_tokens = list(batcher._rows[0].tokens)
    batcher.drain()
    pair, single = joined[0], joined[1]
    assert len(pair.choices) == 2 and len(single.choices) == 1
    assert set(seen) == {2}  # the listener saw both choices at every step
    assert running[0].choices[0].token_ids[:5] == batcher_tokens
    # Seeded: the same request answers the same, alone or beside others.
    again = ContinuousBatcher(generator, max_rows=8)
    alone = collect(again, [Request(chat, seeded)])
    again.drain()
    assert [c.token_ids for c in alone[0].choices] == [c.token_ids for c in pair.choices]
    for choice in pair.choices:
        assert len(choice.logprobs) == len(choice.token_ids) > 0


def test_a_row_with_a_generator_of_its_own_draws_from_it() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    params = [GenerationParams(temperature=0.7)] * 3
    rngs = [torch.Generator().manual_seed(5), None, torch.Generator().manual_seed(6)]
    tokens, logprobs = _pick(torch, logits, params, rngs)
    for row, seed in ((0, 5), (2, 6)):
        probs = (logits[row] / 0.7).softmax(-1)
        want = int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed))[0])
        assert tokens[row] == want
        assert logprobs[row] == pytest.approx(float(probs[want].log()), abs=1e-5)


def test_rows_join_within_the_token_budget_and_the_rest_wait(generator: Generator) -> None:
    """Rows joined by count alone: on a GPU, long prompts could take more keys and values
    than it holds, and the failed step failed every running row. With a budget, a
    request that would pass it waits until rows leave; each answers as it would alone."""
    chat = conversations(1)[0]
    params = GenerationParams(max_tokens=8)
    width = len(generator.tokenizer(generator.render(chat, None))["input_ids"]) + 8
    unbounded = ContinuousBatcher(generator, max_rows=8)
    want = collect(unbounded, [Request(chat, params)] * 3)
    unbounded.drain()
    batcher = ContinuousBatcher(generator, max_rows=8, max_batch_tokens=2 * width)
    got = collect(batcher, [Request(chat, params)] * 3)
    batcher.step()
    assert len(batcher._rows) == 2 and len(batcher._waiting) == 1
    batcher.drain()
    assert [r.choices[0].token_ids for r in got] == [r.choices[0].token_ids for r in want]
    # Wider than the whole budget alone: it runs once nothing else does, never stuck.
    narrow = ContinuousBatcher(generator, max_rows=8, max_batch_tokens=width // 2)
    alone = collect(narrow, [Request(chat, params)] * 2)
    narrow.step()
    assert len(narrow._rows) == 1
    narrow.drain()
    assert all(isinstance(r, GenerationResult) for r in alone)


def test_the_token_budget_is_the_gpus_free_memory_and_none_on_a_cpu(
    generator: Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spanmill.serving.batcher import KV_MEMORY_FRACTION, kv_bytes_per_token, token_budget

    config = generator.model.config
    # SmolLM2-135M in float32: 30 layers, keys and values of 3 heads of 64.
    assert kv_bytes_per_token(generator.model) == (
        config.num_hidden_layers * 2 * config.num_key_value_heads * 64 * 4
    )
    assert token_budget(generator) == 0  # on the CPU: no bound
    asked: list[Any] = []

    def mem_get_info(device: Any) -> tuple[int, int]:
        asked.append(device)
        return 8 << 30, 80 << 30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(generator, "device", torch.device("cuda", 1))
    room = ((8 << 30) - generator.prefix_cache.budget_bytes) * KV_MEMORY_FRACTION
    assert token_budget(generator) == int(room // kv_bytes_per_token(generator.model))
    assert asked == [torch.device("cuda", 1)]  # the instance's own GPU


def test_a_full_queue_refuses_at_once_in_the_words_the_gateway_maps_to_429(
    generator: Generator,
) -> None:
    batcher = ContinuousBatcher(generator, max_rows=2, max_waiting=2)
    chat = conversations(1)[0]
    collect(batcher, [Request(chat, GenerationParams(max_tokens=2))] * 2)
    with pytest.raises(QueueFull, match="maximum queue size"):
        batcher.submit(Request(chat, GenerationParams(max_tokens=2)), lambda _: None)
    batcher.drain()
    assert batcher.busy == 0


def test_a_request_that_cannot_be_rendered_fails_alone(generator: Generator) -> None:
    chat = conversations(1)[0]
    batcher = ContinuousBatcher(generator)
    results = collect(
        batcher,
        [
            Request(chat, GenerationParams(max_tokens=4)),
            Request([{"role": "user", "content": 5}], GenerationParams(max_tokens=4)),
            Request(chat, GenerationParams(max_tokens=4, n=2, temperature=0.8)),  # two rows
        ],
    )
    batcher.drain()
    assert isinstance(results[0], GenerationResult)
    assert isinstance(results[1], Exception)
    assert len(results[2].choices) == 2


def test_a_prefill_that_fails_before_the_model_answers_its_rows(
    generator: Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while the joining rows' batch was made (their tensors, the kept prefix
    they start from) was outside the prefill's own handling: the rows of that group, and
    of every later one, were never answered, and the running rows failed with them."""
    chat = conversations(1)[0]
    batcher = ContinuousBatcher(generator)
    running = collect(batcher, [Request(chat, GenerationParams(max_tokens=12))])
    for _ in range(3):
        batcher.step()
    real = generator._batch

    def broken(prompts: Any, *args: Any) -> Any:
        if len(prompts) == 1 and batcher._rows:
            raise RuntimeError("CUDA out of memory")
        return real(prompts, *args)

    monkeypatch.setattr(generator, "_batch", broken)
    joining = collect(batcher, [Request(chat, GenerationParams(max_tokens=4))])
    batcher.drain()
    assert isinstance(joining[0], RuntimeError)  # answered, with its failure
    assert isinstance(running[0], GenerationResult)  # the running row went on
    assert len(running[0].choices[0].token_ids) == 12


def test_the_thread_serves_episodes_that_come_and_go(generator: Generator) -> None:
    import threading

    task = get_task("calculator")
    instances = task.instances("heldout", 4, seed=7)
    lockstep = play_episodes(generator, task, instances, prompt_style="few_shot", batch_size=4)
    batcher = ContinuousBatcher(generator, max_rows=3)
    batcher.start()
    try:

        class Served:
            """Each turn's requests go to the batcher's thread; answers come back there."""

            def generate_batch(self, chats: Any, params: Any, tools: Any = None) -> Any:
                answered = threading.Semaphore(0)
                results: list[Any] = [None] * len(chats)

                def answer(index: int) -> Any:
                    def done(result: Any) -> None:
                        results[index] = result
                        answered.release()

                    return done

                for index, chat in enumerate(chats):
                    batcher.submit(Request(chat, params, tools), answer(index))
                for _ in chats:
                    assert answered.acquire(timeout=300)
                return results

        served = play_episodes(Served(), task, instances, prompt_style="few_shot", batch_size=4)
    finally:
        batcher.stop()
    assert [o.transcript for o in served] == [o.transcript for o in lockstep]


def test_a_roomy_cache_keeps_sliding_window_layers_as_transformers_makes_them() -> None:
    from transformers import LlamaConfig, MistralConfig

    config = MistralConfig(num_hidden_layers=2, sliding_window=8, layer_types=None)
    cache = RoomyCache(config)
    plain = DynamicCache(config=config)
    assert [type(layer) for layer in cache.layers] == [type(layer) for layer in plain.layers]
    assert not any(isinstance(layer, RoomyLayer) for layer in cache.layers)
    llama = RoomyCache(LlamaConfig(num_hidden_layers=2))
    assert [type(layer) for layer in llama.layers] == [RoomyLayer, RoomyLayer]


def test_a_reply_ends_at_the_tokenizers_end_of_turn_as_at_the_configs_end_of_text() -> None:
    """Where the generation config named an end token, the tokenizer's was ignored: a
    fine-tune whose turns end with the tokenizer's end-of-turn token never stopped."""
    import types

    from spanmill.serving.generation import _eos_ids

    def ids(configured: Any, tokenizer: int | None) -> list[int]:
        model = types.SimpleNamespace(generation_config=types.SimpleNamespace(
            eos_token_id=configured))  # fmt: skip
        return _eos_ids(model, types.SimpleNamespace(eos_token_id=tokenizer))

    assert ids(2, 7) == [2, 7]
    assert ids([2, 5], 5) == [2, 5]
    assert ids(None, 7) == [7]


def test_a_model_with_sliding_window_layers_is_served_one_request_after_another() -> None:
    """The batcher indexes each layer's keys by the batch mask's whole width, which a
    sliding-window layer does not keep: with a Mistral-shaped model, a row that joined or
    left a running batch failed ('Sizes of tensors must match'), and took the running
    rows with it. Such a model is served without continuous batching."""
    import types

    from transformers import LlamaConfig, MistralConfig

    from spanmill.serving.batcher import Immediate, continuous, scheduler_for

    sliding = MistralConfig(num_hidden_layers=2, sliding_window=8, layer_types=None)
    assert not continuous(sliding) and continuous(LlamaConfig(num_hidden_layers=2))
    generator = Generator.__new__(Generator)
    generator.model = types.SimpleNamespace(config=sliding)
    assert isinstance(scheduler_for(generator, max_rows=4, max_waiting=4), Immediate)


def test_the_pad_tokens_after_a_stopped_row_are_not_recorded_as_sampled() -> None:
    """n > 1: a row a stop string ended is filled with pad tokens while the others go on;
    where pad and end differ, those pads were recorded as sampled tokens (with made-up
    logprobs, -inf under top_p), and training took them for the model's own."""
    generator = Generator.__new__(Generator)
    generator.eos_ids, generator.pad_id = [2], 0
    generator.tokenizer = types_namespace(decode=lambda tokens, **_: "ab STOP")
    choice = generator._choice([5, 6, 7, 0, 0], [-0.1, -0.2, -0.3, float("-inf"), -1.0],
                               GenerationParams(stop=("STOP",)))  # fmt: skip
    assert choice.token_ids == [5, 6, 7] and choice.logprobs == [-0.1, -0.2, -0.3]
    assert choice.text == "ab " and choice.finish_reason == "stop"


def test_the_end_token_the_model_chose_is_recorded_and_the_padding_after_it_not() -> None:
    """The reply's ids end with the end-of-sequence token it sampled, with its logprob,
    as vLLM's do: without it a trainer's loss never reaches the choice to stop, and a
    policy learnt on rollouts cannot learn to end its answers. Where pad and end are
    one token, a row a stop string or a listener ended is padding, not an end."""
    generator = Generator.__new__(Generator)
    generator.eos_ids, generator.pad_id = [2], 2
    generator.tokenizer = types_namespace(decode=lambda tokens, **_: "ab")
    ended = generator._choice([5, 6, 2, 2], [-0.1, -0.2, -0.3, -9.0], GenerationParams())
    assert ended.token_ids == [5, 6, 2] and ended.logprobs == [-0.1, -0.2, -0.3]
    assert ended.text == "ab" and ended.finish_reason == "stop"
    long = generator._choice([5, 6, 7], [-0.1, -0.2, -0.3], GenerationParams())
    assert long.token_ids == [5, 6, 7] and long.finish_reason == "length"
    listened = generator._choice([5, 6, 2, 2], [-0.1, -0.2, -0.3, -9.0], GenerationParams(),
                                 sampled=2)  # fmt: skip
    assert listened.token_ids == [5, 6] and listened.logprobs == [-0.1, -0.2]
    generator.tokenizer = types_namespace(decode=lambda tokens, **_: "ab STOP")
    cut = generator._choice([5, 6, 7, 2, 2], [-0.1, -0.2, -0.3, -0.4, -0.5],
                            GenerationParams(stop=("STOP",)))  # fmt: skip
    assert cut.token_ids == [5, 6, 7] and cut.text == "ab "


def test_every_way_of_generating_records_the_end_token_it_sampled(generator: Generator) -> None:
    chat = [{"role": "user", "content": "Say only the word yes."}]
    params = GenerationParams(max_tokens=24)
    sampled = GenerationParams(max_tokens=24, n=2, temperature=0.5, seed=1)
    batched = collect(batcher := ContinuousBatcher(generator, max_rows=2), [Request(chat, params)])
    batcher.drain()
    answers = {
        "continuous": batched[0].choices[0],
        "batch": generator.generate_batch([chat], params)[0].choices[0],
        "alone": generator.generate(chat, params).choices[0],
        "sampled": generator.generate(chat, sampled).choices[0],
    }
    for way, choice in answers.items():
        assert choice.finish_reason == "stop", way
        assert choice.token_ids[-1] in generator.eos_ids, way
        assert choice.token_ids.count(choice.token_ids[-1]) == 1, way  # no padding after it
        assert len(choice.logprobs) == len(choice.token_ids), way
        assert -30 < choice.logprobs[-1] <= 0, way
        assert choice.text == generator.tokenizer.decode(
            choice.token_ids[:-1], skip_special_tokens=True
        ), way
    assert answers["continuous"].token_ids == answers["batch"].token_ids


def types_namespace(**fields: Any) -> Any:
    import types

    return types.SimpleNamespace(**fields)


def test_a_request_whose_scores_would_take_the_models_memory_is_refused(
    generator: Generator,
) -> None:
    """Several choices (or a seeded sample) are generated on their own, keeping every
    step's scores over the vocabulary for the logprobs: n=8 with a long answer held
    gigabytes, enough for one request to end the pod and every version on it."""
    from spanmill.serving.generation import SOLO_SCORES_BYTES
    from spanmill.serving.protocol import ProtocolError

    chat = conversations(1)[0]
    answer = min(4096, generator.max_tokens_limit)
    vocabulary = generator.model.config.vocab_size
    assert 8 * answer * vocabulary * 16 > SOLO_SCORES_BYTES
    with pytest.raises(ProtocolError, match=r"N 8 with MAX_TOKENS \d+ would hold"):
        generator.check_fits(chat, GenerationParams(n=8, max_tokens=4096, temperature=0.8))
    assert generator.check_fits(chat, GenerationParams(n=2, max_tokens=64, temperature=0.8)) > 0
    # One choice, unseeded: batched, no scores kept; as long as the context allows.
    assert generator.check_fits(chat, GenerationParams(max_tokens=answer // 2)) > 0
