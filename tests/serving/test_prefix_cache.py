"""Prompt prefixes computed once: the cache's bookkeeping, and SmolLM2 answering the
same with it as without it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from spanmill.evaluate.play import play_episodes
from spanmill.serving.generation import Generator
from spanmill.serving.prefix_cache import PrefixCache
from spanmill.serving.protocol import GenerationParams
from spanmill.tasks import get_task

# One layer of keys and values for n tokens: (heads, tokens, dim), 4 bytes a number.
HEADS, DIM = 2, 4
BYTES_PER_TOKEN = 2 * HEADS * DIM * 4


def layer(tokens: list[int]) -> list[torch.Tensor]:
    # Each token's vectors hold its id, so a test can see which token they belong to.
    ids = torch.tensor(tokens, dtype=torch.float32)
    return [ids.view(1, -1, 1).expand(HEADS, -1, DIM).clone()]


def keep(cache: PrefixCache, tokens: list[int]) -> None:
    cache.store(tokens, layer(tokens), layer(tokens))


def test_the_longest_kept_run_is_found_but_never_the_whole_prompt() -> None:
    cache = PrefixCache(1 << 20)
    keep(cache, [1, 2, 3, 4, 5])
    keep(cache, [1, 2, 9])
    n, entry = cache.lookup([1, 2, 3, 4, 7, 8])
    assert n == 4 and entry is not None
    assert entry.keys[0][0, :n, 0].tolist() == [1, 2, 3, 4]
    assert cache.lookup([1, 2, 9, 9])[0] == 3
    # The prompt itself is kept whole: its last token is still computed, to generate from.
    assert cache.lookup([1, 2, 3, 4, 5])[0] == 4
    assert cache.lookup([7, 1, 2]) == (0, None)
    assert cache.lookup([1]) == (0, None)


def test_an_entry_that_a_longer_one_begins_with_is_dropped() -> None:
    cache = PrefixCache(1 << 20)
    keep(cache, [1, 2, 3])
    keep(cache, [1, 2, 3, 4, 5])  # the next turn of the same conversation
    keep(cache, [1, 2, 8])
    assert len(cache) == 2
    assert cache.stats.stored_bytes == (5 + 3) * BYTES_PER_TOKEN


def test_the_least_recently_used_go_first_when_over_budget() -> None:
    cache = PrefixCache(10 * BYTES_PER_TOKEN)
    keep(cache, [1, 1, 1, 1])
    keep(cache, [2, 2, 2, 2])
    assert cache.lookup([1, 1, 1, 9])[0] == 3  # the 1s were used last
    keep(cache, [3, 3, 3, 3])
    assert cache.stats.evictions == 1
    assert cache.lookup([2, 2, 2, 9]) == (0, None)
    assert cache.lookup([1, 1, 1, 9])[0] == 3
    keep(cache, list(range(100, 111)))  # larger than the whole budget: not kept
    assert cache.lookup(list(range(100, 112))) == (0, None)
    assert cache.stats.stored_bytes <= 10 * BYTES_PER_TOKEN


def test_a_budget_of_zero_keeps_nothing() -> None:
    cache = PrefixCache(0)
    keep(cache, [1, 2, 3])
    assert not cache.enabled
    assert cache.lookup([1, 2, 3, 4]) == (0, None)


@pytest.fixture(scope="module")
def generators(smollm2_dir: Path) -> tuple[Generator, Generator]:
    return (
        Generator(str(smollm2_dir), dtype="float32", prefix_cache_mb=0),
        Generator(str(smollm2_dir), dtype="float32", prefix_cache_mb=256),
    )


def test_multi_turn_episodes_answer_the_same_from_kept_prefixes(
    generators: tuple[Generator, Generator],
) -> None:
    plain, cached = generators
    task = get_task("calculator")
    instances = task.instances("heldout", 6, seed=5)
    # Batches of 4 then 2: the second batch's first turn starts from the system prompt
    # and tools kept from the first, and every later turn from its own last prompt and
    # reply, each row from a run of its own length.
    without = play_episodes(plain, task, instances, prompt_style="few_shot", batch_size=4)
    with_cache = play_episodes(cached, task, instances, prompt_style="few_shot", batch_size=4)
    assert [o.transcript for o in with_cache] == [o.transcript for o in without]
    assert [o.success for o in with_cache] == [o.success for o in without]
    assert any(o.replies > 1 for o in without)  # a later turn was played
    stats = cached.prefix_cache.stats
    assert plain.prefix_cache.stats.reused_tokens == 0
    assert stats.reused_tokens > stats.computed_tokens
    assert len(cached.prefix_cache) == len(instances)


def test_kept_prefixes_give_the_same_tokens_and_logprobs(
    generators: tuple[Generator, Generator],
) -> None:
    plain, cached = generators
    conversation = [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Name a colour."},
    ]
    params = GenerationParams(max_tokens=12)
    first = cached.generate_batch([conversation], params)[0]
    follow_up = [
        *conversation,
        {"role": "assistant", "content": first.choices[0].text},
        {"role": "user", "content": "And another one?"},
    ]
    before = cached.prefix_cache.stats.reused_tokens
    # The follow-up beside a conversation the cache has never seen.
    other = [{"role": "user", "content": "Count to three."}]
    got = cached.generate_batch([follow_up, other], params)
    want = plain.generate_batch([follow_up, other], params)
    assert cached.prefix_cache.stats.reused_tokens - before >= len(first.prompt_token_ids)
    for a, b in zip(got, want, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert a.choices[0].token_ids == b.choices[0].token_ids
        assert a.choices[0].logprobs == pytest.approx(b.choices[0].logprobs, abs=1e-3)


def test_a_generator_over_a_policy_in_training_keeps_nothing(
    generators: tuple[Generator, Generator],
) -> None:
    _, cached = generators
    live = Generator.around(cached.model, cached.tokenizer)
    live.generate_batch([[{"role": "user", "content": "Hi"}]], GenerationParams(max_tokens=2))
    assert not live.prefix_cache.enabled
    assert len(live.prefix_cache) == 0


def test_the_policy_keeps_prefixes_for_one_version_of_its_weights(
    generators: tuple[Generator, Generator],
) -> None:
    from spanmill.gateway.upstream import Target
    from spanmill.train.policy import PolicyServer

    plain, _ = generators
    policy = PolicyServer(plain.model, plain.tokenizer, max_tokens_limit=4)
    messages = [{"role": "user", "content": "What is 12 plus 30? Answer with the number."}]
    params = GenerationParams(max_tokens=2)

    def ask() -> list[int]:
        answer = asyncio.run(policy.generate(Target("policy", "1"), messages, params, None))
        return answer.choices[0].token_ids

    try:
        first = ask()
        kept = policy.generator.prefix_cache
        assert kept.enabled and len(kept) > 0
        assert kept.stats.reused_tokens == 0
        policy.version = "1"  # the same weights: what they computed stays
        assert ask() == first
        assert policy.generator.prefix_cache is kept and kept.stats.reused_tokens > 0
        policy.version = "2"  # new weights: nothing the old ones computed is used
        renewed = policy.generator.prefix_cache
        assert renewed is not kept and renewed.enabled and len(renewed) == 0
        assert ask() == first  # these weights did not change, so neither does the answer
        assert renewed.stats.reused_tokens == 0 and renewed.stats.computed_tokens > 0
    finally:
        asyncio.run(policy.close())


def test_a_call_that_spans_a_new_version_keeps_nothing_for_the_new_weights(
    generators: tuple[Generator, Generator],
) -> None:
    import threading
    import time

    from spanmill.serving.generation import Request
    from spanmill.train.policy import PolicyServer

    plain, _ = generators
    policy = PolicyServer(plain.model, plain.tokenizer, max_tokens_limit=64)
    request = Request(
        [{"role": "user", "content": "Count from 1 to 100, separated by commas."}],
        GenerationParams(max_tokens=64),
    )
    finished = threading.Event()
    answers: list[Any] = []
    try:
        old = policy.generator.prefix_cache
        policy.batcher.submit(request, lambda answer: (answers.append(answer), finished.set()))
        deadline = time.monotonic() + 60
        while len(old) == 0 and time.monotonic() < deadline:  # its prompt computed
            time.sleep(0.005)
        assert len(old) == 1
        policy.version = "2"  # the weights change while it generates
        assert not finished.is_set(), "the call ended before the version changed"
        assert finished.wait(120)
        new = policy.generator.prefix_cache
        assert len(new) == 0  # nothing of the old weights
        # Its prompt was computed, and counted, by the cache it joined under.
        assert new.stats.computed_tokens == 0 and old.stats.computed_tokens > 0
        (entry,) = old._entries.values()  # its prompt and reply, where it began
        assert len(entry.tokens) > 32
        # The answer is the version it began under.
        assert answers[0].model_version == "1"
    finally:
        asyncio.run(policy.close())


def _policy_call(policy: Any, max_tokens: int) -> Any:
    from spanmill.gateway.upstream import Target

    return policy.generate(
        Target(model="policy", version=policy.version),
        [{"role": "user", "content": "Count from 1 to 300, separated by commas."}],
        GenerationParams(max_tokens=max_tokens),
        None,
    )


async def _until(check: Any, timeout_s: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_a_call_whose_caller_gave_up_stops_generating(
    generators: tuple[Generator, Generator],
) -> None:
    """An episode that timed out leaves no call behind to hold the policy's rows."""
    from spanmill.train.policy import PolicyServer

    plain, _ = generators
    policy = PolicyServer(plain.model, plain.tokenizer, max_tokens_limit=256)

    async def scenario() -> int:
        call = asyncio.ensure_future(_policy_call(policy, 200))
        await _until(lambda: policy.batcher.steps >= 4)  # decoding
        call.cancel()  # the gateway's deadline gave up on it
        at_cancel = policy.batcher.steps
        await _until(lambda: policy.batcher.busy == 0)
        return policy.batcher.steps - at_cancel

    try:
        # Without the stop it would decode on to its 200th token.
        assert asyncio.run(scenario()) <= 3
    finally:
        asyncio.run(policy.close())


