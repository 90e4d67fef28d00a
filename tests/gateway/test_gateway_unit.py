"""Routing, message forms and the LLM span: the gateway's pure decisions."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from generate_extension import as_event

from spanmill import messages as chat
from spanmill import semconv as sc
from spanmill.errors import ConfigError
from spanmill.gateway.llm_span import build_llm_span
from spanmill.gateway.routing import Route, RoutingFile, RoutingTable


def table(weights: dict[str, float]) -> RoutingTable:
    return RoutingTable.model_validate(
        {
            "revision": 3,
            "routes": {
                "calculator": {
                    "triton_model": "calculator",
                    "backends": [{"version": v, "weight": w} for v, w in weights.items()],
                }
            },
        }
    )


def test_weighted_choice_follows_the_weights() -> None:
    route = table({"1": 75, "2": 25}).routes["calculator"]
    rng = random.Random(0)
    counts = Counter(route.choose(rng).version for _ in range(4000))
    assert 0.70 < counts["1"] / 4000 < 0.80
    assert counts["1"] + counts["2"] == 4000
    only = table({"1": 0, "2": 5}).routes["calculator"]
    assert {only.choose(rng).version for _ in range(100)} == {"2"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "routing table is invalid"),
        ('{"routes": {"m": {"triton_model": "m", "backends": []}}}', "at least 1 item"),
        ('{"routes": {"m": {"triton_model": "m", "backends": [{"version": "0", "weight": 1}]}}}',
         "version"),
        ('{"routes": {"m": {"triton_model": "m", "backends": [{"version": "1", "weight": 0}]}}}',
         "add up to more than 0"),
        # Python's JSON reads these; a weight that is not a finite number would fail
        # every request of the route at the weighted choice.
        ('{"routes": {"m": {"triton_model": "m", "backends": [{"version": "1",'
         ' "weight": Infinity}]}}}', "finite"),
        ('{"routes": {"m": {"triton_model": "m", "backends": [{"version": "1", "weight": NaN}]}}}',
         "finite"),
        ('{"routes": {"m": {"triton_model": "m", "backends": [{"version": "1", "weight": 1e308},'
         ' {"version": "2", "weight": 1e308}]}}}', "finite number"),
        ("[" * 100_000, "nested too deeply"),
    ],
)  # fmt: skip
def test_bad_tables_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RoutingTable.parse(text)


def test_routing_file_reloads_and_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    source = RoutingFile(path)
    assert source.current().routes == {}
    source.write(table({"1": 1}))
    assert source.current().revision == 3
    path.write_text("{broken")
    assert source.current().revision == 3  # a bad edit keeps serving the last good table
    source.write(table({"2": 1}).model_copy(update={"revision": 4}))
    assert source.current().routes["calculator"].backends[0].version == "2"


def test_route_needs_positive_total_weight() -> None:
    with pytest.raises(ValueError, match="add up"):
        Route.model_validate({"triton_model": "m", "backends": [{"version": "1", "weight": 0}]})


def test_tool_calls_round_trip_through_model_text() -> None:
    calls = chat.parse_tool_calls('{"tool": "calculator", "expression": "2 * (3 + 4)"}')
    assert calls[0]["function"]["name"] == "calculator"
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "2 * (3 + 4)"}
    rendered = chat.to_model_messages([{"role": "assistant", "content": None, "tool_calls": calls}])
    assert json.loads(rendered[0]["content"]) == {"tool": "calculator", "expression": "2 * (3 + 4)"}
    fenced = '```json\n{"name": "search", "arguments": {"q": "x"}}\n```'
    assert chat.parse_tool_calls(fenced)[0]["function"]["name"] == "search"
    for text in ("The answer is 14.", '{"expression": "1"}', "{not json}", '["tool"]'):
        assert chat.parse_tool_calls(text) == []


def test_a_turn_with_text_and_a_tool_call_is_rendered_as_its_call() -> None:
    """Anthropic's models (and OpenAI's at times) say a word before a call: the turn's
    call was dropped for its text, so a model trained on it learnt to announce the
    lookup and never make it, and the tool result after it answered nothing."""
    turn = {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "lookup", "arguments": '{"order": 7}'}}]}  # fmt: skip
    (rendered,) = chat.to_model_messages([turn])
    assert json.loads(rendered["content"]) == {"tool": "lookup", "order": 7}
    # As the serving side reads a call back from the model's text.
    assert chat.parse_tool_calls(rendered["content"])[0]["function"]["name"] == "lookup"


def test_openai_and_genai_forms_convert_both_ways() -> None:
    calls = chat.parse_tool_calls('{"tool": "calculator", "expression": "1+1"}')
    conversation = [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": [{"type": "text", "text": "What is 1+1?"}],
         sc.SPANMILL_MESSAGE_EXAMPLE: True},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "2"},
        {"role": "assistant", "content": "2"},
    ]  # fmt: skip
    genai = chat.openai_to_genai(conversation)
    assert genai[1][sc.SPANMILL_MESSAGE_EXAMPLE] is True
    assert genai[2]["parts"][0] == {
        "type": "tool_call", "id": calls[0]["id"], "name": "calculator",
        "arguments": {"expression": "1+1"},
    }  # fmt: skip
    assert genai[3]["parts"][0]["type"] == "tool_call_response"
    back = chat.genai_to_openai(genai)
    assert back[1]["content"] == "What is 1+1?"
    assert back[2]["tool_calls"][0]["function"]["name"] == "calculator"
    assert back[3] == {"role": "tool", "content": "2", "tool_call_id": calls[0]["id"]}
    assert back[4] == {"role": "assistant", "content": "2"}


def test_openai_example_names_mark_few_shot_turns() -> None:
    call = {"id": "ex1", "type": "function",
            "function": {"name": "search", "arguments": '{"q": "a"}'}}  # fmt: skip
    later = dict(call, id="c2")
    messages = [
        {"role": "system", "content": "Help."},
        {"role": "user", "name": "example_user", "content": "Example question?"},
        {"role": "assistant", "name": "example_assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "ex1", "content": "example result"},
        {"role": "assistant", "name": "example_assistant", "content": "Example answer."},
        {"role": "user", "name": "alice", "content": "Real question?"},
        {"role": "assistant", "content": None, "tool_calls": [later]},
        {"role": "tool", "tool_call_id": "c2", "content": "real result"},
    ]
    marked = [bool(m.get(chat.EXAMPLE)) for m in chat.openai_to_genai(messages)]
    assert marked == [False, True, True, True, True, False, False, False]
    # The mark survives the way back, so the dataset builder can drop those turns.
    back = chat.genai_to_openai(chat.openai_to_genai(messages))
    assert [bool(m.get(chat.EXAMPLE)) for m in back] == marked


def test_llm_span_carries_what_training_needs() -> None:
    span = build_llm_span(
        trace_id="ab" * 16, parent_span_id="cd" * 8, span_id="ef" * 8,
        start_ns=1_000, end_ns=2_000, requested_model="calculator", triton_model="calculator",
        version="2", response_id="chatcmpl-1",
        request_messages=[{"role": "user", "content": "hi"}],
        params={"temperature": 0.0, "top_p": 1.0, "max_tokens": 16},
        metadata={sc.SPANMILL_PROMPT_NAME: "calc", sc.SPANMILL_TASK_ID: "t1", "other": "x"},
        choice={"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop",
                "token_ids": [5, 6], "logprobs": [-0.1, -0.2]},
        prompt_token_ids=[1, 2, 3],
    )  # fmt: skip
    assert span.is_llm_call and span.trace_id == "ab" * 16 and span.parent_span_id == "cd" * 8
    assert span.model_version == "2" and span.task_id == "t1" and span.prompt_name == "calc"
    assert span.completion_token_ids == [5, 6] and span.prompt_token_ids == [1, 2, 3]
    assert span.completion_logprobs == [-0.1, -0.2]
    assert span.output_messages[0]["parts"][0]["content"] == "hello"
    assert span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert "other" not in span.attributes


# -- another replica when the first lacks the version ---------------------------------

MISSING = "Request for unknown model: 'calculator' version 2 is not found"
CRASH = (
    "Failed to process the request(s) for model instance 'calculator_0_0', message: "
    "ValueError: invalid literal for int() with base 10: 'x'"
)


class Replicas:
    """A Triton HTTP endpoint whose connections land on different replicas, as behind a
    Kubernetes Service: the n-th connection is answered as ``plan[n]`` says (the last
    entry for any later one): "ok", "missing" (Triton's words for a version it does not
    hold) or "fails" (any other error)."""

    def __init__(self, plan: list[str]) -> None:
        self.plan = plan
        self.connections: list[object] = []
        self.requests: list[int] = []  # the connection of each request, in order

    async def infer(self, request: Any) -> Any:
        from aiohttp import web

        from spanmill.serving import protocol
        from spanmill.serving.protocol import Choice, GenerationResult

        if request.transport not in self.connections:
            self.connections.append(request.transport)
        connection = self.connections.index(request.transport)
        self.requests.append(connection)
        await request.read()
        answer = self.plan[min(connection, len(self.plan) - 1)]
        if answer == "drops":  # a kept-alive connection closed as the request went out
            request.transport.abort()
            return web.Response()
        if answer == "dies":  # a pod killed while it generated: half an answer, then nothing
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"model_name": ')
            request.transport.abort()
            return response
        if answer == "missing":
            return web.json_response({"error": MISSING}, status=404)
        if answer == "fails":
            return web.json_response({"error": "out of memory"}, status=500)
        if answer == "crashes":  # a model's own exception, in Triton's words
            return web.json_response({"error": CRASH}, status=500)
        result = GenerationResult(
            choices=[Choice(text="5", token_ids=[20], logprobs=[-0.5], finish_reason="stop")],
            prompt_token_ids=[1, 2],
            model_version=request.match_info["version"],
        )
        return _sse_response(protocol.encode_result(result))


def _sse_response(outputs: dict[str, Any]) -> Any:
    """The final response as Triton's generate extension streams it: one SSE event."""
    from aiohttp import web

    return web.Response(
        text=f"data: {json.dumps(as_event(outputs))}\n\n", content_type="text/event-stream"
    )


