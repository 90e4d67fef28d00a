"""The OpenAI chat-completions wire format, as far as the gateway serves it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from spanmill.errors import error_body

__all__ = ["ChatCompletionRequest", "ChatMessage", "error_body"]


class ChatMessage(BaseModel):
    # Agents send fields we do not model (name, refusal, audio...); keep them.
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=8)
    stop: str | list[str] | None = None
    seed: int | None = None
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
        return stops

    @property
    def token_limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 256

    def raw_messages(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]
