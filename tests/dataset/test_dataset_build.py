"""Dataset building on hand-built traces: each credit rule and mode, and the hard cases."""

from __future__ import annotations

import json
from time import time_ns

import pytest
from dataset_traces import SYSTEM, episode, genai, llm, reward_event, table, tid, tool
from hypothesis import given, settings
from hypothesis import strategies as st

from spanmill import semconv as sc
from spanmill.dataset.build import build, split_of
from spanmill.dataset.episodes import DatasetError, LLMCall, one_record_per_call
from spanmill.dataset.spec import DatasetSpec


def rewards_by_answer(spec: DatasetSpec, *spans) -> dict[str, float]:  # type: ignore[no-untyped-def]
    built = build(spec.model_copy(update={"eval_fraction": 0.0}), table(*spans))
    return {row["completion"][0]["content"]: row["reward"] for row in built.train}


def two_call_episode(trace: int = 1, *, linked: float | None = None):  # type: ignore[no-untyped-def]
    first = llm(trace, 100, answer={"tool": "calculator", "expression": "6*7"}, response_id="r1")
    second = llm(trace, 300, answer="42", response_id="r2")
    events = [reward_event("success", 1.0, primary=True)]
    if linked is not None:
        events.append(reward_event("success", linked, response_id="r1"))
    return [episode(trace, 50, *events), first, tool(trace, 200), second]


def test_episode_credit_gives_every_call_the_episode_reward() -> None:
    got = rewards_by_answer(DatasetSpec(credit="episode"), *two_call_episode())
    assert got == {'{"tool": "calculator", "expression": "6*7"}': 1.0, "42": 1.0}


def test_per_call_credit_uses_the_linked_reward() -> None:
    got = rewards_by_answer(DatasetSpec(credit="per_call"), *two_call_episode(linked=0.25))
    assert got == {'{"tool": "calculator", "expression": "6*7"}': 0.25, "42": 1.0}


def test_several_calls_scores_are_theirs_and_never_the_episodes() -> None:
    """Two calls each scored (an evaluator's ok on one, not ok on the other) and no
    episode reward: the last score seen was every call's episode reward, under episode
    and discounted credit alike. Now only a score that is the episode's one is."""
    trace = 1
    first = llm(trace, 100, answer={"tool": "calculator", "expression": "6*7"}, response_id="r1")
    second = llm(trace, 300, answer="42", response_id="r2")
    scores = [reward_event("ok", 1.0, primary=True, response_id="r1"),
              reward_event("ok", 0.0, primary=True, response_id="r2")]  # fmt: skip
    spans = [episode(trace, 50, *scores), first, tool(trace, 200), second]
    for rule in ("episode", "discounted"):
        assert rewards_by_answer(DatasetSpec(credit=rule), *spans) == {}
    assert rewards_by_answer(DatasetSpec(credit="per_call"), *spans) == {
        '{"tool": "calculator", "expression": "6*7"}': 1.0, "42": 0.0}  # fmt: skip
    # One score in the episode is the episode's (as before), and the episode's own
    # reward is never replaced by a call's.
    one = [episode(trace, 50, scores[0]), first, tool(trace, 200), second]
    assert set(rewards_by_answer(DatasetSpec(credit="episode"), *one).values()) == {1.0}
    both = two_call_episode(linked=0.25)
    assert set(rewards_by_answer(DatasetSpec(credit="episode"), *both).values()) == {1.0}


def test_the_primary_reward_is_chosen_among_the_kept_calls_rewards() -> None:
    """A window shared by two agents: the busier one's primary reward (thumbs) was the
    support agent's too, which also sends thumbs, unmarked, beside its own primary
    (resolved): its samples were trained on thumbs."""
    support = [
        episode(1, 50, reward_event("resolved", 1.0, primary=True),
                reward_event("thumbs", 0.0)),
        llm(1, 100, answer="fixed", service="support-agent"),
    ]  # fmt: skip
    busy = []
    for trace in range(2, 6):
        busy.append(episode(trace, 50, reward_event("thumbs", 1.0, primary=True)))
        busy.append(llm(trace, 100, answer=f"busy {trace}"))
    built = build(DatasetSpec(service="support-agent", eval_fraction=0.0), table(*support, *busy))
    assert built.reward_name == "resolved"
    assert [row["reward"] for row in built.train] == [1.0]


