"""The calculator agent: arithmetic word problems solved with one calculator call.

An example task plugin: spanmill finds it through the ``spanmill.tasks`` entry point
``calculator`` (pyproject.toml) and never imports it.

The protocol, two turns:

1. the agent calls the tool, as JSON content
   ``{"tool": "calculator", "expression": "4 * 12 - 9"}`` (a model without a
   native tool format writes that) or as OpenAI ``tool_calls`` (what a gateway may
   turn that JSON into, and what tool-calling models write);
2. the tool's result comes back as a ``tool`` message, and the agent answers with
   the number alone.

Rewards: ``success`` (primary, the whole episode) is 1 when the agent followed the
protocol and its final answer is the right number; ``valid_call`` (the first LLM
call) is 1 when turn 1 was a calculator call the tool could run.

The zero-shot and few-shot prompts share one system prompt; few-shot only adds
example turns, so dropping the examples from a few-shot sample gives exactly the
zero-shot prompt (what context distillation needs). The few-shot prompt is the
production one, and it retrieves its examples as production prompts do: the two
solved training problems (from a bank of one per template) most alike in words to
the question.
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, Final

from spanmill import semconv as sc
from spanmill.tasks.base import (
    Message,
    PromptStyle,
    Score,
    Split,
    Task,
    TaskError,
    TaskInstance,
    ToolError,
    Verdict,
    collect_instances,
    extract_tool_call,
    is_example,
    message_text,
    split_of,
)

TOOL_NAME: Final = "calculator"
MAX_EXPRESSION_CHARS: Final = 200
# Far beyond any answer here; stops a model from asking for astronomically big numbers.
MAX_MAGNITUDE: Final = 10**15
# Non-terminating quotients (10 / 3) are shown rounded to this many decimal places.
RESULT_PLACES: Final = 6


# -- the safe evaluator ----------------------------------------------------------------


class ExpressionError(ToolError):
    """An expression the calculator refuses; the message says why and what is allowed."""


_ALLOWED: Final = "numbers, + - * / and parentheses"
_OPERATORS: Final[dict[type[ast.operator], str]] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.Pow: "**",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.MatMult: "@",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
}
_PLAIN_NUMBER: Final = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression: numbers, + - * /, parentheses, unary -.

    It parses with :mod:`ast` and walks the tree itself, never ``eval``; anything
    else (names, calls, attributes, powers, other operators) is an ExpressionError.
    """
    if not isinstance(expression, str):
        raise ExpressionError(f"the expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise ExpressionError(f"the expression is empty; write one with {_ALLOWED}")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(
            f"the expression is {len(text)} characters long, over the limit of "
            f"{MAX_EXPRESSION_CHARS}"
        )
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"{text!r} is not an arithmetic expression ({exc.msg})") from None
    return _Evaluator(text).visit(tree.body)


class _Evaluator:
    def __init__(self, source: str) -> None:
        self.source = source

    def _bounded(self, value: Fraction) -> Fraction:
        if abs(value) > MAX_MAGNITUDE:
            raise ExpressionError(
                f"a value in {self.source!r} exceeds {MAX_MAGNITUDE:.0e} in magnitude; "
                "the calculator refuses numbers that large"
            )
        return value

    def visit(self, node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant):
            return self._number(node)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return -self.visit(node.operand)
            raise ExpressionError(f"unary {type(node.op).__name__} is not allowed; use {_ALLOWED}")
        if isinstance(node, ast.BinOp):
            return self._binary(node)
        if isinstance(node, ast.Name):
            raise ExpressionError(
                f"names such as {node.id!r} are not allowed; write the numbers themselves"
            )
        if isinstance(node, ast.Call):
            raise ExpressionError(f"function calls are not allowed; use {_ALLOWED}")
        if isinstance(node, ast.Attribute):
            raise ExpressionError(f"attribute access (.{node.attr}) is not allowed; use {_ALLOWED}")
        raise ExpressionError(
            f"{type(node).__name__} is not allowed in an expression; use {_ALLOWED}"
        )

    def _number(self, node: ast.Constant) -> Fraction:
        segment = ast.get_source_segment(self.source, node) or ""
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ExpressionError(f"{segment or value!r} is not a number; use {_ALLOWED}")
        if not _PLAIN_NUMBER.fullmatch(segment):
            raise ExpressionError(
                f"{segment!r}: write plain decimal numbers (like 12 or 2.5), without "
                "exponents, underscores or other bases"
            )
        return self._bounded(Fraction(segment))

    def _binary(self, node: ast.BinOp) -> Fraction:
        symbol = _OPERATORS.get(type(node.op), type(node.op).__name__)
        if not isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
            what = "power" if isinstance(node.op, ast.Pow) else "operator"
            raise ExpressionError(f"{what} {symbol!r} is not allowed; use {_ALLOWED}")
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Add):
            return self._bounded(left + right)
        if isinstance(node.op, ast.Sub):
            return self._bounded(left - right)
        if isinstance(node.op, ast.Mult):
            return self._bounded(left * right)
        if right == 0:
            raise ExpressionError(f"division by zero in {self.source!r}")
        return self._bounded(left / right)


