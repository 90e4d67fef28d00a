"""Play a task's episodes with a model, many at a time.

Episodes advance in lockstep: every unfinished episode of a batch gets its next
reply from one batched generation, then its tool result, until all are done.
The protocol itself is the task's :class:`~spanmill.tasks.loop.EpisodeLoop`,
the one the runner drives against a served model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from spanmill.evaluate.scoring import Outcome, format_score_of
from spanmill.messages import to_model_messages
from spanmill.serving.protocol import GenerationParams, GenerationResult
from spanmill.tasks.base import PromptStyle, Task, TaskInstance
from spanmill.tasks.loop import EpisodeLoop

Progress = Callable[[int], None]


class BatchGenerator(Protocol):
    def generate_batch(
        self,
        conversations: list[list[dict[str, Any]]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[GenerationResult]: ...


def play_episodes(
    generator: BatchGenerator,
    task: Task,
    instances: Sequence[TaskInstance],
    *,
    prompt_style: PromptStyle = "zero_shot",
    max_new_tokens: int = 96,
    batch_size: int = 16,
    format_score: str | None = None,
    progress: Progress | None = None,
) -> list[Outcome]:
    """One judged episode per instance, greedy, in the order given."""
    params = GenerationParams(max_tokens=max_new_tokens)
    outcomes: list[Outcome] = []
    for start in range(0, len(instances), batch_size):
        loops = [
            EpisodeLoop(task, instance, prompt_style)
            for instance in instances[start : start + batch_size]
        ]
        tokens = [0] * len(loops)
        while active := [i for i, loop in enumerate(loops) if not loop.done]:
            results = generator.generate_batch(
                [to_model_messages(loops[i].messages) for i in active], params
            )
            for i, result in zip(active, results, strict=True):
                choice = result.choices[0]
                tokens[i] += len(choice.token_ids)
                call = loops[i].add_reply({"role": "assistant", "content": choice.text})
                if call is not None:
                    outcome = loops[i].run_tool(call)
                    loops[i].add_tool_result(call.id or f"call_{loops[i].calls}", outcome.content)
        for loop, spent in zip(loops, tokens, strict=True):
            verdict = loop.verdict()
            primary = verdict.primary
            outcomes.append(
                Outcome(
                    item_id=loop.instance.id,
                    reward=primary.value,
                    success=primary.value >= 1.0,
                    format_valid=format_score_of(verdict.rewards, primary.name, format_score)
                    >= 1.0,
                    tokens=spent,
                    replies=loop.calls,
                    explanation=verdict.explanation,
                    transcript=list(loop.transcript),
                )
            )
        if progress is not None:
            progress(len(loops))
    return outcomes