def test_discounted_credit() -> None:
    got = rewards_by_answer(DatasetSpec(credit="discounted", discount=0.5), *two_call_episode())
    assert got == {'{"tool": "calculator", "expression": "6*7"}': 0.5, "42": 1.0}


def test_a_call_recorded_by_the_client_and_the_gateway_is_one_sample() -> None:
    client = llm(1, 100, answer="42", response_id="r1", service="support-agent")
    served = llm(1, 101, answer="42!", response_id="r1")
    served.attributes[sc.SPANMILL_COMPLETION_TOKEN_IDS] = [1, 2]
    spans = [episode(1, 50, reward_event("success", 1.0, primary=True)), client, served]
    built = build(DatasetSpec(eval_fraction=0.0, dedupe=False), table(*spans))
    assert [row["completion"][0]["content"] for row in built.train] == ["42!"]
    assert built.counts["llm_calls"] == 1
    # Either order: the record with token ids (the gateway's) is the one kept.
    built = build(DatasetSpec(eval_fraction=0.0, dedupe=False), table(*reversed(spans)))
    assert [row["completion"][0]["content"] for row in built.train] == ["42!"]


def test_rl_rollout_calls_never_become_production_samples() -> None:
    spans = two_call_episode()
    production = build(DatasetSpec(eval_fraction=0.0), table(*spans))
    for span in spans[1::2]:  # the two calls, as the trainer's own gateway marks them
        span.attributes[sc.SPANMILL_TRAFFIC] = sc.TRAFFIC_TRAINING
    rollouts = build(DatasetSpec(eval_fraction=0.0), table(*spans))
    assert len(production.train) == 2 and production.counts["training_traffic"] == 0
    assert rollouts.train == [] and rollouts.counts["training_traffic"] == 2


def test_out_of_order_spans_are_put_in_time_order() -> None:
    spans = two_call_episode()
    got = rewards_by_answer(DatasetSpec(credit="discounted", discount=0.5), *reversed(spans))
    assert got["42"] == 1.0 and got['{"tool": "calculator", "expression": "6*7"}'] == 0.5


def test_missing_rewards_and_orphans() -> None:
    spans = [
        *two_call_episode(1),
        llm(2, 500, answer="no reward anywhere", task="t2"),  # an episode without reward
        tool(3, 600),  # a tool span with no episode around it
        # A reward linked to a response outside the window judges its episode.
        episode(4, 700, reward_event("success", 0.5, primary=True, response_id="gone"), task="t4"),
        llm(4, 710, answer="orphan-linked", task="t4"),
        llm(5, 800, answer="failed", error=True, task="t5"),
    ]
    built = build(DatasetSpec(eval_fraction=0.0), table(*spans))
    answers = {row["completion"][0]["content"]: row["reward"] for row in built.train}
    assert answers["orphan-linked"] == 0.5
    assert "no reward anywhere" not in answers and "failed" not in answers
    assert built.counts["llm_calls"] == 5
    assert built.counts["with_completion"] == 4
    assert built.counts["with_reward"] == 3


def test_several_rewards_one_primary() -> None:
    spans = [
        episode(1, 0, reward_event("success", 1.0, primary=True), reward_event("brevity", 0.2)),
        llm(1, 10, answer="42"),
    ]
    assert build(DatasetSpec(eval_fraction=0), table(*spans)).reward_name == "success"
    chosen = build(DatasetSpec(eval_fraction=0, reward="brevity"), table(*spans))
    assert chosen.train[0]["reward"] == pytest.approx(0.2)
    unmarked = [
        episode(1, 0, reward_event("a", 1.0), reward_event("b", 0.0)),
        llm(1, 10, answer="x"),
    ]
    with pytest.raises(DatasetError, match="none is marked primary"):
        build(DatasetSpec(), table(*unmarked))
    with pytest.raises(DatasetError, match="no reward named 'nope'"):
        build(DatasetSpec(reward="nope"), table(*spans))


def test_tool_call_completion_is_rendered_as_the_model_writes_it() -> None:
    built = build(DatasetSpec(eval_fraction=0), table(*two_call_episode()))
    call = next(r for r in built.train if "tool" in r["completion"][0]["content"])
    assert json.loads(call["completion"][0]["content"]) == {
        "tool": "calculator",
        "expression": "6*7",
    }
    assert call["prompt"][0] == SYSTEM
    assert call["model_version"] == "1" and call["task_id"] == "t1"


