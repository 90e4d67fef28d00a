"""Episodes played in lockstep batches: with a scripted model, and with SmolLM2 itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spanmill_examples.calculator import tool_call_content

from spanmill.evaluate.evaluators import ReplayItem, ToolCallsEvaluator
from spanmill.evaluate.play import play_episodes
from spanmill.evaluate.replay import answer, score
from spanmill.serving.protocol import Choice, GenerationParams, GenerationResult
from spanmill.tasks import TaskInstance, get_task

TASK = get_task("calculator")


class ScriptedModel:
    """Solves the instances it is told to, writes prose for the rest; counts its batches."""

    def __init__(self, instances: list[TaskInstance], solved: set[str]) -> None:
        self.by_question = {i.question: i for i in instances}
        self.solved = solved
        self.batches: list[int] = []

    def generate_batch(
        self,
        conversations: list[list[dict[str, Any]]],
        params: GenerationParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[GenerationResult]:
        self.batches.append(len(conversations))
        results = []
        for messages in conversations:
            question = next(m["content"] for m in messages if m["role"] == "user")
            instance = self.by_question[question]
            if instance.id not in self.solved:
                text = "Let me think about that in words."
            elif messages[-1]["role"] == "tool":
                text = messages[-1]["content"]
            else:
                text = tool_call_content(str(instance.data["expression"]))
            tokens = list(range(len(text.split())))
            choice = Choice(text, tokens, [0.0] * len(tokens), "stop")
            results.append(GenerationResult([choice], prompt_token_ids=[1, 2, 3]))
        return results


def test_episodes_follow_the_protocol_in_lockstep_batches() -> None:
    instances = TASK.instances("heldout", 5, seed=3)
    solved = {instances[0].id, instances[3].id}
    model = ScriptedModel(instances, solved)
    outcomes = play_episodes(model, TASK, instances, batch_size=3)
    assert [o.item_id for o in outcomes] == [i.id for i in instances]
    assert [o.success for o in outcomes] == [True, False, False, True, False]
    assert [o.format_valid for o in outcomes] == [True, False, False, True, False]
    assert [o.replies for o in outcomes] == [2, 1, 1, 2, 1]
    # Two batches of instances; in each, the solvers need a second round for their answer.
    assert model.batches == [3, 1, 2, 1]
    first = outcomes[0].transcript
    assert [m["role"] for m in first] == ["user", "assistant", "tool", "assistant"]
    assert first[2]["content"] == instances[0].answer


def test_replayed_calls_are_answered_in_batches_and_scored() -> None:
    instances = TASK.instances("heldout", 3, seed=4)
    model = ScriptedModel(instances, {instances[0].id})
    items = [
        ReplayItem(
            f"s{i}",
            TASK.messages(instance, "zero_shot"),
            tool_call_content(str(instance.data["expression"])),
        )
        for i, instance in enumerate(instances)
    ]
    texts, tokens = answer(model, items, max_new_tokens=32, batch_size=2)
    assert model.batches == [2, 1]
    assert all(tokens)
    outcomes = score(items, {"challenger": texts}, {"challenger": tokens}, [ToolCallsEvaluator()])
    got = [(o.success, o.format_valid, o.scores) for o in outcomes["challenger"]]
    miss = {"tool_calls.name": 0.0, "tool_calls.name_args": 0.0}
    assert got == [
        (True, True, {"tool_calls.name": 1.0, "tool_calls.name_args": 1.0}),
        (False, False, miss),
        (False, False, miss),
    ]


def test_replayed_calls_are_made_as_they_were_logged() -> None:
    asked: list[tuple[int, GenerationParams, Any]] = []

    class Recorder:
        def generate_batch(
            self,
            conversations: list[list[dict[str, Any]]],
            params: GenerationParams,
            tools: list[dict[str, Any]] | None = None,
        ) -> list[GenerationResult]:
            asked.append((len(conversations), params, tools))
            return [GenerationResult([Choice("x", [1], [0.0], "stop")], [1])] * len(conversations)

    tools = [{"type": "function", "function": {"name": "search_faq"}}]
    prompt = [{"role": "user", "content": "q"}]
    items = [
        ReplayItem("a", prompt, "r", stop=("\n",), max_tokens=32, tools=tools),
        ReplayItem("b", prompt, "r"),
        ReplayItem("c", prompt, "r", stop=("\n",), max_tokens=32, tools=tools),
        ReplayItem("d", prompt, "r", max_tokens=500),
    ]
    texts, _ = answer(Recorder(), items, max_new_tokens=96, batch_size=8)
    assert texts == ["x"] * 4
    got = sorted((n, p.stop, p.max_tokens, t is not None) for n, p, t in asked)
    # Alike calls go together; a logged limit above the evaluation's own is capped.
    assert got == [(1, (), 96, False), (1, (), 96, False), (2, ("\n",), 32, True)]


def test_batch_generation_matches_one_at_a_time(smollm2_dir: Path) -> None:
    from spanmill.serving.generation import Generator

    generator = Generator(str(smollm2_dir), dtype="float32", num_threads=2)
    conversations = [
        TASK.messages(instance, "zero_shot") for instance in TASK.instances("heldout", 2, seed=5)
    ]
    conversations.append([{"role": "user", "content": "Say hi."}])  # a much shorter prompt
    params = GenerationParams(max_tokens=8)
    batched = generator.generate_batch(conversations, params)
    for messages, together in zip(conversations, batched, strict=True):
        alone = generator.generate(messages, params)
        assert together.prompt_token_ids == alone.prompt_token_ids
        assert together.choices[0].token_ids == alone.choices[0].token_ids
        assert together.choices[0].text == alone.choices[0].text
    assert generator.generate_batch([], params) == []
