"""The OpenAI chat-completions wire format, as far as the gateway serves it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from spanmill.errors import error_body

__all__ = ["ChatCompletionRequest", "ChatMessage", "error_body"]


# Triton's JSON inputs take MAX_TOKENS as a 32-bit and SEED as a 64-bit integer: a
# larger number would wrap there, not be refused.
INT32_MAX = 2**31 - 1
INT64 = (-(2**63), 2**63 - 1)


class ChatMessage(BaseModel):
    # Agents send fields we do not model (refusal, audio...); keep them.
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    # The participant's name: example_user and example_assistant mark few-shot turns.
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("tool_calls")
    @classmethod
    def _calls(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for call in value or ():
            function = call.get("function")
            if not isinstance(function, dict):
                raise ValueError("each tool call needs a function object")
            if not isinstance(function.get("name", ""), str):
                raise ValueError("a tool call's function name must be a string")
            if not isinstance(function.get("arguments", ""), str | dict):
                raise ValueError("a tool call's arguments must be a JSON string or an object")
        return value


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    n: int = Field(1, ge=1, le=8)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=INT64[0], le=INT64[1])
    stream: bool = False
    # {"include_usage": true} adds a last chunk with the usage, as OpenAI does.
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    # Free-form string tags; spanmill.* keys (prompt name/version, task id) go on the span.
    metadata: dict[str, str] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        stops = [value] if isinstance(value, str) else value
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if not all(stops):
            raise ValueError("a stop sequence must not be empty")
        return stops

    @property
    def token_limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 256

    def raw_messages(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]
