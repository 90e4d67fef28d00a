"""The agent's side of one episode, whatever produces the model's replies.

The runner asks an OpenAI-compatible endpoint for each reply, one episode at a
time; the evaluator generates replies locally for many episodes in lockstep.
Both drive an :class:`EpisodeLoop`, so the protocol (when a reply is a tool call,
how a refused call is answered, when the episode ends) is defined once.
"""

from __future__ import annotations

from dataclasses import dataclass

from spanmill.tasks.base import (
    Message,
    PromptStyle,
    Task,
    TaskInstance,
    ToolCallRequest,
    ToolError,
    Verdict,
    extract_tool_call,
)

# The protocol needs two turns; one spare lets a model that calls the tool twice finish.
DEFAULT_MAX_TURNS = 3


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool call gave: the content sent back to the agent, and the error if it failed."""

    content: str
    error: str | None = None


class EpisodeLoop:
    """The messages of one episode, advanced one model reply and one tool result at a time.

    ``messages`` is what the model sees on its next call (system prompt and
    examples included); ``transcript`` is the question and everything after it.
    """

    def __init__(
        self,
        task: Task,
        instance: TaskInstance,
        prompt_style: PromptStyle = "zero_shot",
        max_turns: int = DEFAULT_MAX_TURNS,
    ) -> None:
        self.task = task
        self.instance = instance
        self.prompt_style = prompt_style
        self.max_turns = max_turns
        self.messages: list[Message] = task.messages(instance, prompt_style)
        self.transcript: list[Message] = [self.messages[-1]]
        self.calls = 0
        self._answered = False

    @property
    def done(self) -> bool:
        """True once the model answered without a tool call or used up its turns."""
        return self._answered or self.calls >= self.max_turns

    def add_reply(self, assistant: Message) -> ToolCallRequest | None:
        """Record the model's reply; the tool call it makes, or None when it makes none.

        A call on the last allowed turn is still returned: its result belongs in
        the transcript, as a real agent would have run it.
        """
        self.calls += 1
        self.messages.append(assistant)
        self.transcript.append(assistant)
        call = extract_tool_call(assistant)
        if call is None:
            self._answered = True
        return call

    def run_tool(self, call: ToolCallRequest) -> ToolOutcome:
        """Run the call; a refused call answers the agent with the error, as a real tool would."""
        try:
            return ToolOutcome(self.task.run_episode_tool(self.instance, call.name, call.arguments))
        except ToolError as exc:
            return ToolOutcome(f"error: {exc}", error=str(exc))

    def add_tool_result(self, call_id: str, result: str) -> None:
        message: Message = {"role": "tool", "tool_call_id": call_id, "content": result}
        self.messages.append(message)
        self.transcript.append(message)

    def verdict(self) -> Verdict:
        return self.task.verify(self.instance, self.transcript)