def test_context_distillation_drops_example_turns() -> None:
    few_shot = [
        SYSTEM,
        {"role": "user", "content": "What is 2+2?", sc.SPANMILL_MESSAGE_EXAMPLE: True},
        {"role": "assistant", "content": '{"tool": "calculator", "expression": "2+2"}',
         sc.SPANMILL_MESSAGE_EXAMPLE: True},
        {"role": "user", "content": "What is 6*7?"},
    ]  # fmt: skip
    spans = [episode(1, 0, reward_event("success", 1.0, primary=True)),
             llm(1, 10, answer="42", prompt=few_shot, input_tokens=900)]  # fmt: skip
    kept = build(DatasetSpec(eval_fraction=0), table(*spans)).train[0]
    assert len(kept["prompt"]) == 4
    distilled = build(DatasetSpec(eval_fraction=0, drop_examples=True), table(*spans)).train[0]
    assert distilled["prompt"] == [SYSTEM, {"role": "user", "content": "What is 6*7?"}]
    # The token limit uses the recorded count, or an estimate for a re-targeted prompt.
    assert build(DatasetSpec(max_tokens=100), table(*spans)).counts["within_max_tokens"] == 0
    assert build(DatasetSpec(max_tokens=100, drop_examples=True),
                 table(*spans)).counts["within_max_tokens"] == 1  # fmt: skip


def test_sft_threshold_weights_dedupe_and_version_filter() -> None:
    spans = []
    for trace, (value, answer, version) in enumerate(
        [(1.0, "42", "1"), (0.0, "41", "1"), (1.0, "42", "1"), (0.5, "40", "2")], start=1
    ):
        spans += [episode(trace, trace * 100, reward_event("success", value, primary=True)),
                  llm(trace, trace * 100 + 1, answer=answer, version=version)]  # fmt: skip
    base = DatasetSpec(eval_fraction=0)
    assert build(base, table(*spans)).counts["deduplicated"] == 3  # the second "42" goes
    assert build(base.model_copy(update={"dedupe": False}), table(*spans)).counts["train"] == 4
    passing = build(base.model_copy(update={"min_reward": 1.0}), table(*spans))
    assert [r["completion"][0]["content"] for r in passing.train] == ["42"]
    failing = build(base.model_copy(update={"max_reward": 0.0}), table(*spans))
    assert [r["completion"][0]["content"] for r in failing.train] == ["41"]
    with pytest.raises(ValueError, match="above max_reward"):
        DatasetSpec(min_reward=1.0, max_reward=0.0)
    weighted = build(base.model_copy(update={"sft_weighting": "reward"}), table(*spans))
    assert sorted(r["weight"] for r in weighted.train) == [0.5, 1.0]  # zero weight dropped
    v2 = build(base.model_copy(update={"model_version": "2"}), table(*spans))
    assert [r["model_version"] for r in v2.train] == ["2"]


def test_preference_pairs_attempts_at_one_task() -> None:
    spans = []
    attempts = [
        ("a", 1.0, "42"),
        ("a", 0.0, "41"),
        ("a", 0.0, "40"),
        ("b", 1.0, "7"),
        ("b", 1.0, "8"),
    ]
    for trace, (task, value, answer) in enumerate(attempts, start=1):
        reward = reward_event("success", value, primary=True)
        spans += [episode(trace, trace * 10, reward, task=task),
                  llm(trace, trace * 10 + 1, answer=answer, task=task)]  # fmt: skip
    built = build(DatasetSpec(mode="preference", eval_fraction=0), table(*spans))
    assert len(built.train) == 1  # task b's attempts tie: no pair
    pair = built.train[0]
    assert pair["chosen"][0]["content"] == "42" and pair["rejected"][0]["content"] in {"41", "40"}
    assert (pair["chosen_reward"], pair["rejected_reward"]) == (1.0, 0.0)
    assert built.counts["task_groups"] == 2 and built.counts["pairs"] == 1