class Gathering(Replicas):
    """A Triton that answers only once ``count`` requests are in at the same time, as a
    model generating long answers holds every one of them open."""

    def __init__(self, count: int) -> None:
        super().__init__(["ok"])
        self.count = count
        self.arrived = 0
        self.all_in: Any = None

    async def infer(self, request: Any) -> Any:
        import asyncio

        self.all_in = self.all_in or asyncio.Event()
        self.arrived += 1
        if self.arrived >= self.count:
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), 20)
        return await super().infer(request)


class StreamsThenMisses(Replicas):
    """A Triton that streams a piece of text, then an error in Triton's words for a
    version it lacks: too late for another replica to answer instead."""

    async def infer(self, request: Any) -> Any:
        from aiohttp import web

        from spanmill.serving import protocol

        await request.read()
        self.requests.append(len(self.requests))
        pieces = f"data: {json.dumps(as_event(protocol.encode_partial(['Hel'])))}\n\n"
        error = f"data: {json.dumps({'error': MISSING})}\n\n"
        return web.Response(text=pieces + error, content_type="text/event-stream")


class Slow(Replicas):
    """A Triton that takes two seconds to answer."""

    async def infer(self, request: Any) -> Any:
        await asyncio.sleep(2)
        return await super().infer(request)


class StreamsThenDies(Replicas):
    """A Triton that streams a piece of text, then goes away."""

    async def infer(self, request: Any) -> Any:
        from aiohttp import web

        from spanmill.serving import protocol

        await request.read()
        self.requests.append(len(self.requests))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        piece = as_event(protocol.encode_partial(["Hel"]))
        await response.write(f"data: {json.dumps(piece)}\n\n".encode())
        await asyncio.sleep(0.2)
        request.transport.abort()
        return response