def test_hold_stops_what_is_generating_and_lets_the_kept_prefixes_go(
    generators: tuple[Generator, Generator],
) -> None:
    """Between a version's rollouts and the update: nothing generates beside the update,
    and the kept keys and values are not held through it."""
    from spanmill.gateway.upstream import UpstreamError
    from spanmill.train.policy import PolicyServer

    plain, _ = generators
    policy = PolicyServer(plain.model, plain.tokenizer, max_tokens_limit=256)
    budget = policy.generator.prefix_cache.budget_bytes
    assert budget > 0

    async def scenario() -> tuple[int, BaseException | None, int]:
        done = await _policy_call(policy, 8)  # kept for the next call
        assert done.model_version == "1"
        kept = len(policy.generator.prefix_cache)
        call = asyncio.ensure_future(_policy_call(policy, 200))
        await _until(lambda: policy.batcher.busy == 1 and policy.batcher.steps >= 12)
        stopped = await asyncio.to_thread(policy.hold)
        error = await asyncio.gather(call, return_exceptions=True)
        return kept, error[0], stopped

    try:
        kept, error, stopped = asyncio.run(scenario())
        assert kept == 1 and stopped == 1
        assert isinstance(error, UpstreamError) and error.status == 503
        assert policy.batcher.busy == 0
        assert len(policy.generator.prefix_cache) == 0
        assert not policy.generator.prefix_cache.enabled  # nothing kept until the next version
        policy.version = "2"
        assert policy.generator.prefix_cache.budget_bytes == budget
        answer = asyncio.run(_policy_call(policy, 4))
        assert answer.model_version == "2"
    finally:
        asyncio.run(policy.close())