def test_copies_rewarded_apart_count_by_their_mean() -> None:
    """The same answer to the same task rewarded 0 once and 1 once, beside another
    answer rewarded 0: the first copy alone counted, so the pair the copies made was
    never built, and min_reward dropped the answer that passed once."""
    spans = []
    for trace, (value, answer) in enumerate([(0.0, "X"), (1.0, "X"), (0.0, "Y")], start=1):
        reward = reward_event("success", value, primary=True)
        spans += [episode(trace, trace * 10, reward, task="a"),
                  llm(trace, trace * 10 + 1, answer=answer, task="a")]  # fmt: skip
    paired = build(DatasetSpec(mode="preference", eval_fraction=0), table(*spans))
    (pair,) = paired.train
    assert (pair["chosen"][0]["content"], pair["rejected"][0]["content"]) == ("X", "Y")
    assert (pair["chosen_reward"], pair["rejected_reward"]) == (0.5, 0.0)
    assert paired.counts["duplicates_rewarded_apart"] == 1
    kept = build(DatasetSpec(min_reward=0.5, eval_fraction=0), table(*spans))
    assert [(r["completion"][0]["content"], r["reward"]) for r in kept.train] == [("X", 0.5)]


def test_a_conversations_turns_stay_in_one_split() -> None:
    """One trace a turn, no task id: split by episode, a conversation's second turn
    (whose prompt holds the first turn's question and answer) landed in eval while the
    first trained, or the other way round."""
    spans = []
    for conversation in range(20):
        first, second = 2 * conversation + 1, 2 * conversation + 2
        question = {"role": "user", "content": f"q{conversation}"}
        answer = {"role": "assistant", "content": f"a{conversation}"}
        for trace, prompt, reply in ((first, [SYSTEM, question], f"a{conversation}"),
                                     (second, [SYSTEM, question, answer,
                                               {"role": "user", "content": "and?"}],
                                      f"b{conversation}")):  # fmt: skip
            call = llm(trace, trace * 10 + 1, answer=reply, prompt=prompt, task=None)
            call.attributes[sc.GEN_AI_CONVERSATION_ID] = f"c{conversation}"
            spans += [episode(trace, trace * 10, reward_event("r", 1.0, primary=True)), call]
    for span in spans:
        span.attributes.pop(sc.SPANMILL_TASK_ID, None)
    built = build(DatasetSpec(eval_fraction=0.3, seed=1), table(*spans))
    held = {r["completion"][0]["content"][1:] for r in built.eval}
    trained = {r["completion"][0]["content"][1:] for r in built.train}
    assert held and trained and not held & trained
    assert len(built.train) + len(built.eval) == 40


def test_a_prompt_asked_in_training_is_not_held_out() -> None:
    """Production traffic asks one question many times, in different tasks or none: a
    prompt in both splits measured recall of a training answer as held-out success.
    A held-out row whose prompt a training row holds leaves the held-out split,
    counted; its group's other rows stay, and no task is in both splits."""
    spans = []

    def attempt(task: str, question: str) -> None:
        trace = len(spans) // 2 + 1
        prompt = [SYSTEM, {"role": "user", "content": question}]
        spans.extend([
            episode(trace, trace * 10, reward_event("r", 1.0, primary=True), task=task),
            llm(trace, trace * 10 + 1, answer=f"a{trace}", prompt=prompt, task=task),
        ])  # fmt: skip

    for question in range(30):
        for n in range(3):  # three tasks ask each question, each answered apart
            attempt(f"task-{question}-{n}", f"what is {question}?")
        attempt(f"own-{question}", f"a question only task {question} asks")
    built = build(DatasetSpec(eval_fraction=0.4, seed=3), table(*spans))

    def questions(rows: list[dict]) -> set[str]:
        return {r["prompt"][-1]["content"] for r in rows}

    assert questions(built.train) and questions(built.eval)
    assert not questions(built.train) & questions(built.eval)
    assert not {r["task_id"] for r in built.train} & {r["task_id"] for r in built.eval}
    assert {f"own-{q}" for q in range(30)} <= {r["task_id"] for r in built.train + built.eval}
    left_out = built.counts["eval_prompts_in_train"]
    assert left_out > 0
    assert len(built.train) + len(built.eval) + left_out == 120


def test_rl_mode_groups_by_task() -> None:
    spans = []
    for trace, (task, value) in enumerate([("a", 1.0), ("a", 0.0), ("b", 0.5)], start=1):
        reward = reward_event("success", value, primary=True)
        spans += [episode(trace, trace * 10, reward, task=task),
                  llm(trace, trace * 10 + 1, answer=f"ans{trace}", task=task)]  # fmt: skip
    built = build(DatasetSpec(mode="rl", eval_fraction=0), table(*spans))
    assert sorted((r["group_id"], r["reward"]) for r in built.train) == [
        ("a", 0.0), ("a", 1.0), ("b", 0.5)]  # fmt: skip


