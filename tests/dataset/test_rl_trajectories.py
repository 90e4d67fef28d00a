"""GRPO's trajectories from stored spans: the calls the agent received, in its order."""

from __future__ import annotations

import pytest
from dataset_traces import episode, llm, reward_event, table, tid

from spanmill import semconv as sc
from spanmill.tasks.base import TaskInstance
from spanmill.tasks.runner import EpisodeResult
from spanmill.train.errors import TrainError
from spanmill.train.rollouts import trajectories


def _served(start: int, response_id: str, tokens: list[int]):  # type: ignore[no-untyped-def]
    span = llm(1, start, answer="42", response_id=response_id)
    span.attributes[sc.SPANMILL_PROMPT_TOKEN_IDS] = [1, 2, 3]
    span.attributes[sc.SPANMILL_COMPLETION_TOKEN_IDS] = tokens
    span.attributes[sc.SPANMILL_COMPLETION_LOGPROBS] = [-0.5] * len(tokens)
    return span


def _result(*response_ids: str) -> EpisodeResult:
    instance = TaskInstance(task="calculator", id="t1", question="6*7?", answer="42")
    return EpisodeResult(
        instance=instance, episode_id=tid(1), trace_id=tid(1), transcript=[], verdict=None,
        response_ids=list(response_ids),
    )  # fmt: skip


def test_a_call_the_agent_never_received_is_no_part_of_its_episode() -> None:
    # The gateway answered r2, but the client had given up on it and asked again (r3).
    spans = table(
        episode(1, 10, reward_event("success", 1.0, primary=True)),
        _served(100, "r1", [7, 8]), _served(200, "r2", [9]), _served(300, "r3", [10, 11, 12]),
    )  # fmt: skip
    (found,) = trajectories(spans, [_result("r1", "r3")])
    assert [c.response_id for c in found.calls] == ["r1", "r3"]
    assert [c.completion_ids for c in found.calls] == [[7, 8], [10, 11, 12]]
    assert found.rewards == {"success": 1.0} and found.primary == "success"
    assert found.group == "t1"


def test_a_received_answer_the_gateway_did_not_record_stops_the_step() -> None:
    spans = table(
        episode(1, 10, reward_event("success", 1.0, primary=True)), _served(100, "r1", [7])
    )
    with pytest.raises(TrainError, match="did not record"):
        trajectories(spans, [_result("r1", "r9")])


def test_an_episode_without_rewards_is_refused() -> None:
    with pytest.raises(TrainError, match="without rewards"):
        trajectories(table(episode(1, 10), _served(100, "r1", [7])), [_result("r1")])
