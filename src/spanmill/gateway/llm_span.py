"""The LLM span the gateway records for every call: pure, from the facts of the call."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from spanmill import messages as chat
from spanmill import semconv as sc
from spanmill.producers import GATEWAY
from spanmill.spans import Span, SpanKind, StatusCode

SCOPE = "spanmill.gateway"
# Request metadata keys copied onto the span: the prompt's identity and the task.
FORWARDED_METADATA = frozenset(
    {
        sc.SPANMILL_PROMPT_NAME,
        sc.SPANMILL_PROMPT_VERSION,
        sc.SPANMILL_TASK_ID,
        sc.SPANMILL_EPISODE_ID,
        sc.GEN_AI_AGENT_NAME,
        sc.GEN_AI_CONVERSATION_ID,
    }
)


def new_span_id() -> str:
    return os.urandom(8).hex()


def new_trace_id() -> str:
    return os.urandom(16).hex()


def build_llm_span(
    *,
    trace_id: str,
    parent_span_id: str | None,
    span_id: str,
    start_ns: int,
    end_ns: int,
    requested_model: str,
    triton_model: str,
    version: str,
    response_id: str | None,
    request_messages: list[dict[str, Any]],
    params: Mapping[str, Any],
    metadata: Mapping[str, str] | None,
    choice: Mapping[str, Any] | None = None,
    prompt_token_ids: list[int] | None = None,
    lora_name: str | None = None,
    token_ids_source: str | None = None,
    client: str | None = None,
    error: str | None = None,
    error_type: str | None = None,
    service_name: str = "spanmill-gateway",
    traffic: str | None = None,
) -> Span:
    """One ``chat`` span. ``choice``: the assistant message, finish reason, token ids
    and logprobs of one completion choice (absent when the call failed).
    ``lora_name``: the adapter a vLLM engine served the version as;
    ``token_ids_source``: where the token ids came from, when the server gave none
    of its own (see :mod:`spanmill.serving.vllm`); ``client``: the id of the API key
    the caller presented (``anonymous`` where none is asked); ``error_type``: the HTTP
    status a failed call was answered with, which tells a client's fault (4xx) from the
    model's (5xx) to whoever reads the span."""
    attributes: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
        sc.GEN_AI_PROVIDER_NAME: "spanmill",
        sc.GEN_AI_REQUEST_MODEL: requested_model,
        sc.GEN_AI_RESPONSE_MODEL: triton_model,
        sc.SPANMILL_MODEL_VERSION: version,
        sc.GEN_AI_AGENT_NAME: requested_model,
        sc.GEN_AI_INPUT_MESSAGES: json.dumps(chat.openai_to_genai(request_messages)),
    }
    for key, attribute in (
        ("temperature", sc.GEN_AI_REQUEST_TEMPERATURE),
        ("top_p", sc.GEN_AI_REQUEST_TOP_P),
        ("max_tokens", sc.GEN_AI_REQUEST_MAX_TOKENS),
    ):
        if params.get(key) is not None:
            attributes[attribute] = params[key]
    # What a replay of the call needs to ask the same question the same way.
    if params.get("stop"):
        attributes[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = list(params["stop"])
    if params.get("tools"):
        attributes[sc.GEN_AI_TOOL_DEFINITIONS] = json.dumps(params["tools"])
    for key, value in (metadata or {}).items():
        if key in FORWARDED_METADATA:
            attributes[key] = value
    if traffic:
        attributes[sc.SPANMILL_TRAFFIC] = traffic
    if lora_name:
        attributes[sc.SPANMILL_LORA_NAME] = lora_name
    if client:
        attributes[sc.SPANMILL_CLIENT_KEY_ID] = client
    if token_ids_source:
        attributes[sc.SPANMILL_TOKEN_IDS_SOURCE] = token_ids_source
    if error and error_type:
        attributes[sc.ERROR_TYPE] = error_type
    if response_id:
        attributes[sc.GEN_AI_RESPONSE_ID] = response_id
    if prompt_token_ids is not None:
        attributes[sc.SPANMILL_PROMPT_TOKEN_IDS] = prompt_token_ids
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = len(prompt_token_ids)
    if choice is not None:
        message = dict(choice["message"], finish_reason=choice["finish_reason"])
        attributes[sc.GEN_AI_OUTPUT_MESSAGES] = json.dumps(chat.openai_to_genai([message]))
        attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [choice["finish_reason"]]
        attributes[sc.SPANMILL_COMPLETION_TOKEN_IDS] = choice["token_ids"]
        if len(choice["logprobs"]) == len(choice["token_ids"]):  # none for retokenised ids
            attributes[sc.SPANMILL_COMPLETION_LOGPROBS] = choice["logprobs"]
        attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = len(choice["token_ids"])
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_span_id,
        name=f"chat {requested_model}",
        kind=SpanKind.CLIENT,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=max(end_ns, start_ns),
        status_code=StatusCode.ERROR if error else StatusCode.UNSET,
        status_message=error or "",
        attributes=attributes,
        # The gateway saw this call itself: it is the producer (spanmill.producers).
        resource_attributes={sc.SERVICE_NAME: service_name, sc.SPANMILL_PRODUCER: GATEWAY},
        scope_name=SCOPE,
    )