def test_spec_rejects_incoherent_choices() -> None:
    with pytest.raises(ValueError, match="mode 'sft' only"):
        DatasetSpec(mode="rl", sft_weighting="reward")
    with pytest.raises(ValueError, match="discounted"):
        DatasetSpec(discount=0.5)


@settings(max_examples=60, deadline=None)
@given(
    tasks=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=40),
    fraction=st.floats(min_value=0.05, max_value=0.95),
    seed=st.integers(0, 5),
    calls_say_it=st.booleans(),
)
def test_no_task_in_both_splits(
    tasks: list[str], fraction: float, seed: int, calls_say_it: bool
) -> None:
    """``calls_say_it`` False: the task id is on the episode's span alone, as an agent
    with ``sdk.episode(task_id=...)`` records it; its calls are of that task all the same."""
    spans = []
    for trace, task in enumerate(tasks * 2, start=1):  # two attempts at every task
        question = [SYSTEM, {"role": "user", "content": f"question of {task}"}]
        spans += [episode(trace, trace * 10, reward_event("success", 1.0, primary=True), task=task),
                  llm(trace, trace * 10 + 1, answer=f"a{trace}", prompt=question,
                      task=task if calls_say_it else None)]  # fmt: skip
    built = build(DatasetSpec(eval_fraction=fraction, seed=seed), table(*spans))
    train = {r["task_id"] for r in built.train}
    held = {r["task_id"] for r in built.eval}
    assert not train & held
    assert train | held == set(tasks)
    assert all(split_of(t, fraction, seed) == "eval" for t in held)


def test_a_call_keeps_how_it_was_made_for_replay() -> None:
    from spanmill.gateway.llm_span import build_llm_span

    tools = [{"type": "function", "function": {"name": "search_faq", "parameters": {}}}]
    call = build_llm_span(
        trace_id=tid(1), parent_span_id=None, span_id="ef" * 8, start_ns=100, end_ns=200,
        requested_model="calculator", triton_model="calculator", version="1",
        response_id="r1", request_messages=[SYSTEM, {"role": "user", "content": "q?"}],
        params={"temperature": 0.7, "max_tokens": 64, "stop": ["\n"], "tools": tools},
        metadata={sc.SPANMILL_TASK_ID: "t1"},
        choice={"message": {"role": "assistant", "content": "42"}, "finish_reason": "stop",
                "token_ids": [5], "logprobs": [-0.1]},
    )  # fmt: skip
    assert call.attributes[sc.GEN_AI_REQUEST_STOP_SEQUENCES] == ["\n"]
    assert json.loads(call.attributes[sc.GEN_AI_TOOL_DEFINITIONS]) == tools
    spans = [episode(1, 50, reward_event("success", 1.0, primary=True)), call]
    row = build(DatasetSpec(eval_fraction=0.0), table(*spans)).train[0]
    assert json.loads(row["request"]) == {"max_tokens": 64, "stop": ["\n"], "tools": tools}
    # A record without any of them (the reference solutions, a bare client span) has none.
    bare = build(DatasetSpec(eval_fraction=0.0), table(*two_call_episode())).train[0]
    assert bare["request"] is None


def test_a_clients_record_and_the_gateways_of_one_call_are_one_sample() -> None:
    """Within an episode, a record without token ids (a client instrumentation that kept
    no response id) gives way to the gateway's record of the same content, one to one:
    an agent that asked the same thing twice keeps both calls."""

    def call(span: str, answer: str, *, tokens: bool, episode: str = "e1") -> LLMCall:
        return LLMCall(
            trace_id="t", span_id=span, episode_id=episode, start_ns=0, service=None,
            agent=None, model=None, model_version="1" if tokens else None, task_id=None,
            response_id=None, prompt_name=None,
            input_messages=genai([{"role": "user", "content": "q"}]),
            output_messages=genai([{"role": "assistant", "content": answer}]),
            system_instructions=None, input_tokens=None, output_tokens=None,
            completion_token_ids=[1, 2] if tokens else None, failed=False,
        )  # fmt: skip

    calls = [
        call("client-1", "4", tokens=False), call("gateway-1", "4", tokens=True),
        call("client-2", "4", tokens=False), call("gateway-2", "4", tokens=True),
        call("client-3", "5", tokens=False),  # no gateway record of this content
        call("client-4", "4", tokens=False, episode="e2"),  # another episode
    ]  # fmt: skip
    kept = [c.span_id for c in one_record_per_call(calls)]
    assert kept == ["gateway-1", "gateway-2", "client-3", "client-4"]


