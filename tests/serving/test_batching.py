"""Requests Triton hands over together: grouped, generated together, answered in order."""

from __future__ import annotations

from typing import Any

from spanmill.serving.generation import (
    Cancellation,
    EchoGenerator,
    Listener,
    Request,
    TextStream,
    generate_all,
)
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
        listener: Listener | None = None,
    ) -> GenerationResult:
        if messages[-1]["content"] == "boom":
            raise RuntimeError("the engine failed")
        return super().generate(messages, params, tools, listener)

    def generate_batch(
        self,
        conversations: list[list[dict[str, Any]]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
        listeners: list[Listener | None] | None = None,
    ) -> list[GenerationResult]:
        self.batches.append([c[-1]["content"] for c in conversations])
        return super().generate_batch(conversations, params, tools, listeners)


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
        ask("g", GenerationParams(max_tokens=3)),  # other parameters: a batch of its own
        ask("h", GenerationParams(temperature=0.8)),
        ask("i", GenerationParams(temperature=0.8)),  # unseeded sampling batches
    ]
    results = generate_all(engine, requests)
    texts = [r.choices[0].text for r in results if isinstance(r, GenerationResult)]
    assert texts == list("abcdefghi")
    # A batch of one still goes the batch way, where cached prompt prefixes are reused.
    assert sorted(engine.batches) == [["a", "c"], ["b", "f"], ["g"], ["h", "i"]]
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


# -- listeners: streaming and cancellation, token by token ----------------------------


def stream_of(
    engine: EchoGenerator, params: GenerationParams
) -> tuple[TextStream, list[list[str]]]:
    sent: list[list[str]] = []
    return TextStream(engine.tokenizer, engine.eos_ids, params, sent.append), sent


def test_a_stream_sends_each_piece_once_and_the_pieces_make_the_text() -> None:
    engine = EchoGenerator("1")
    params = GenerationParams(max_tokens=64)
    stream, sent = stream_of(engine, params)
    (result,) = generate_all(engine, [Request([{"role": "user", "content": "héllo"}], params,
                                              listener=stream)])  # fmt: skip
    assert isinstance(result, GenerationResult)
    pieces = [p[0] for p in sent]
    # One piece per token, except the first byte of "é", held until its second arrives.
    assert pieces == ["h", "é", "l", "l", "o"] and "".join(pieces) == result.choices[0].text


def test_a_stream_holds_back_what_may_be_a_stop_string() -> None:
    engine = EchoGenerator("1")
    params = GenerationParams(max_tokens=64, stop=("END",))
    stream, sent = stream_of(engine, params)
    for end in range(1, len(b"ab ENDx") + 1):
        stream.step([list(b"ab ENDx"[:end])])
    # "ab E" and "ab EN" might still become "ab END": "E" and "N" wait, and never go.
    assert "".join(p[0] for p in sent) == "ab "


def test_a_cancelled_request_stops_at_the_next_token_and_alone() -> None:
    engine = CountingEcho()
    seen: list[int] = []

    def gone_after_three() -> bool:
        seen.append(1)
        return len(seen) >= 3

    requests = [
        Request([{"role": "user", "content": "abcdefgh"}], GenerationParams(),
                listener=Cancellation(gone_after_three)),
        Request([{"role": "user", "content": "ijklmnop"}], GenerationParams(),
                listener=Cancellation(lambda: False)),
    ]  # fmt: skip
    cut, whole = generate_all(engine, requests)
    assert isinstance(cut, GenerationResult) and isinstance(whole, GenerationResult)
    assert cut.choices[0].text == "abc" and whole.choices[0].text == "ijklmnop"


def test_an_unstreamed_request_writes_a_heartbeat_each_second_it_runs() -> None:
    beats: list[int] = []
    now = [0.0]

    def clock() -> float:
        now[0] += 0.25  # each look at the clock is a quarter second later
        return now[0]

    listener = Cancellation(lambda: False, beat=lambda: beats.append(1), clock=clock)
    engine = EchoGenerator("1")
    (result,) = generate_all(engine, [Request([{"role": "user", "content": "x" * 8}],
                                              GenerationParams(), listener=listener)])  # fmt: skip
    assert isinstance(result, GenerationResult) and result.choices[0].text == "x" * 8
    # 8 tokens over 2.25 s of this clock: a beat at 1 s and at 2 s, none for a quick answer.
    assert len(beats) == 2
    quick = Cancellation(lambda: False, beat=lambda: beats.append(1))
    generate_all(engine, [Request([{"role": "user", "content": "hi"}], GenerationParams(),
                                  listener=quick)])  # fmt: skip
    assert len(beats) == 2