async def _generate(
    replicas: Replicas,
    calls: int = 1,
    *,
    together: bool = False,
    stream: bool = False,
    timeout_s: float = 10,
    connect_timeout_s: float = 10,
) -> tuple[list[Any], int]:
    """``calls`` generations through one TritonUpstream, one after the other or all at
    once (``together``), streamed or not; (results or errors, retries)."""
    import asyncio

    from aiohttp import web

    from spanmill.gateway.upstream import Target, TritonUpstream, UpstreamError
    from spanmill.serving.protocol import GenerationParams

    app = web.Application()
    app.router.add_post("/v2/models/{model}/versions/{version}/generate_stream", replicas.infer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    retries = 0

    def count() -> None:
        nonlocal retries
        retries += 1

    upstream = TritonUpstream(
        f"127.0.0.1:{port}", timeout_s=timeout_s, on_retry=count,
        connect_timeout_s=connect_timeout_s,
    )  # fmt: skip

    async def call() -> Any:
        target, messages = Target("calculator", "2"), [{"role": "user", "content": "2+3"}]
        params = GenerationParams(max_tokens=2)
        try:
            if not stream:
                return await upstream.generate(target, messages, params, None)
            return [event async for event in upstream.stream(target, messages, params, None)]
        except UpstreamError as exc:
            return exc

    try:
        if together:
            outcomes = list(await asyncio.gather(*(call() for _ in range(calls))))
        else:
            outcomes = [await call() for _ in range(calls)]
    finally:
        await upstream.close()
        await runner.cleanup()
    return outcomes, retries


def test_more_generations_at_once_than_a_connection_pool_holds() -> None:
    """Each generation holds its connection to its end: the 101st must not wait for one
    of the first hundred to finish (and fail at the connect timeout meanwhile)."""
    import asyncio

    replicas = Gathering(120)
    outcomes, retries = asyncio.run(_generate(replicas, calls=120, together=True))
    assert [getattr(o, "model_version", o) for o in outcomes] == ["2"] * 120
    assert replicas.arrived == 120 and retries == 0


def test_no_other_replica_once_the_answer_has_begun_to_stream() -> None:
    import asyncio

    from spanmill.gateway.upstream import UpstreamError

    replicas = StreamsThenMisses(["ok"])
    (outcome,), retries = asyncio.run(_generate(replicas, stream=True))
    # The caller already has "Hel": a second generation would follow it with another.
    assert isinstance(outcome, UpstreamError) and outcome.missing
    assert replicas.requests == [0] and retries == 0


def test_a_missing_version_is_tried_once_more_on_a_fresh_connection() -> None:
    import asyncio

    replicas = Replicas(["missing", "ok"])
    outcomes, retries = asyncio.run(_generate(replicas, calls=2))
    # Each call reached the replica without the version on the kept-alive connection,
    # then the other one on a connection of its own.
    assert [o.model_version for o in outcomes] == ["2", "2"]
    assert outcomes[0].choices[0].text == "5"
    assert replicas.requests == [0, 1, 0, 2] and retries == 2


def test_only_one_retry_and_only_for_a_missing_version() -> None:
    import asyncio

    from spanmill.gateway.upstream import UpstreamError

    replicas = Replicas(["missing"])
    (error,), retries = asyncio.run(_generate(replicas))
    assert isinstance(error, UpstreamError) and error.missing and error.status == 503
    assert "is not being served" in str(error) and MISSING in str(error)
    assert replicas.requests == [0, 1] and retries == 1

    # Any other error would happen again: it goes back to the caller at once.
    replicas = Replicas(["fails", "ok"])
    (error,), retries = asyncio.run(_generate(replicas))
    assert isinstance(error, UpstreamError) and not error.missing and error.status == 502
    assert replicas.requests == [0] and retries == 0

    # A model that raised on the request is at fault, whatever its exception says: the
    # request was not "invalid", and a canary counts it against the version.
    replicas = Replicas(["crashes"])
    (error,), retries = asyncio.run(_generate(replicas))
    assert error.status == 502 and "ValueError: invalid literal" in str(error)
    assert retries == 0

    # The retry may meet another error, which is the one reported.
    replicas = Replicas(["missing", "fails"])
    (error,), retries = asyncio.run(_generate(replicas))
    assert error.status == 502 and "out of memory" in str(error)
    assert replicas.requests == [0, 1] and retries == 1


def test_a_connection_broken_before_the_answer_is_tried_once_more_on_a_fresh_one() -> None:
    """A kept-alive connection Triton closed as the request went out, or a pod that went
    away mid-generation: the caller has none of the answer, and another connection (which
    the Service may send to another pod) gives it."""
    import asyncio

    from spanmill.gateway.upstream import UpstreamError

    for broken in ("drops", "dies"):
        replicas = Replicas([broken, "ok"])
        (outcome,), retries = asyncio.run(_generate(replicas))
        assert getattr(outcome, "model_version", outcome) == "2", broken
        assert replicas.requests == [0, 1] and retries == 1

    # Once only: a connection that breaks again is the caller's 503.
    replicas = Replicas(["drops"])
    (error,), retries = asyncio.run(_generate(replicas))
    assert isinstance(error, UpstreamError) and error.dropped and error.status == 503
    assert replicas.requests == [0, 1] and retries == 1

    # Streamed, the caller already holds what came before the break: not begun again.
    replicas = StreamsThenDies(["ok"])
    (error,), retries = asyncio.run(_generate(replicas, stream=True))
    assert isinstance(error, UpstreamError) and error.dropped
    assert replicas.requests == [0] and retries == 0


def test_a_connection_that_cannot_be_made_is_tried_once_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pod gone with its node, which the Service still sends connections to, answers
    no connect: nothing reached Triton, and another connection may reach another pod.
    (No network here can leave a connect unanswered on cue, so the connector stands in
    for one: its first connection never completes.)"""
    import asyncio

    import aiohttp

    from spanmill.gateway.upstream import UpstreamError

    attempts, unanswered = 0, 1

    class Unanswered(aiohttp.TCPConnector):
        async def _create_connection(self, *args: Any, **kwargs: Any) -> Any:
            nonlocal attempts
            attempts += 1
            if attempts <= unanswered:
                await asyncio.sleep(60)
            return await super()._create_connection(*args, **kwargs)

    monkeypatch.setattr(aiohttp, "TCPConnector", Unanswered)
    replicas = Replicas(["ok"])
    (outcome,), retries = asyncio.run(_generate(replicas, connect_timeout_s=0.3))
    assert getattr(outcome, "model_version", outcome) == "2"
    assert attempts == 2 and replicas.requests == [0] and retries == 1

    # Twice unanswered: the caller's 503, after one retry.
    attempts, unanswered = 0, 2
    (error,), retries = asyncio.run(_generate(Replicas(["ok"]), connect_timeout_s=0.3))
    assert isinstance(error, UpstreamError) and error.dropped and error.status == 503
    assert "ConnectionTimeoutError" in str(error) and retries == 1


def test_a_slow_triton_is_not_sent_the_call_twice() -> None:
    import asyncio

    from spanmill.gateway.upstream import UpstreamError

    replicas = Slow(["ok"])
    (error,), retries = asyncio.run(_generate(replicas, timeout_s=0.5))
    assert isinstance(error, UpstreamError) and not error.dropped and error.status == 503
    assert "TimeoutError" in str(error)
    assert replicas.requests == [0] and retries == 0


def test_tokenizers_load_apart_and_a_failed_load_waits_before_it_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow load holds up only the calls of its own base model, and a failed one is
    not started again by every call that follows."""
    import threading

    import transformers

    from spanmill.gateway.prompts import PromptError, Tokenizers

    slow_started, slow_may_end = threading.Event(), threading.Event()
    loads: list[str] = []

    def resolve(reference: str) -> str:
        return reference

    def from_pretrained(path: str) -> Any:
        loads.append(path)
        if path == "slow":
            slow_started.set()
            assert slow_may_end.wait(30)
        if path == "broken":
            raise OSError("no such folder")
        return f"tokenizer of {path}"

    monkeypatch.setattr("spanmill.models.resolve.resolve_model", resolve)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    tokenizers = Tokenizers(retry_after_s=3600)
    slow = threading.Thread(target=tokenizers.get, args=("slow",))
    slow.start()
    assert slow_started.wait(30)
    assert tokenizers.get("quick") == "tokenizer of quick"  # while "slow" still loads
    slow_may_end.set()
    slow.join(30)
    assert tokenizers.get("slow") == "tokenizer of slow"
    for _ in range(3):
        with pytest.raises(PromptError, match="no such folder"):
            tokenizers.get("broken")
    assert loads == ["slow", "quick", "broken"]  # each loaded once, the broken one tried once


def test_every_result_of_parallel_tool_calls_reaches_the_prompt() -> None:
    """A message of two results kept the last alone, and a user turn holding a result and
    text kept the result and lost the text."""
    both = [{"role": "tool", "parts": [
        {"type": "tool_call_response", "id": "a", "response": "RA"},
        {"type": "tool_call_response", "id": "b", "response": {"rows": 2}}]}]  # fmt: skip
    assert chat.genai_to_openai(both) == [
        {"role": "tool", "content": "RA", "tool_call_id": "a"},
        {"role": "tool", "content": '{"rows": 2}', "tool_call_id": "b"},
    ]
    mixed = [{"role": "user", "parts": [
        {"type": "tool_call_response", "id": "a", "response": "RA"},
        {"type": "text", "content": "And the other order?"}]}]  # fmt: skip
    assert chat.genai_to_openai(mixed) == [
        {"role": "tool", "content": "RA", "tool_call_id": "a"},
        {"role": "user", "content": "And the other order?"},
    ]


def test_readiness_gives_up_on_a_triton_that_never_answers() -> None:
    """Under the session's bound for a generation (an hour here), each probe's question
    stayed open that long; it now gives up within seconds, and says not ready."""
    import socket

    from spanmill.gateway.upstream import TritonUpstream

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog, nothing answers
        upstream = TritonUpstream(f"127.0.0.1:{silent.getsockname()[1]}", timeout_s=3600)

        async def ask() -> bool:
            try:
                return await upstream.ready()
            finally:
                await upstream.close()

        assert asyncio.run(ask()) is False
