"""The evaluators, one hand-checked case at a time, and how they are found by name."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from spanmill.evaluate.evaluators import (
    EVALUATORS,
    EvaluatorContext,
    EvaluatorError,
    ReferenceEvaluator,
    ReplayItem,
    ToolCallsEvaluator,
    load_evaluator,
    normalise,
)
from spanmill.evaluate.judge import (
    PROMPT_VERSION,
    JudgeEvaluator,
    parse_verdict,
    swap_plan,
)
from spanmill.evaluate.replay import matches, score

CALL = '{"name": "search_faq", "arguments": {"query": "refund policy", "limit": 3}}'
PROMPT = [{"role": "user", "content": "How do I get a refund?"}]


def item(reference: str, reward: float | None = 1.0, item_id: str = "i") -> ReplayItem:
    return ReplayItem(item_id, PROMPT, reference, reward)


@pytest.mark.parametrize(
    ("answer", "name", "name_args"),
    [
        # The same call: identical text.
        (CALL, 1.0, 1.0),
        # Key order and white space differ; the parsed arguments are equal.
        ('{"arguments":{"limit":3,  "query":"refund policy"},\n "name":"search_faq"}', 1.0, 1.0),
        # The other accepted form, {"tool": NAME, ...arguments}, inside a code fence.
        ('```json\n{"tool": "search_faq", "limit": 3, "query": "refund policy"}\n```', 1.0, 1.0),
        # 3 and 3.0 are one JSON number.
        ('{"name": "search_faq", "arguments": {"query": "refund policy", "limit": 3.0}}', 1, 1),
        # The right function, another argument value.
        ('{"name": "search_faq", "arguments": {"query": "refunds", "limit": 3}}', 1.0, 0.0),
        # The right function, an argument missing.
        ('{"name": "search_faq", "arguments": {"query": "refund policy"}}', 1.0, 0.0),
        # Another function with the same arguments.
        ('{"name": "open_ticket", "arguments": {"query": "refund policy", "limit": 3}}', 0, 0),
        # Prose, and a call that is not valid JSON.
        ("You can ask for a refund within 30 days.", 0.0, 0.0),
        ('{"name": "search_faq", "arguments": {"query": "refund policy",}}', 0.0, 0.0),
    ],
)
def test_tool_calls_compare_names_and_parsed_arguments(
    answer: str, name: float, name_args: float
) -> None:
    found = ToolCallsEvaluator().score_one(item(CALL), answer)
    assert found.values == {"name": name, "name_args": name_args}, found.explanation


def test_tool_calls_apply_only_to_a_logged_call_that_earned_a_reward() -> None:
    evaluator = ToolCallsEvaluator()
    assert evaluator.score_one(item("Within 30 days."), CALL).values == {}
    assert evaluator.score_one(item(CALL, reward=0.0), CALL).values == {}
    assert evaluator.score_one(item(CALL, reward=None), CALL).values["name_args"] == 1.0


@pytest.mark.parametrize(
    ("answer", "exact", "normalised"),
    [
        ("Within 30 days.", 1.0, 1.0),
        ("  Within 30 days.\n", 1.0, 1.0),  # surrounding white space is not part of an answer
        ("within   30 DAYS", 0.0, 1.0),  # case, inner runs of spaces, the final full stop
        ("Within 30 days!", 0.0, 1.0),
        ("Within 31 days.", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_reference_matches_exactly_or_after_normalising(
    answer: str, exact: float, normalised: float
) -> None:
    found = ReferenceEvaluator().score_one(item("Within 30 days."), answer)
    assert found.values == {"exact": exact, "normalised": normalised}, found.explanation


def test_reference_applies_only_to_rewarded_text_answers() -> None:
    evaluator = ReferenceEvaluator()
    assert evaluator.score_one(item(CALL), CALL).values == {}
    assert evaluator.score_one(item("No.", reward=0.0), "No.").values == {}
    assert evaluator.score_one(item("No.", reward=None), "No.").values["exact"] == 1.0


def test_a_task_plugin_reads_answers_its_own_way() -> None:
    from spanmill.tasks import get_task

    plain = ReferenceEvaluator()
    calculator = ReferenceEvaluator(EvaluatorContext(task=get_task("calculator")))
    assert plain.score_one(item("39"), "The answer is 39.").values["normalised"] == 0.0
    assert calculator.score_one(item("39"), "The answer is 39.").values == {
        "exact": 0.0,
        "normalised": 1.0,
    }
    assert calculator.score_one(item("39"), "The answer is 40.").values["normalised"] == 0.0


def test_normalise_folds_case_width_and_space() -> None:
    full_width = "\uff21\uff22\uff23"  # ABC in full-width forms
    assert normalise(f"  {full_width}\t def. ") == "abc def"


def test_the_format_of_a_replayed_answer_follows_the_logged_one() -> None:
    assert matches(item(CALL), CALL) == (True, True)
    assert matches(item(CALL), '{"name": "search_faq", "arguments": {}}') == (True, False)
    assert matches(item(CALL), "prose") == (False, False)
    assert matches(item("Within 30 days."), CALL) == (False, False)
    assert matches(item("Within 30 days."), "within 30 days") == (True, True)


def test_built_in_evaluators_are_found_through_entry_points() -> None:
    assert {"tool_calls", "reference", "judge"} <= set(EVALUATORS)
    context = EvaluatorContext()
    assert isinstance(load_evaluator("tool_calls", context), ToolCallsEvaluator)
    with pytest.raises(EvaluatorError, match=r"no evaluator named 'bleu'.*tool_calls"):
        load_evaluator("bleu", context)
    # The judge names the settings it misses.
    with pytest.raises(EvaluatorError, match="SPANMILL_EVAL_JUDGE_URL"):
        load_evaluator("judge", context)


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [("A", "A"), (" b.", "B"), ("Tie", "TIE"), ("Answer B is better", "B"), ("Neither", None),
     # The article is no verdict: these read as A before.
     ("It's a tie.", "TIE"), ("Neither is better, a tie", "TIE"),
     ("I think a better one is B", "B")],
)  # fmt: skip
def test_the_judges_verdict_is_read_from_its_reply(reply: str, verdict: str | None) -> None:
    assert parse_verdict(reply) == verdict


def test_exactly_half_the_pairs_are_shown_in_swapped_order() -> None:
    for n in (1, 2, 7, 10):
        plan = swap_plan(n, seed=3)
        assert len(plan) == n and sum(plan) == n // 2
    assert swap_plan(10, seed=3) == swap_plan(10, seed=3)
    assert swap_plan(10, seed=3) != swap_plan(10, seed=4)


def judge_endpoint(answer: object) -> tuple[httpx.MockTransport, list[dict[str, object]]]:
    """An OpenAI-compatible chat endpoint whose reply ``answer(messages)`` decides."""
    seen: list[dict[str, object]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        assert request.headers["authorization"] == "Bearer judge-key"
        body = json.loads(request.content)
        seen.append(body)
        content = answer(body["messages"])  # type: ignore[operator]
        return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})

    return httpx.MockTransport(handle), seen


def judge(transport: httpx.MockTransport) -> JudgeEvaluator:
    context = EvaluatorContext(
        judge_url="http://judge.test/v1", judge_model="m", judge_api_key="judge-key", seed=1
    )
    return JudgeEvaluator(context, transport=transport)


def test_a_judge_that_always_prefers_the_first_answer_cancels_out() -> None:
    transport, seen = judge_endpoint(lambda _: "A")
    items = [item(CALL, item_id=str(i)) for i in range(10)]
    answers = {"champion": ["x"] * 10, "challenger": ["y"] * 10}
    scored = judge(transport).score(items, answers)
    won = [s.values["preference"] for s in scored["challenger"]]
    assert sorted(won) == [0.0] * 5 + [1.0] * 5  # wins exactly where it was shown first
    assert [s.values["preference"] for s in scored["champion"]] == [1 - w for w in won]
    assert len(seen) == 10 and all(body["temperature"] == 0.0 for body in seen)


def test_a_judge_that_knows_the_better_answer_finds_it_in_either_order() -> None:
    def pick(messages: list[dict[str, str]]) -> str:
        text = messages[-1]["content"]
        a = text.split("Answer A:\n")[1].split("\n\nAnswer B:")[0]
        return "A" if a == "good" else "B"

    transport, _ = judge_endpoint(pick)
    items = [item(CALL, item_id=str(i)) for i in range(6)]
    scored = judge(transport).score(items, {"champion": ["bad"] * 6, "challenger": ["good"] * 6})
    assert [s.values["preference"] for s in scored["challenger"]] == [1.0] * 6
    assert all("judge: " in s.explanation for s in scored["challenger"])


def test_an_unreadable_verdict_measures_nothing_and_says_so() -> None:
    """Read as a tie, a judge that answers nothing readable (a wrong model, a prompt it
    ignores) made every item "measured": the gate's min_items was met by equality the
    judge never said. Now such items are not measured, and a gate on the preference
    refuses for want of items."""
    from spanmill.evaluate import GatePolicy, Interval, Summary, decide
    from spanmill.evaluate.scoring import Outcome

    replies = iter(["I cannot decide."] * 9 + ["TIE"])
    transport, _ = judge_endpoint(lambda _: next(replies))
    items = [item(CALL, item_id=str(i)) for i in range(10)]
    scored = judge(transport).score(items, {"champion": ["a"] * 10, "challenger": ["b"] * 10})
    unreadable = [s for s in scored["challenger"] if "no verdict" in s.explanation]
    assert len(unreadable) == 9 and all(s.values == {} for s in unreadable)
    assert [s.values for s in scored["champion"] if s.values] == [{"preference": 0.5}]

    def summary(role: str) -> Summary:
        scores = [{f"judge.{k}": v for k, v in s.values.items()} for s in scored[role]]
        return Summary.of([Outcome(str(i), 1.0, True, True, 3, 1, scores=v)
                           for i, v in enumerate(scores)])  # fmt: skip

    challenger, champion = summary("challenger"), summary("champion")
    assert challenger.measured("judge.preference") == 1
    gate = GatePolicy(suite="replay", metric="judge.preference", min_items=5)
    decision = decide(challenger, champion, Interval(0.0, 0.0, 0.0, 0.95), gate)
    assert not decision.promote
    assert any("measured on 1 item" in reason for reason in decision.reasons)


def test_a_failing_judge_endpoint_is_an_error_that_names_it() -> None:
    transport = httpx.MockTransport(lambda _: httpx.Response(401, text="bad key"))
    with pytest.raises(EvaluatorError, match=r"judge at http://judge.test/v1 answered 401"):
        judge(transport).score([item(CALL)], {"champion": ["a"], "challenger": ["b"]})


@pytest.mark.parametrize(
    "reply",
    [httpx.Response(200, text="<html>proxy error</html>"), httpx.Response(200, json={"error": "x"}),
     httpx.Response(200, json={"choices": []}), httpx.Response(200, json=["a"])],
)  # fmt: skip
def test_a_judge_that_answers_200_with_no_completion_is_an_error_that_names_it(
    reply: httpx.Response,
) -> None:
    transport = httpx.MockTransport(lambda _: reply)
    with pytest.raises(EvaluatorError, match=r"judge at http://judge.test/v1 answered 200 but"):
        judge(transport).score([item(CALL)], {"champion": ["a"], "challenger": ["b"]})


def test_the_judge_describes_its_versioned_prompt() -> None:
    transport, _ = judge_endpoint(lambda _: "A")
    described = judge(transport).describe()
    assert described["prompt_version"] == PROMPT_VERSION
    assert "{conversation}" in described["user_template"]
    assert "judge-key" not in json.dumps(described)


def test_replay_scores_carry_every_applicable_metric() -> None:
    items = [item(CALL, item_id="call"), item("Within 30 days.", item_id="text")]
    answers = {"champion": ["prose", "within 30 days"], "challenger": [CALL, "No idea."]}
    tokens = {"champion": [3, 4], "challenger": [20, 2]}
    outcomes = score(items, answers, tokens, [ToolCallsEvaluator(), ReferenceEvaluator()])
    champion, challenger = outcomes["champion"], outcomes["challenger"]
    assert champion[0].scores == {"tool_calls.name": 0.0, "tool_calls.name_args": 0.0}
    assert challenger[0].scores == {"tool_calls.name": 1.0, "tool_calls.name_args": 1.0}
    assert champion[1].scores == {"reference.exact": 0.0, "reference.normalised": 1.0}
    assert [o.success for o in champion] == [False, True]
    assert [o.success for o in challenger] == [True, False]
    assert [o.tokens for o in challenger] == [20, 2]


def test_replay_items_carry_the_eval_splits_rewards_and_lineage(tmp_path: Path) -> None:
    from spanmill.evaluate.replay import replay_items
    from spanmill.tasks import get_task
    from spanmill.train import write_reference_dataset
    from spanmill.train.data import load_training_data

    folder = write_reference_dataset(get_task("calculator"), tmp_path, n_train=2, n_eval=2)
    data = load_training_data(folder)
    assert data.eval is not None
    rows = pq.read_table(folder / "eval.parquet").to_pylist()
    items = replay_items(data, 100)
    assert [i.item_id for i in items] == [r["sample_id"] for r in rows]
    assert [i.reward for i in items] == [1.0] * len(rows)
    assert [i.reference for i in items] == [r["completion"][-1]["content"] for r in rows]
    assert len(replay_items(data, 1)) == 1


NOT_CALLABLE = object()


def test_a_broken_evaluator_plugin_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    from spanmill import plugins
    from spanmill.evaluate import evaluators

    found = [
        EntryPoint("constant", f"{__name__}:NOT_CALLABLE", evaluators.GROUP),
        EntryPoint("gone", "spanmill_no_such_module:Evaluator", evaluators.GROUP),
    ]
    monkeypatch.setattr(plugins, "entry_points", lambda group: found)
    fresh = plugins.Plugins(evaluators.GROUP, "evaluator", evaluators._factory, EvaluatorError)
    monkeypatch.setattr(evaluators, "EVALUATORS", fresh)
    with pytest.raises(EvaluatorError, match=r"'constant' names .* cannot be called"):
        load_evaluator("constant", EvaluatorContext())
    with pytest.raises(EvaluatorError, match=r"'gone'.*ModuleNotFoundError.*constant, gone"):
        load_evaluator("gone", EvaluatorContext())


def test_the_gates_auto_choices_follow_what_can_decide() -> None:
    from spanmill.evaluate import GatePolicy
    from spanmill.evaluate.run import _metric, _policy
    from spanmill.evaluate.scoring import Outcome

    # An evaluator's metric is only the replay's, whatever tasks there are.
    assert _policy(GatePolicy(metric="tool_calls.name"), has_tasks=True).suite == "replay"
    assert _policy(GatePolicy(), has_tasks=True).suite == "tasks"
    assert _policy(GatePolicy(), has_tasks=False).suite == "replay"
    # An agent that only answers in prose: no item has a tool-call metric, so auto takes
    # the next evaluator's headline that some item has.
    prose = [Outcome("a", 1.0, True, True, 3, 1, scores={"reference.normalised": 1.0})]
    outcomes = {"champion": {"replay": prose}, "challenger": {"replay": prose}}
    evaluators = [ToolCallsEvaluator(), ReferenceEvaluator()]
    replay = GatePolicy(suite="replay")
    assert _metric(replay, evaluators, outcomes).metric == "reference.normalised"
    assert _metric(replay, [ToolCallsEvaluator()], outcomes).metric == "success_rate"
    assert _metric(GatePolicy(suite="replay", metric="tool_calls.name"), evaluators,
                   outcomes).metric == "tool_calls.name"  # fmt: skip
