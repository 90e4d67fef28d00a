"""OpenLLMetry and OpenInference attributes become the GenAI conventions, at the edge."""

from __future__ import annotations

import json

import pytest

from spanmill import semconv as sc
from spanmill.collector.translate import Translation, openinference, openllmetry


def test_openllmetry_messages_usage_and_kind() -> None:
    attributes = {
        "gen_ai.system": "openai",
        "llm.request.type": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.prompt.0.role": "system",
        "gen_ai.prompt.0.content": "You add numbers.",
        "gen_ai.prompt.1.role": "user",
        "gen_ai.prompt.1.content": "2+2?",
        "gen_ai.prompt.2.role": "tool",
        "gen_ai.prompt.2.content": "4",
        "gen_ai.prompt.2.tool_call_id": "call_1",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.finish_reason": "tool_calls",
        "gen_ai.completion.0.tool_calls.0.id": "call_2",
        "gen_ai.completion.0.tool_calls.0.name": "calculator",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"expression": "2+2"}',
        "gen_ai.usage.prompt_tokens": 11,
        "gen_ai.usage.completion_tokens": 5,
        "llm.usage.total_tokens": 16,
    }
    assert openllmetry.translate(attributes)
    assert json.loads(attributes[sc.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "system", "parts": [{"type": "text", "content": "You add numbers."}]},
        {"role": "user", "parts": [{"type": "text", "content": "2+2?"}]},
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "call_1", "response": "4"}],
        },
    ]
    assert json.loads(attributes[sc.GEN_AI_OUTPUT_MESSAGES]) == [
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "call_2",
                    "name": "calculator",
                    "arguments": {"expression": "2+2"},
                }
            ],
            "finish_reason": "tool_calls",
        }
    ]
    assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 11
    assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert attributes[sc.GEN_AI_PROVIDER_NAME] == "openai"
    assert attributes[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert not any(key.startswith(("gen_ai.prompt.", "gen_ai.completion.")) for key in attributes)
    assert attributes["llm.usage.total_tokens"] == 16  # untranslated keys stay


def test_openllmetry_agent_step_and_native_values_win() -> None:
    attributes = {
        "traceloop.span.kind": "agent",
        "traceloop.entity.name": "planner",
        sc.GEN_AI_AGENT_NAME: "native-name",
        "gen_ai.prompt.0.content": '[{"type": "text", "text": "hi"}]',
    }
    assert openllmetry.translate(attributes)
    assert attributes[sc.GEN_AI_OPERATION_NAME] == sc.OPERATION_INVOKE_AGENT
    assert attributes[sc.GEN_AI_AGENT_NAME] == "native-name"
    assert json.loads(attributes[sc.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]}
    ]


def test_openinference_llm_span() -> None:
    attributes = {
        "openinference.span.kind": "LLM",
        "llm.model_name": "claude-x",
        "llm.provider": "anthropic",
        "llm.invocation_parameters": '{"temperature": 0.2, "max_tokens": 64}',
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.contents.0.message_content.type": "text",
        "llm.input_messages.0.message.contents.0.message_content.text": "hello",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": "hi!",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id": "t1",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "search",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"q": 1}',
        "llm.token_count.prompt": 3,
        "llm.token_count.completion": 2,
        "session.id": "conv-9",
        "input.value": '{"messages": []}',
        "input.mime_type": "application/json",
    }
    assert openinference.translate(attributes)
    assert attributes[sc.GEN_AI_OPERATION_NAME] == sc.OPERATION_CHAT
    assert attributes[sc.GEN_AI_REQUEST_MODEL] == "claude-x"
    assert attributes[sc.GEN_AI_PROVIDER_NAME] == "anthropic"
    assert attributes[sc.GEN_AI_REQUEST_TEMPERATURE] == 0.2
    assert attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] == 64
    assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3
    assert attributes[sc.GEN_AI_CONVERSATION_ID] == "conv-9"
    assert json.loads(attributes[sc.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "hello"}]}
    ]
    assert json.loads(attributes[sc.GEN_AI_OUTPUT_MESSAGES]) == [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "hi!"},
                {"type": "tool_call", "id": "t1", "name": "search", "arguments": {"q": 1}},
            ],
        }
    ]
    assert not any(key.startswith("llm.input_messages") for key in attributes)
    assert "openinference.span.kind" not in attributes
    assert attributes["input.value"] == '{"messages": []}'  # raw JSON input is kept


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        # LangChain's LLMResult, as OpenInference for LangChain records it.
        (
            {
                "generations": [
                    [{"message": {"kwargs": {"response_metadata": {"id": "chatcmpl-7"}}}}]
                ],
                "llm_output": None,
            },
            "chatcmpl-7",
        ),
        ({"generations": [], "llm_output": {"id": "chatcmpl-8"}}, "chatcmpl-8"),
        # An OpenAI chat completion body.
        ({"id": "chatcmpl-9", "object": "chat.completion", "choices": []}, "chatcmpl-9"),
        ({"id": "run-1", "object": "thing"}, None),
        ({"generations": [[None, {"message": "text"}]], "llm_output": {"id": 5}}, None),
        ([1, 2], None),
    ],
)
def test_openinference_response_id_from_the_output(output: object, expected: str | None) -> None:
    attributes = {
        "openinference.span.kind": "LLM",
        "llm.model_name": "m",
        "output.value": json.dumps(output),
        "output.mime_type": "application/json",
    }
    assert openinference.translate(attributes)
    assert attributes.get(sc.GEN_AI_RESPONSE_ID) == expected
    assert "output.value" in attributes  # the raw output is kept