@pytest.mark.parametrize(
    "instructions",
    [
        # The GenAI conventions' own form: an array of parts.
        [{"type": "text", "content": "You are a support agent."}],
        # The form earlier producers wrote: an array of messages.
        [{"role": "system", "parts": [{"type": "text", "content": "You are a support agent."}]}],
    ],
    ids=["parts", "messages"],
)
def test_system_instructions_reach_the_prompt_in_either_form(instructions: object) -> None:
    """Native GenAI instrumentations write gen_ai.system_instructions as parts: each part
    was read as a message without parts, and the prompt's system turn came out empty."""
    from spanmill.dataset.samples import make_sample

    call = LLMCall(
        trace_id=tid(1), span_id="1" * 16, episode_id=tid(1), start_ns=1, service="s",
        agent="a", model="m", model_version=None, task_id=None, response_id=None,
        prompt_name=None,
        input_messages=json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]),
        output_messages=json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": "Hello."}]}]),
        system_instructions=json.dumps(instructions), input_tokens=None, output_tokens=None,
        completion_token_ids=None, failed=False, request=None,
    )  # fmt: skip
    sample = make_sample(call, 1.0, drop_examples=True)
    assert sample is not None
    assert sample.prompt[0] == {"role": "system", "content": "You are a support agent."}


def test_an_answer_whose_tool_arguments_are_not_an_object_is_left_out_and_counted() -> None:
    """Arguments that are not JSON ("city=Paris", a stream cut off mid-call) were
    rendered as {"tool": ..., "_raw": "city=Paris"}: the model learnt to write a _raw
    argument, and nothing said so."""
    bad = llm(1, 10, answer="x", task="t1")
    part = {"type": "tool_call", "id": "c1", "name": "get_weather", "arguments": "city=Paris"}
    bad.attributes[sc.GEN_AI_OUTPUT_MESSAGES] = json.dumps([{"role": "assistant", "parts": [part]}])
    good = llm(2, 20, answer={"tool": "get_weather", "city": "Paris"}, task="t2")
    spans = [bad, good, episode(1, 0, reward_event("r", 1.0, primary=True), task="t1"),
             episode(2, 0, reward_event("r", 1.0, primary=True), task="t2")]  # fmt: skip
    built = build(DatasetSpec(trusted_producers=("*",)), table(*spans))
    assert built.counts["invalid_tool_arguments"] == 1
    assert built.counts["with_completion"] == 1
    (row,) = built.train + built.eval
    assert "_raw" not in json.dumps(row)


def test_arguments_sent_as_json_text_and_answers_cut_short() -> None:
    """The conventions let a tool call's arguments be the JSON text a model wrote: it was
    encoded again, a JSON string that held no object, and the answer was refused as
    invalid (its prompt history rendered as _raw). And an answer cut at max_tokens
    became a completion: trained on, the model learns to stop mid-answer."""
    as_text = llm(1, 10, answer="x", task="t1")
    part = {"type": "tool_call", "id": "c1", "name": "get_weather",
            "arguments": '{"city": "Paris"}'}  # fmt: skip
    as_text.attributes[sc.GEN_AI_OUTPUT_MESSAGES] = json.dumps(
        [{"role": "assistant", "parts": [part], "finish_reason": "tool_calls"}]
    )
    cut = llm(2, 20, answer="It is sunny in Pa", task="t2")
    cut.attributes[sc.GEN_AI_OUTPUT_MESSAGES] = json.dumps([{"role": "assistant",
        "parts": [{"type": "text", "content": "It is sunny in Pa"}], "finish_reason": "length"}])  # fmt: skip  # noqa: E501
    spans = [as_text, cut, episode(1, 0, reward_event("r", 1.0, primary=True), task="t1"),
             episode(2, 0, reward_event("r", 1.0, primary=True), task="t2")]  # fmt: skip
    built = build(DatasetSpec(trusted_producers=("*",), eval_fraction=0.0), table(*spans))
    assert (built.counts["invalid_tool_arguments"], built.counts["cut_short"]) == (0, 1)
    (row,) = built.train
    assert "_raw" not in row["completion"][0]["content"]
    assert json.loads(row["completion"][0]["content"]) == {"tool": "get_weather", "city": "Paris"}