def format_number(value: Fraction) -> str:
    """A number as plain decimal text: 42, 12.5, -3; other fractions rounded (3.333333)."""
    if value.denominator == 1:
        return str(value.numerator)
    rounded = round(value, RESULT_PLACES)
    places = 0
    while (rounded * 10**places).denominator != 1:
        places += 1
    scaled = abs(rounded.numerator * 10**places // rounded.denominator)
    sign = "-" if rounded < 0 else ""
    whole, frac = divmod(scaled, 10**places)
    return f"{sign}{whole}.{frac:0{places}d}".rstrip("0").rstrip(".")


_NUMBER_IN_TEXT: Final = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def parse_answer(text: str) -> Fraction | None:
    """The number an answer gives: the whole text, else the last number in it.

    "42", "$8.75", "1,250" and "The answer is 42." all give their number.
    """
    cleaned = text.strip().rstrip(".").replace("$", "").replace(",", "").strip()
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        pass
    found = _NUMBER_IN_TEXT.findall(text)
    if not found:
        return None
    return Fraction(found[-1].replace(",", ""))


# -- problem templates -----------------------------------------------------------------


@dataclass(frozen=True)
class Int:
    """A whole number between lo and hi."""

    lo: int
    hi: int

    def draw(self, rng: random.Random, values: Mapping[str, Fraction]) -> Fraction:
        return Fraction(rng.randint(self.lo, self.hi))


@dataclass(frozen=True)
class Multiple:
    """A multiple of an earlier variable: ``of`` times a whole number in [lo, hi]."""

    of: str
    lo: int
    hi: int

    def draw(self, rng: random.Random, values: Mapping[str, Fraction]) -> Fraction:
        return values[self.of] * rng.randint(self.lo, self.hi)


@dataclass(frozen=True)
class Steps:
    """A decimal from lo to hi in steps of ``step`` (written with ``places`` decimals)."""

    lo: Fraction
    hi: Fraction
    step: Fraction
    places: int = 2

    def draw(self, rng: random.Random, values: Mapping[str, Fraction]) -> Fraction:
        count = int((self.hi - self.lo) / self.step)
        return self.lo + self.step * rng.randint(0, count)


def money(lo: str, hi: str, step: str = "0.25") -> Steps:
    return Steps(Fraction(lo), Fraction(hi), Fraction(step), places=2)


def amount(lo: str, hi: str, step: str = "0.5") -> Steps:
    return Steps(Fraction(lo), Fraction(hi), Fraction(step), places=0)


Variable = Int | Multiple | Steps


@dataclass(frozen=True)
class Template:
    """A word problem with variables; ``expression`` computes its answer from them.

    Drawn values are kept only when every step of the computation is positive and
    (unless ``decimal``) whole, so the problem reads like a real one; ``signed``
    templates may end below zero.
    """

    id: str
    text: str
    expression: str
    variables: Mapping[str, Variable]
    decimal: bool = False
    signed: bool = False

    def render(self, name: str, value: Fraction) -> str:
        variable = self.variables[name]
        if isinstance(variable, Steps) and variable.places:
            return f"{float(value):.{variable.places}f}"
        return format_number(value)

    def filled(self, values: Mapping[str, Fraction]) -> str:
        return re.sub(
            r"\b[a-z]\b",
            lambda match: self.render(match.group(0), values[match.group(0)]),
            self.expression,
        )

    def acceptable(self, values: Mapping[str, Fraction]) -> bool:
        return all(
            (step > 0 or (self.signed and step != 0)) and (self.decimal or step.denominator == 1)
            for step in _steps(ast.parse(self.filled(values), mode="eval").body)
        )


def _steps(node: ast.expr) -> list[Fraction]:
    """The value of every operation in an expression tree, innermost first."""
    if isinstance(node, ast.BinOp):
        inner = _steps(node.left) + _steps(node.right)
        value = evaluate(ast.unparse(node))
        return [*inner, value]
    return []


TEMPLATES: Final[tuple[Template, ...]] = (
    Template(
        "apples-left",
        (
            "Sam has {a} bags with {b} apples in each bag. He gives away {c} apples. How "
            "many apples does Sam have left?"
        ),
        "a * b - c",
        {"a": Int(2, 9), "b": Int(3, 15), "c": Int(1, 40)},
    ),
    Template(
        "bakery-muffins",
        (
            "A bakery bakes {a} trays of {b} muffins and sells {c} muffins. How many "
            "muffins are left?"
        ),
        "a * b - c",
        {"a": Int(2, 12), "b": Int(6, 24), "c": Int(5, 100)},
    ),
    Template(
        "pencils-shared",
        (
            "A teacher shares {b} pencils equally among {a} students. Each student "
            "already had {c} pencils. How many pencils does each student have now?"
        ),
        "b / a + c",
        {"a": Int(2, 9), "b": Multiple("a", 2, 12), "c": Int(1, 9)},
    ),
    Template(
        "bus-passengers",
        (
            "A bus starts with {a} passengers. At the first stop {b} people get off and "
            "{c} get on. How many passengers are on the bus now?"
        ),
        "a - b + c",
        {"a": Int(10, 60), "b": Int(1, 30), "c": Int(1, 30)},
    ),
    Template(
        "library-boxes",
        (
            "A library has {a} books. It buys {b} boxes with {c} books in each box. How "
            "many books does the library have now?"
        ),
        "a + b * c",
        {"a": Int(50, 900), "b": Int(2, 12), "c": Int(5, 40)},
    ),
    Template(
        "weekly-savings",
        (
            "Mia saves {a} dollars every week for {b} weeks, then spends {c} dollars on a"
            " bike. How many dollars does she have left?"
        ),
        "a * b - c",
        {"a": Int(5, 40), "b": Int(3, 20), "c": Int(20, 300)},
    ),
    Template(
        "garden-flowers",
        (
            "A garden has {a} rows of {b} tulips and {c} rows of {d} roses. How many "
            "flowers are in the garden?"
        ),
        "a * b + c * d",
        {"a": Int(2, 12), "b": Int(3, 20), "c": Int(2, 12), "d": Int(3, 20)},
    ),
    Template(
        "pizza-slices",
        (
            "{a} pizzas are each cut into {b} slices. The slices are shared equally among"
            " {c} friends. How many slices does each friend get?"
        ),
        "a * b / c",
        {"a": Int(2, 9), "b": Int(4, 12), "c": Int(2, 8)},
    ),
    Template(
        "train-distance",
        (
            "A train travels {a} km per hour for {b} hours, then {c} km more. How many km"
            " does it travel in total?"
        ),
        "a * b + c",
        {"a": Int(40, 120), "b": Int(2, 9), "c": Int(5, 90)},
    ),
    Template(
        "sticker-albums",
        (
            "Lena has {a} stickers. She buys {b} more and then splits all of them equally"
            " into {c} albums. How many stickers go in each album?"
        ),
        "(a + b) / c",
        {"a": Int(10, 90), "b": Int(5, 60), "c": Int(2, 9)},
    ),
    Template(
        "cookie-boxes",
        (
            "A factory packs {a} cookies into boxes of {b}. It sells {c} boxes. How many "
            "boxes are left?"
        ),
        "a / b - c",
        {"b": Int(4, 24), "a": Multiple("b", 5, 40), "c": Int(1, 20)},
    ),
    Template(
        "night-temperature",
        (
            "The temperature was {a} degrees. It fell by {b} degrees in the evening and "
            "by {c} more degrees at night. What is the temperature now?"
        ),
        "a - b - c",
        {"a": Int(-5, 25), "b": Int(1, 15), "c": Int(1, 15)},
        signed=True,
    ),
    Template(
        "notebooks-pen",
        (
            "A notebook costs {p} dollars and a pen costs {q} dollars. How many dollars "
            "do {a} notebooks and one pen cost?"
        ),
        "a * p + q",
        {"a": Int(2, 9), "p": money("1", "6"), "q": money("0.5", "3")},
        decimal=True,
    ),
    Template(
        "show-tickets",
        (
            "Tickets cost {a} dollars for adults and {b} dollars for children. How many "
            "dollars do {c} adult tickets and {d} child tickets cost?"
        ),
        "a * c + b * d",
        {"a": Int(8, 30), "b": Int(3, 15), "c": Int(1, 6), "d": Int(1, 8)},
    ),
    Template(
        "marbles-times",
        (
            "Tom has {a} marbles and Ann has {b} times as many. How many more marbles "
            "does Ann have than Tom?"
        ),
        "a * b - a",
        {"a": Int(3, 40), "b": Int(2, 9)},
    ),
    Template(
        "hall-chairs",
        ("A hall has {a} rows of {b} chairs. {c} chairs are broken. How many chairs can be used?"),
        "a * b - c",
        {"a": Int(5, 30), "b": Int(8, 25), "c": Int(1, 30)},
    ),
    Template(
        "water-tank",
        (
            "A tank holds {a} liters. {b} liters are used each day for {c} days. How many"
            " liters remain?"
        ),
        "a - b * c",
        {"a": Int(200, 2000), "b": Int(10, 90), "c": Int(2, 14)},
    ),
    Template(
        "egg-cartons",
        (
            "A farmer collects {a} eggs a day for {b} days and packs them in cartons of "
            "{c}. How many cartons does he fill?"
        ),
        "a * b / c",
        {"a": Int(6, 60), "b": Int(2, 10), "c": Int(6, 12)},
    ),
    Template(
        "day-wages",
        (
            "Ravi earns {a} dollars per hour and works {b} hours. He pays {c} dollars for"
            " lunch. How many dollars does he keep from the day?"
        ),
        "a * b - c",
        {"a": Int(9, 45), "b": Int(3, 10), "c": Int(5, 25)},
    ),
    Template(
        "present-students",
        (
            "A school has {a} classes with {b} students each. {c} students are absent. "
            "How many students are present?"
        ),
        "a * b - c",
        {"a": Int(3, 20), "b": Int(15, 32), "c": Int(1, 40)},
    ),
    Template(
        "flour-batches",
        (
            "A recipe needs {p} cups of flour per batch. How many cups are needed for {a}"
            " batches plus {q} cups for dusting?"
        ),
        "a * p + q",
        {"a": Int(2, 8), "p": amount("1", "4"), "q": amount("0.5", "2")},
        decimal=True,
    ),
    Template(
        "pages-read",
        (
            "Ana reads {a} pages a day for {b} days and then {c} pages on Sunday. How "
            "many pages does she read in all?"
        ),
        "a * b + c",
        {"a": Int(5, 60), "b": Int(2, 7), "c": Int(5, 90)},
    ),
    Template(
        "test-average",
        "Three tests scored {a}, {b} and {c} points. What is the average score?",
        "(a + b + c) / 3",
        {"a": Int(50, 100), "b": Int(50, 100), "c": Int(50, 100)},
    ),
    Template(
        "rope-pieces",
        (
            "A rope {a} meters long is cut into {b} equal pieces, and {c} meters are cut "
            "off one piece. How long is that piece now, in meters?"
        ),
        "a / b - c",
        {"b": Int(2, 9), "a": Multiple("b", 3, 20), "c": Int(1, 5)},
    ),
    Template(
        "stamps-cousins",
        (
            "Omar has {a} stamps. He gives {b} stamps to each of his {c} cousins. How "
            "many stamps does he have left?"
        ),
        "a - b * c",
        {"a": Int(30, 300), "b": Int(2, 15), "c": Int(2, 8)},
    ),
    Template(
        "store-cans",
        (
            "A store has {a} shelves with {b} cans on each. It receives {c} more cans. "
            "How many cans does the store have?"
        ),
        "a * b + c",
        {"a": Int(3, 15), "b": Int(10, 48), "c": Int(5, 200)},
    ),
    Template(
        "jacket-sale",
        (
            "A jacket costs {p} dollars. It is on sale for {q} dollars off, and you buy "
            "{a} jackets. How many dollars do you pay?"
        ),
        "(p - q) * a",
        {"p": money("20", "80", "0.5"), "q": money("2", "15", "0.5"), "a": Int(2, 5)},
        decimal=True,
    ),
    Template(
        "running-laps",
        (
            "A runner runs {a} laps of {b} meters in the morning and {c} laps in the "
            "evening. How many meters does she run in the day?"
        ),
        "(a + c) * b",
        {"a": Int(2, 12), "b": Int(200, 400), "c": Int(1, 10)},
    ),
    Template(
        "parking-spaces",
        (
            "A parking garage has {a} levels with {b} spaces each. {c} cars are parked. "
            "How many spaces are free?"
        ),
        "a * b - c",
        {"a": Int(2, 8), "b": Int(20, 90), "c": Int(10, 200)},
    ),
    Template(
        "crate-weight",
        (
            "Each box weighs {p} kg. A truck carries {a} boxes and a crate of {b} kg. "
            "What is the total weight in kg?"
        ),
        "a * p + b",
        {"p": amount("1.5", "12"), "a": Int(3, 20), "b": Int(10, 80)},
        decimal=True,
    ),
    Template(
        "field-trip",
        (
            "{a} students and {b} teachers go on a trip in buses of {c} seats, and every "
            "bus is full. How many buses do they need?"
        ),
        "(a + b) / c",
        {"a": Int(20, 120), "b": Int(2, 10), "c": Int(10, 40)},
    ),
    Template(
        "fruit-baskets",
        (
            "A shop has {a} baskets of {b} oranges and {c} loose oranges. It sells {d} "
            "oranges. How many oranges are left?"
        ),
        "a * b + c - d",
        {"a": Int(2, 9), "b": Int(6, 20), "c": Int(1, 15), "d": Int(5, 60)},
    ),
)
_BY_ID: Final = {template.id: template for template in TEMPLATES}

# Draws before a template gives up and lets another template try.
_DRAWS_PER_TEMPLATE: Final = 200


# The production prompt's worked examples: the solved training problems most alike in
# words to the question, most alike last (retrieved few-shot examples, one per template
# in the bank).
EXAMPLES_PER_PROMPT: Final = 2
_WORD: Final = re.compile(r"[a-z]+")


def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def likeness(a: str, b: str) -> float:
    """How alike two questions are in words (numbers aside): the Jaccard index, 0 to 1."""
    left, right = _words(a), _words(b)
    return len(left & right) / len(left | right) if left or right else 0.0


SYSTEM_PROMPT: Final = (
    "You are a calculator agent. You solve arithmetic word problems with a calculator tool.\n"
    "First reply with only a JSON tool call and nothing else:\n"
    '{"tool": "calculator", "expression": "<arithmetic expression>"}\n'
    "The expression may use numbers, + - * / and parentheses.\n"
    "The calculator's result comes back in the next message. "
    "Then reply with only the final number."
)


def _instance(template: Template, values: Mapping[str, Fraction]) -> TaskInstance:
    expression = template.filled(values)
    shown = {name: template.render(name, value) for name, value in values.items()}
    # Only what a problem is made of goes into its id: equal problems, equal ids.
    canonical = ",".join(f"{name}={shown[name]}" for name in sorted(shown))
    return TaskInstance(
        task=CalculatorTask.name,
        id=f"{CalculatorTask.name}/{template.id}/{canonical}",
        question=template.text.format(**shown),
        answer=format_number(evaluate(expression)),
        data={"template": template.id, "expression": expression, "values": shown},
    )


def make_instance(template_id: str, values: Mapping[str, int | str]) -> TaskInstance:
    """The instance of a template with given values (numbers, or decimal text)."""
    try:
        template = _BY_ID[template_id]
    except KeyError:
        raise TaskError(f"no calculator template {template_id!r}") from None
    return _instance(template, {name: Fraction(value) for name, value in values.items()})


def _drawn_values(template: Template, rng: random.Random) -> dict[str, Fraction] | None:
    """Values for a template that make a real-looking problem, or None after many tries."""
    for _ in range(_DRAWS_PER_TEMPLATE):
        values: dict[str, Fraction] = {}
        for name, variable in template.variables.items():
            values[name] = variable.draw(rng, values)
        if template.acceptable(values):
            return values
    return None


def _draw(rng: random.Random) -> TaskInstance:
    while True:
        template = rng.choice(TEMPLATES)
        values = _drawn_values(template, rng)
        if values is not None:
            return _instance(template, values)


def tool_call_content(expression: str) -> str:
    """The JSON content of a calculator call in the content form."""
    return json.dumps({"tool": TOOL_NAME, "expression": expression})


class CalculatorTask(Task):
    """Arithmetic word problems with 2-3 operations, solved with one calculator call."""

    name = "calculator"
    agent_name = "calculator"
    prompt_version = "1"

    def instances(self, split: Split, n: int, seed: int = 0) -> list[TaskInstance]:
        return collect_instances(
            _draw, task=self.name, split=split, n=n, seed=seed, heldout_percent=self.heldout_percent
        )

    def system_prompt(self, style: PromptStyle) -> str:
        return SYSTEM_PROMPT

    @cached_property
    def worked_examples(self) -> tuple[TaskInstance, ...]:
        """The bank of worked examples: one solved training problem per template."""
        rng = random.Random(f"{self.name}:worked-examples")
        bank: list[TaskInstance] = []
        for template in TEMPLATES:
            while True:
                values = _drawn_values(template, rng)
                if values is None:
                    continue
                instance = _instance(template, values)
                if split_of(instance.id, self.heldout_percent) == "train":
                    bank.append(instance)
                    break
        return tuple(bank)

    def few_shot_turns(self, instance: TaskInstance) -> list[Message]:
        others = [e for e in self.worked_examples if e.id != instance.id]
        chosen = sorted(others, key=lambda e: (likeness(e.question, instance.question), e.id))
        turns: list[Message] = []
        for number, example in enumerate(chosen[-EXAMPLES_PER_PROMPT:], 1):
            turns += [
                {"role": "user", "content": example.question},
                {"role": "assistant", "content": tool_call_content(example.data["expression"])},
                {"role": "tool", "tool_call_id": f"example-{number}", "content": example.answer},
                {"role": "assistant", "content": example.answer},
            ]
        for turn in turns:
            turn[sc.SPANMILL_MESSAGE_EXAMPLE] = True
        return turns

    def tools(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": TOOL_NAME,
                    "description": "Evaluate an arithmetic expression exactly.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "expression": {
                                "type": "string",
                                "description": f"An expression with {_ALLOWED}, e.g. 4 * 12 - 9",
                            }
                        },
                        "required": ["expression"],
                        "additionalProperties": False,
                    },
                },
            }
        ]

    def run_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        if name != TOOL_NAME:
            raise ToolError(f"unknown tool {name!r}; the only tool is {TOOL_NAME!r}")
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ToolError('the calculator needs {"expression": "<arithmetic expression>"}')
        return format_number(evaluate(expression))

    def reference_transcript(self, instance: TaskInstance) -> list[Message]:
        expression = str(instance.data["expression"])
        result = self.run_tool(TOOL_NAME, {"expression": expression})
        return [
            {"role": "user", "content": instance.question},
            {"role": "assistant", "content": tool_call_content(expression)},
            {"role": "tool", "content": result},
            {"role": "assistant", "content": result},
        ]

    def same_answer(self, reply: str, reference: str) -> bool | None:
        # As the verifier reads a final answer: "$8.75" and "The answer is 42." count.
        wanted = parse_answer(reference)
        if wanted is None:
            return None
        return parse_answer(reply) == wanted

    def verify(self, instance: TaskInstance, transcript: Sequence[Mapping[str, Any]]) -> Verdict:
        turns = [m for m in transcript if m.get("role") == "assistant" and not is_example(m)]
        valid, why_invalid = self._valid_call(turns[0] if turns else None)
        success = False
        if not valid:
            explanation = f"turn 1 is not a valid calculator call: {why_invalid}"
        elif len(turns) < 2:
            explanation = "no final answer after the calculator's result"
        elif extract_tool_call(turns[-1]) is not None:
            explanation = "the last turn is another tool call, not the final number"
        else:
            answer = parse_answer(message_text(turns[-1]))
            if answer is None:
                explanation = f"the final answer has no number: {message_text(turns[-1])[:80]!r}"
            else:
                success = answer == Fraction(instance.answer)
                explanation = (
                    "correct"
                    if success
                    else f"answered {format_number(answer)}, expected {instance.answer}"
                )
        return Verdict(
            scores=(
                Score("success", float(success), primary=True),
                Score("valid_call", float(valid), turn=0),
            ),
            explanation=explanation,
        )

    def _valid_call(self, message: Mapping[str, Any] | None) -> tuple[bool, str]:
        if message is None:
            return False, "there is no assistant turn"
        call = extract_tool_call(message)
        if call is None:
            text = message_text(message).strip()
            return False, f"expected JSON like {tool_call_content('2 + 3')}, got {text[:80]!r}"
        try:
            self.run_tool(call.name, call.arguments)
        except ToolError as exc:
            return False, str(exc)
        return True, ""
