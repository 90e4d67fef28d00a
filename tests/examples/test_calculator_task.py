"""The calculator task: its problems, its safe evaluator, its prompts and its verifier."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spanmill_examples.calculator import (
    TEMPLATES,
    CalculatorTask,
    ExpressionError,
    evaluate,
    format_number,
    likeness,
    make_instance,
    parse_answer,
    tool_call_content,
)

from spanmill import semconv as sc
from spanmill.tasks import TaskError, ToolError, get_task
from spanmill.tasks.base import extract_tool_call, split_of

TASK = CalculatorTask()


# -- problems ------------------------------------------------------------------------


def test_the_registry_knows_the_calculator() -> None:
    assert isinstance(get_task("calculator"), CalculatorTask)
    with pytest.raises(TaskError, match=r"installed tasks: .*calculator"):
        get_task("spreadsheet")


def test_the_same_seed_gives_the_same_instances() -> None:
    assert TASK.instances("train", 40, seed=3) == TASK.instances("train", 40, seed=3)
    assert TASK.instances("train", 40, seed=3) != TASK.instances("train", 40, seed=4)
    # Asking for more extends the same sequence.
    assert TASK.instances("heldout", 25, seed=1)[:10] == TASK.instances("heldout", 10, seed=1)


def test_instances_are_well_formed_and_distinct() -> None:
    instances = TASK.instances("train", 300, seed=0)
    assert len({instance.id for instance in instances}) == 300
    assert len({instance.data["template"] for instance in instances}) >= 25
    for instance in instances:
        assert "{" not in instance.question
        assert format_number(evaluate(instance.data["expression"])) == instance.answer
        operations = sum(instance.data["expression"].count(op) for op in "+*/") + sum(
            1 for i, ch in enumerate(instance.data["expression"]) if ch == "-" and i > 0
        )
        assert 2 <= operations <= 3, instance.data["expression"]
        assert split_of(instance.id) == "train"
        # Answers are whole numbers or short decimals, never repeating fractions.
        assert Fraction(instance.answer).denominator in (1, 2, 4, 5, 10, 20, 25, 50, 100)


def test_there_are_many_templates_with_unique_ids() -> None:
    assert len(TEMPLATES) >= 30
    assert len({template.id for template in TEMPLATES}) == len(TEMPLATES)


@settings(max_examples=25, deadline=None)
@given(train_seed=st.integers(0, 10**6), heldout_seed=st.integers(0, 10**6))
def test_train_and_heldout_never_share_an_instance(train_seed: int, heldout_seed: int) -> None:
    train = TASK.instances("train", 30, seed=train_seed)
    heldout = TASK.instances("heldout", 30, seed=heldout_seed)
    assert not {i.id for i in train} & {i.id for i in heldout}
    assert {split_of(i.id) for i in train} == {"train"}
    assert {split_of(i.id) for i in heldout} == {"heldout"}


def test_the_same_problem_has_the_same_id_and_split_however_it_was_made() -> None:
    drawn = TASK.instances("heldout", 1, seed=0)[0]
    remade = make_instance(drawn.data["template"], drawn.data["values"])
    assert remade == drawn


def test_bad_requests_for_instances_are_refused() -> None:
    with pytest.raises(TaskError, match="split must be one of train, heldout"):
        TASK.instances("test", 1)  # type: ignore[arg-type]
    with pytest.raises(TaskError, match="must not be negative"):
        TASK.instances("train", -1)
    assert TASK.instances("train", 0) == []


# -- the safe evaluator --------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3 * 4", Fraction(14)),
        ("(2 + 3) * 4", Fraction(20)),
        ("-3 + 5", Fraction(2)),
        ("-(4 - 10)", Fraction(6)),
        ("7 / 2", Fraction(7, 2)),
        ("2.50 * 4 + .5", Fraction(21, 2)),
        ("  (68 + 84 + 70) / 3 ", Fraction(74)),
    ],
)
def test_the_evaluator_computes_exactly(expression: str, value: Fraction) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("x + 1", "names such as 'x' are not allowed"),
        ("__import__('os')", "function calls are not allowed"),
        ("abs(-3)", "function calls are not allowed"),
        ("(1).real", r"attribute access \(.real\) is not allowed"),
        ("2 ** 10", "power '\\*\\*' is not allowed"),
        ("7 // 2", "operator '//' is not allowed"),
        ("7 % 2", "operator '%' is not allowed"),
        ("+3", "unary UAdd is not allowed"),
        ("1e5", "plain decimal numbers"),
        ("0x10", "plain decimal numbers"),
        ("1_000", "plain decimal numbers"),
        ("'a' + 'b'", "is not a number"),
        ("True + 1", "is not a number"),
        ("[1, 2]", "List is not allowed"),
        ("1 if 2 else 3", "IfExp is not allowed"),
        ("", "the expression is empty"),
        ("1 +", "is not an arithmetic expression"),
        ("1 / (2 - 2)", "division by zero"),
        ("9" * 201, "over the limit of 200"),
        ("999999999 * 999999999", "exceeds"),
        ("99999999999999999999", "exceeds"),
    ],
)
def test_the_evaluator_refuses_anything_else(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        evaluate(expression)


def test_the_evaluator_refuses_non_strings() -> None:
    with pytest.raises(ExpressionError, match="must be a string"):
        evaluate(12)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Fraction(42), "42"),
        (Fraction(-3), "-3"),
        (Fraction(25, 2), "12.5"),
        (Fraction(-1, 4), "-0.25"),
        (Fraction(10, 3), "3.333333"),
        (Fraction(2, 3), "0.666667"),
    ],
)
def test_numbers_are_formatted_as_plain_decimals(value: Fraction, text: str) -> None:
    assert format_number(value) == text


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        (" 42.\n", Fraction(42)),
        ("The answer is 42.", Fraction(42)),
        ("$8.75", Fraction(35, 4)),
        ("It costs 1,250 dollars", Fraction(1250)),
        ("-7", Fraction(-7)),
        ("12.50", Fraction(25, 2)),
        ("3 boxes of 4 make 12", Fraction(12)),
        ("no idea", None),
    ],
)
def test_answers_are_read_leniently(text: str, value: Fraction | None) -> None:
    assert parse_answer(text) == value


# -- the tool ------------------------------------------------------------------------


def test_the_tool_runs_the_evaluator() -> None:
    assert TASK.run_tool("calculator", {"expression": "4 * 12 - 9"}) == "39"
    with pytest.raises(ToolError, match="unknown tool 'search'"):
        TASK.run_tool("search", {"expression": "1"})
    with pytest.raises(ToolError, match="needs"):
        TASK.run_tool("calculator", {"expr": "1"})
    (schema,) = TASK.tools()
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]


# -- prompts -------------------------------------------------------------------------


def test_few_shot_turns_are_marked_real_chat_turns_that_pass_the_verifier() -> None:
    instance = TASK.instances("train", 1)[0]
    turns = TASK.few_shot_turns(instance)
    assert [turn["role"] for turn in turns] == ["user", "assistant", "tool", "assistant"] * 2
    assert all(turn[sc.SPANMILL_MESSAGE_EXAMPLE] is True for turn in turns)
    by_question = {example.question: example for example in TASK.worked_examples}
    for number in range(2):
        shown = turns[4 * number : 4 * number + 4]
        example = by_question[shown[0]["content"]]
        unmarked = [
            {key: value for key, value in turn.items() if key != sc.SPANMILL_MESSAGE_EXAMPLE}
            for turn in shown
        ]
        assert TASK.verify(example, unmarked).rewards == {"success": 1.0, "valid_call": 1.0}


def test_the_worked_examples_are_training_problems_one_per_template() -> None:
    bank = TASK.worked_examples
    assert sorted(example.data["template"] for example in bank) == sorted(
        template.id for template in TEMPLATES
    )
    assert all(split_of(example.id) == "train" for example in bank)
    assert TASK.worked_examples == CalculatorTask().worked_examples  # the same in every process


def test_the_few_shot_prompt_shows_the_most_alike_examples_most_alike_last() -> None:
    for instance in TASK.instances("heldout", 40, seed=3):
        shown = [
            turn["content"] for turn in TASK.few_shot_turns(instance) if turn["role"] == "user"
        ]
        ranked = sorted(
            (likeness(e.question, instance.question) for e in TASK.worked_examples), reverse=True
        )
        assert [likeness(q, instance.question) for q in shown] == [ranked[1], ranked[0]]
        # The closest example is a problem of the same template, never the instance itself.
        assert by_template(shown[-1]) == instance.data["template"]
        assert instance.question not in shown
    worked = TASK.worked_examples[0]
    assert worked.question not in [t["content"] for t in TASK.few_shot_turns(worked)]


def by_template(question: str) -> str:
    return next(e.data["template"] for e in TASK.worked_examples if e.question == question)


def test_zero_and_few_shot_share_the_system_prompt() -> None:
    instance = TASK.instances("heldout", 1)[0]
    zero = TASK.messages(instance, "zero_shot")
    few = TASK.messages(instance, "few_shot")
    assert [m["role"] for m in zero] == ["system", "user"]
    assert zero[0] == few[0] and zero[-1] == few[-1]
    assert len(few) == 2 + len(TASK.few_shot_turns(instance))
    # Dropping the example turns re-targets a few-shot prompt to the zero-shot one.
    assert [m for m in few if sc.SPANMILL_MESSAGE_EXAMPLE not in m] == zero
    assert '{"tool": "calculator", "expression":' in zero[0]["content"]
    with pytest.raises(TaskError, match="prompt style"):
        TASK.messages(instance, "chain_of_thought")  # type: ignore[arg-type]


# -- the verifier --------------------------------------------------------------------

INSTANCE = make_instance("bakery-muffins", {"a": 4, "b": 12, "c": 9})  # 4 * 12 - 9 = 39


def assistant(content: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def tool(content: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def tool_calls(expression: str, arguments: Any = None) -> dict[str, Any]:
    return assistant(
        None,
        tool_calls=[
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "calculator",
                    "arguments": arguments
                    if arguments is not None
                    else json.dumps({"expression": expression}),
                },
            }
        ],
    )


CALL = assistant(tool_call_content("4 * 12 - 9"))
USER = {"role": "user", "content": INSTANCE.question}

VERDICTS = [
    ("json call, right answer", [USER, CALL, tool("39"), assistant("39")], 1, 1),
    ("prose instead of a call", [USER, assistant("The bakery has 39 muffins left.")], 0, 0),
    ("number instead of a call", [USER, assistant("39")], 0, 0),
    ("right call, wrong answer", [USER, CALL, tool("39"), assistant("40")], 0, 1),
    ("right call, no answer", [USER, CALL, tool("39")], 0, 1),
    ("tool_calls form", [USER, tool_calls("4 * 12 - 9"), tool("39"), assistant("39")], 1, 1),
    (
        "tool_calls with object arguments",
        [USER, tool_calls("", {"expression": "4*12-9"}), tool("39"), assistant("39")],
        1,
        1,
    ),
    ("answer in a sentence", [USER, CALL, tool("39"), assistant("The answer is 39.")], 1, 1),
    (
        "fenced json call",
        [
            USER,
            assistant(f"```json\n{tool_call_content('4 * 12 - 9')}\n```"),
            tool("39"),
            assistant("39"),
        ],
        1,
        1,
    ),
    (
        "call with a name in it",
        [USER, assistant(tool_call_content("muffins - 9")), tool("error"), assistant("39")],
        0,
        0,
    ),
    ("wrong tool", [USER, assistant('{"tool": "search", "query": "muffins"}')], 0, 0),
    ("broken json", [USER, assistant('{"tool": "calculator", "expression": ')], 0, 0),
    (
        "another call at the end",
        [USER, CALL, tool("39"), CALL, tool("39")],
        0,
        1,
    ),
    ("nothing said", [USER], 0, 0),
    (
        "examples are ignored",
        [*TASK.few_shot_turns(TASK.instances("train", 1)[0]), USER, assistant("I think 39.")],
        0,
        0,
    ),
]


@pytest.mark.parametrize(
    ("transcript", "success", "valid_call"),
    [pytest.param(t, s, v, id=name) for name, t, s, v in VERDICTS],
)
def test_the_verifier_judges_the_protocol_and_the_answer(
    transcript: list[dict[str, Any]], success: int, valid_call: int
) -> None:
    verdict = TASK.verify(INSTANCE, transcript)
    assert verdict.rewards == {"success": success, "valid_call": valid_call}
    assert verdict.explanation


def test_the_verdict_names_its_primary_and_what_each_score_judges() -> None:
    verdict = TASK.verify(INSTANCE, [USER, CALL, tool("39"), assistant("40")])
    assert verdict.primary.name == "success"
    turns = {score.name: score.turn for score in verdict.scores}
    assert turns == {"success": None, "valid_call": 0}
    assert verdict.explanation == "answered 40, expected 39"


def test_tool_calls_are_read_in_both_forms() -> None:
    content = extract_tool_call(CALL)
    native = extract_tool_call(tool_calls("4 * 12 - 9"))
    assert content is not None and native is not None
    assert (content.name, content.arguments, content.id) == (
        "calculator",
        {"expression": "4 * 12 - 9"},
        None,
    )
    assert (native.name, native.arguments, native.id) == (
        "calculator",
        {"expression": "4 * 12 - 9"},
        "call_1",
    )
    assert extract_tool_call(assistant("39")) is None
    assert extract_tool_call(tool_calls("", arguments="not json")) is None


# -- what the core asks of a task beyond playing it ----------------------------------


def test_the_reference_solution_follows_the_protocol_and_passes_the_verifier() -> None:
    for instance in TASK.instances("heldout", 20, seed=2):
        transcript = TASK.reference_transcript(instance)
        assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "assistant"]
        assert transcript[1]["content"] == tool_call_content(instance.data["expression"])
        assert transcript[-1]["content"] == instance.answer
        assert TASK.verify(instance, transcript)["success"] == 1.0


@pytest.mark.parametrize(
    ("reply", "reference", "same"),
    [
        ("39", "39", True),
        ("The answer is 39.", "39", True),
        ("$8.75", "8.75", True),
        ("1,250", "1250", True),
        ("40", "39", False),
        ("no idea", "39", False),
        ("39", "no number here", None),
    ],
)
def test_answers_are_compared_as_the_verifier_reads_them(
    reply: str, reference: str, same: bool | None
) -> None:
    assert TASK.same_answer(reply, reference) is same
