"""Requests Triton hands over together: grouped, generated together, answered in order."""

from __future__ import annotations

from typing import Any

from spanmill.serving.generation import EchoGenerator, Request, generate_all
from spanmill.serving.protocol import GenerationParams, GenerationResult


class CountingEcho(EchoGenerator):
    """The echo engine, noting how each request was generated; fails on demand."""

    def __init__(self) -> None:
        super().__init__("1")
        self.batches: list[list[str]] = []
        self.single: list[str] = []

    def generate(
        self,
        messages: list[dict[str, Any]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> GenerationResult:
        if messages[-1]["content"] == "boom":
            raise RuntimeError("the engine failed")
        return super().generate(messages, params, tools)

    def generate_batch(
        self,
        conversations: list[list[dict[str, Any]]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[GenerationResult]:
        self.batches.append([c[-1]["content"] for c in conversations])
        return super().generate_batch(conversations, params, tools)


def ask(text: str, params: GenerationParams | None = None, tools: Any = None) -> Request:
    return Request([{"role": "user", "content": text}], params or GenerationParams(), tools)


TOOLS = [{"type": "function", "function": {"name": "calculator"}}]


def test_alike_requests_are_generated_together_and_answered_in_order() -> None:
    engine = CountingEcho()
    requests = [
        ask("a"),
        ask("b", tools=TOOLS),
        ask("c"),
        ask("d", GenerationParams(n=2)),  # several choices: alone
        ask("e", GenerationParams(temperature=0.8, seed=3)),  # seeded sampling: alone
        ask("f", tools=TOOLS),
        ask("g", GenerationParams(max_tokens=3)),  # other parameters: its own group of one
        ask("h", GenerationParams(temperature=0.8)),
        ask("i", GenerationParams(temperature=0.8)),  # unseeded sampling batches
    ]
    results = generate_all(engine, requests)
    texts = [r.choices[0].text for r in results if isinstance(r, GenerationResult)]
    assert texts == list("abcdefghi")
    assert sorted(engine.batches) == [["a", "c"], ["b", "f"], ["h", "i"]]
    assert len(results[3].choices) == 2  # type: ignore[union-attr]


def test_a_failure_costs_only_the_requests_it_touched() -> None:
    engine = CountingEcho()
    results = generate_all(
        engine, [ask("x", GenerationParams(n=2)), ask("boom"), ask("y", GenerationParams(n=2))]
    )
    assert isinstance(results[1], RuntimeError)
    assert [r.choices[0].text for r in (results[0], results[2])] == ["x", "y"]  # type: ignore[union-attr]
    assert generate_all(engine, []) == []


def test_a_failed_batch_fails_each_of_its_requests() -> None:
    results = generate_all(CountingEcho(), [ask("boom"), ask("z"), ask("w", GenerationParams(n=2))])
    assert [type(r).__name__ for r in results] == [
        "RuntimeError",
        "RuntimeError",
        "GenerationResult",
    ]