def test_a_window_before_now_moves_with_each_build() -> None:
    """A recurring run's window was fixed text: it read the same hours, or the whole
    retained store, night after night. "-24h" is resolved when the build is asked for."""
    from datetime import UTC, datetime, timedelta

    spec = DatasetSpec(since="-24h", until="-30m")
    now = datetime.now(UTC)
    since, until = datetime.fromisoformat(str(spec.since)), datetime.fromisoformat(str(spec.until))
    assert abs((now - since) - timedelta(hours=24)) < timedelta(seconds=5)
    assert abs((now - until) - timedelta(minutes=30)) < timedelta(seconds=5)
    assert DatasetSpec(since="-7d").since != "-7d"
    assert DatasetSpec(since="2026-01-01T00:00:00Z").since == "2026-01-01T00:00:00Z"
    # A recent span is inside the last day's window, an old one is not.
    now_ns = time_ns()
    spans = [episode(1, now_ns - 10**9, reward_event("r", 1.0, primary=True)),
             llm(1, now_ns - 10**9, answer="recent"),
             episode(2, now_ns - 3 * 86_400 * 10**9, reward_event("r", 1.0, primary=True)),
             llm(2, now_ns - 3 * 86_400 * 10**9, answer="old")]  # fmt: skip
    built = build(DatasetSpec(since="-24h", eval_fraction=0.0), table(*spans))
    assert [r["completion"][0]["content"] for r in built.train] == ["recent"]


def test_a_prompt_with_an_image_is_left_out_and_counted() -> None:
    """Only text parts were kept: a question about a picture trained the model to
    describe an image it never receives."""
    pictured = llm(1, 10, answer="A cat on a mat.", task="t1")
    pictured.attributes[sc.GEN_AI_INPUT_MESSAGES] = json.dumps([{"role": "user", "parts": [
        {"type": "text", "content": "What is in this picture?"},
        {"type": "blob", "modality": "image", "mime_type": "image/png", "content": "iVBOR"}]}])  # fmt: skip  # noqa: E501
    thinking = llm(2, 20, answer="4", task="t2")
    thinking.attributes[sc.GEN_AI_OUTPUT_MESSAGES] = json.dumps([{"role": "assistant", "parts": [
        {"type": "reasoning", "content": "2 and 2"}, {"type": "text", "content": "4"}]}])  # fmt: skip  # noqa: E501
    spans = [pictured, thinking, episode(1, 0, reward_event("r", 1.0, primary=True), task="t1"),
             episode(2, 0, reward_event("r", 1.0, primary=True), task="t2")]  # fmt: skip
    built = build(DatasetSpec(eval_fraction=0.0), table(*spans))
    assert built.counts["unsupported_parts"] == 1
    assert [r["completion"][0]["content"] for r in built.train] == ["4"]


def test_too_few_training_rows_stop_the_build_and_say_what_each_step_kept() -> None:
    from spanmill.dataset.build import check_trainable

    spans = [s for trace in (1, 2) for s in two_call_episode(trace)]
    spec = DatasetSpec(eval_fraction=0.0)
    built = build(spec, table(*spans))
    assert len(built.train) == 2  # their calls share response ids: two calls in all
    check_trainable(built)  # the default asks one row
    check_trainable(build(spec.model_copy(update={"min_train_rows": 2}), table(*spans)))
    fewer = build(spec.model_copy(update={"min_train_rows": 3}), table(*spans))
    with pytest.raises(DatasetError, match=r"has 2 training rows, fewer than min_train_rows 3 "
                       r"\(.*with_reward=2.*train=2.*\); widen the window"):  # fmt: skip
        check_trainable(fewer)
    with pytest.raises(DatasetError, match="has no training rows"):
        check_trainable(build(spec, table()))
    with pytest.raises(ValueError, match="min_train_rows"):
        DatasetSpec(min_train_rows=0)