def test_the_policy_refuses_what_cannot_fit_and_answers_failures_as_an_upstream(
    generators: tuple[Generator, Generator],
) -> None:
    """As Triton's model does: an oversized prompt is refused at once with the context
    length code, and a generation that fails reaches the gateway as an upstream error
    (answered and recorded), not as an exception of its own."""
    from spanmill.gateway.upstream import Target, UpstreamError
    from spanmill.serving import protocol
    from spanmill.train.policy import PolicyServer

    plain, _ = generators
    policy = PolicyServer(plain.model, plain.tokenizer, max_tokens_limit=64)
    target = Target(model="policy", version="1")
    long = [{"role": "user", "content": "seven " * (policy.generator.context_window + 10)}]
    try:
        with pytest.raises(UpstreamError) as refused:
            asyncio.run(policy.generate(target, long, GenerationParams(max_tokens=8), None))
        assert refused.value.status == 400
        assert refused.value.code == protocol.CONTEXT_LENGTH_EXCEEDED
        assert policy.batcher.steps == 0  # never joined the batch

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("out of memory")

        policy.generator.model.forward = broken  # on the instance, over its class's
        try:
            with pytest.raises(UpstreamError) as failed:
                asyncio.run(_policy_call(policy, 8))
        finally:
            del policy.generator.model.forward
        assert failed.value.status == 500 and "out of memory" in str(failed.value)
    finally:
        asyncio.run(policy.close())