def test_openinference_tool_and_plain_llm_spans() -> None:
    tool = {
        "openinference.span.kind": "TOOL",
        "tool.name": "calculator",
        "input.value": '{"expression": "1+1"}',
        "output.value": "2",
    }
    assert openinference.translate(tool)
    assert tool == {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_EXECUTE_TOOL,
        sc.GEN_AI_TOOL_NAME: "calculator",
        openinference.TOOL_CALL_ARGUMENTS: '{"expression": "1+1"}',
        openinference.TOOL_CALL_RESULT: "2",
    }
    plain = {"openinference.span.kind": "LLM", "input.value": "2+2?", "output.value": "4"}
    assert openinference.translate(plain)
    assert json.loads(plain[sc.GEN_AI_OUTPUT_MESSAGES])[0]["parts"][0]["content"] == "4"


def test_native_spans_are_untouched_and_counted_per_convention() -> None:
    native = {sc.GEN_AI_OPERATION_NAME: "chat", "input.value": "x"}
    counts: dict[str, int] = {}
    Translation().apply(native, counts)
    assert native == {sc.GEN_AI_OPERATION_NAME: "chat", "input.value": "x"}
    assert counts == {}
    foreign = {"openinference.span.kind": "AGENT", "agent.name": "a"}
    Translation().apply(foreign, counts)
    assert counts == {"openinference": 1}
    assert foreign[sc.GEN_AI_AGENT_NAME] == "a"


def test_names_refusals_and_legacy_function_calls_are_kept() -> None:
    """The translators dropped every indexed key they did not map: a few-shot turn's
    participant name (so drop_examples kept the worked example), a refusal and the
    legacy API's function call (an answer with no parts, its sample lost)."""
    openllmetry_span = {
        "gen_ai.system": "openai", "llm.request.type": "chat",
        "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "2+2?",
        "gen_ai.prompt.0.name": "example_user",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.function_call.name": "calculator",
        "gen_ai.completion.0.function_call.arguments": '{"expression": "2+2"}',
        "gen_ai.completion.1.role": "assistant", "gen_ai.completion.1.refusal": "I can't.",
    }  # fmt: skip
    assert openllmetry.translate(openllmetry_span)
    (prompt,) = json.loads(openllmetry_span[sc.GEN_AI_INPUT_MESSAGES])
    assert prompt["name"] == "example_user" and prompt[sc.SPANMILL_MESSAGE_EXAMPLE] is True
    called, refused = json.loads(openllmetry_span[sc.GEN_AI_OUTPUT_MESSAGES])
    assert called["parts"] == [
        {"type": "tool_call", "name": "calculator", "arguments": {"expression": "2+2"}}
    ]
    assert refused["parts"] == [{"type": "text", "content": "I can't."}]
    openinference_span = {
        "openinference.span.kind": "LLM", "llm.model_name": "gpt-4o",
        "llm.input_messages.0.message.role": "assistant",
        "llm.input_messages.0.message.content": "4",
        "llm.input_messages.0.message.name": "example_assistant",
    }  # fmt: skip
    assert openinference.translate(openinference_span)
    (turn,) = json.loads(openinference_span[sc.GEN_AI_INPUT_MESSAGES])
    assert turn[sc.SPANMILL_MESSAGE_EXAMPLE] is True


def test_content_lists_are_read_as_parts_only_when_they_are_parts() -> None:
    """OpenLLMetry's Anthropic instrumentation records tool blocks as a JSON list in the
    content: the tool_result block was kept raw, which nothing reads (the prompt lost the
    tool's answer); and an answer that was JSON-looking text ('[{"type": "refund"...') was
    taken for parts and lost."""
    span = {
        "gen_ai.system": "anthropic", "llm.request.type": "chat",
        "gen_ai.prompt.0.role": "assistant",
        "gen_ai.prompt.0.content": json.dumps(
            [{"type": "tool_use", "id": "tu1", "name": "lookup", "input": {"order": 7}}]),
        "gen_ai.prompt.1.role": "user",
        "gen_ai.prompt.1.content": json.dumps(
            [{"type": "tool_result", "tool_use_id": "tu1", "content": "order 7: shipped"}]),
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": '[{"type": "refund", "confidence": 0.9}]',
    }  # fmt: skip
    assert openllmetry.translate(span)
    call, result = json.loads(span[sc.GEN_AI_INPUT_MESSAGES])
    assert call["parts"] == [
        {"type": "tool_call", "id": "tu1", "name": "lookup", "arguments": {"order": 7}}
    ]
    assert result["parts"] == [
        {"type": "tool_call_response", "id": "tu1", "response": "order 7: shipped"}
    ]
    (answer,) = json.loads(span[sc.GEN_AI_OUTPUT_MESSAGES])
    assert answer["parts"] == [
        {"type": "text", "content": '[{"type": "refund", "confidence": 0.9}]'}
    ]


def test_the_tools_a_call_was_offered_are_kept_for_its_replay() -> None:
    """OpenLLMetry records them as llm.request.functions.<i>.*: untranslated, a replay
    of the call in evaluation offered the models no tool, and they could call none."""
    from spanmill.dataset.episodes import request_of

    span = {
        "gen_ai.system": "openai", "llm.request.type": "chat",
        "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "How do I export?",
        "llm.request.functions.0.name": "search_faq",
        "llm.request.functions.0.description": "Search the FAQ",
        "llm.request.functions.0.parameters": '{"type": "object", "properties": {}}',
    }  # fmt: skip
    assert openllmetry.translate(span)
    assert not [key for key in span if key.startswith("llm.request.functions.")]
    request = json.loads(request_of(json.dumps(span)) or "{}")
    assert request["tools"] == [{"type": "function", "function": {
        "name": "search_faq", "description": "Search the FAQ",
        "parameters": {"type": "object", "properties": {}}}}]  # fmt: skip
