"""GRPO over live rollouts: the calculator agent's own episode code, the real gateway,
the rollout topic on a real broker (tansu) and SmolLM2 as the policy.

What the trainer trains on must be exactly what the gateway recorded for the same
calls, token for token; the ratio against the sampler's logprobs starts at 1; a
run resumes from its last checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spanmill import semconv as sc
from spanmill.config import KafkaSettings
from spanmill.spans.codec import detect_and_decode
from spanmill.tasks import get_task
from spanmill.tasks.runner import make_client
from spanmill.train.errors import TrainError
from spanmill.train.rl import Row, completion_logprobs, rows_of, train_grpo
from spanmill.train.rollouts import CallTokens, RolloutReader, Trajectory, run_groups, trajectories
from spanmill.train.settings import TrainSettings

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(1200)]


def _trajectory(group: str, reward: float, episode: str) -> Trajectory:
    call = CallTokens("r-" + episode, [1, 2, 3], [4, 5], [-0.5, -0.25], "1")
    return Trajectory(episode, "t" * 32, group, {"success": reward}, "success", [call])


def test_groups_whose_rewards_are_equal_give_no_rows() -> None:
    batch = [
        _trajectory("same", 1.0, "a"), _trajectory("same", 1.0, "b"),
        _trajectory("mixed", 1.0, "c"), _trajectory("mixed", 0.0, "d"),
    ]  # fmt: skip
    rows, stats = rows_of(batch, TrainSettings(track=False))
    assert stats["groups"] == 2 and stats["groups_with_signal"] == 1
    assert [row.advantage > 0 for row in rows] == [True, False]
    assert sum(row.advantage for row in rows) == pytest.approx(0.0)
    assert stats["primary_mean"] == pytest.approx(0.75)


def test_a_mix_of_named_rewards_weighs_each(tmp_path: Path) -> None:
    batch = [_trajectory("g", 1.0, "a"), _trajectory("g", 0.0, "b")]
    settings = TrainSettings(track=False, reward_weights={"success": 2.0})
    _, stats = rows_of(batch, settings)
    assert stats["reward_mean"] == pytest.approx(1.0)
    with pytest.raises(Exception, match="no reward 'format'"):
        rows_of(batch, TrainSettings(track=False, reward_weights={"format": 1.0}))


@pytest.fixture(scope="module")
def rollout_kafka(kafka: Any) -> KafkaSettings:
    topic = kafka.create_topic("rl-rollouts-test", partitions=2)
    return KafkaSettings(bootstrap_servers=kafka.bootstrap_servers, rollouts_topic=topic)


def test_the_trainer_trains_on_the_tokens_the_gateway_recorded(
    rollout_kafka: KafkaSettings, smollm2_dir: Path
) -> None:
    import torch
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spanmill import sdk
    from spanmill.train.policy import PolicyServer, RolloutGateway

    torch.set_num_threads(2)
    task = get_task("calculator")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    policy = PolicyServer(model, tokenizer, max_tokens_limit=48)
    # What the policy generated, as it left the model's scheduler.
    generated: list[Any] = []
    submit = policy.batcher.submit

    def submit_recorded(request: Any, done: Any) -> None:
        def recorded(result: Any) -> None:
            generated.append(result)
            done(result)

        submit(request, recorded)

    policy.batcher.submit = submit_recorded  # type: ignore[method-assign]
    topic = rollout_kafka.rollouts_topic
    written = rollout_kafka.model_copy(update={"spans_topic": topic})
    sdk.configure("calculator-rollouts", kafka=written, agent_name="calculator", set_global=False)
    reader = RolloutReader(rollout_kafka, topic)
    # A record that is no spans at all, from some other writer: skipped, not fatal.
    garbage = KafkaProducer(bootstrap_servers=rollout_kafka.bootstrap_servers)
    garbage.send(topic, b"not spans").get(timeout=30)
    garbage.close()
    try:
        with RolloutGateway(policy, "calculator", written) as gateway:
            gateway.serve_version(3)
            instances = task.instances("train", 2, seed=7)
            results = run_groups(
                make_client(gateway.base_url), "calculator", task, instances, 2,
                temperature=1.0, max_tokens=48, concurrency=2,
            )  # fmt: skip
            assert all(r.error is None for r in results), [r.error for r in results]
            assert sdk.force_flush()
            batch = trajectories(reader.read(results), results)
    finally:
        reader.close()
        sdk.shutdown()

    assert len(batch) == 4 and {t.group for t in batch} == {i.id for i in instances}
    # Two episodes at a time: the last two begin only once an episode has ended, so
    # their calls begin from the kept keys and values of its (the system prompt and
    # tools at least), whether or not any episode took a second turn; the scoring
    # below holds for calls that began from kept keys and values too.
    assert policy.generator.prefix_cache.stats.reused_tokens > 0
    assert all(call.version == "3" for t in batch for call in t.calls)
    assert all(t.primary == "success" for t in batch)

    # The gateway's own records of the calls, read raw from the topic.
    consumer = KafkaConsumer(
        bootstrap_servers=rollout_kafka.bootstrap_servers, group_id=None, enable_auto_commit=False
    )
    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    recorded: dict[str, dict[str, Any]] = {}
    marked: set[str] = set()
    for records in consumer.poll(timeout_ms=5000, max_records=100_000).values():
        for record in records:
            if record.value == b"not spans":
                continue
            for span in detect_and_decode(record.value):
                attributes = span.attributes
                if sc.SPANMILL_COMPLETION_TOKEN_IDS in attributes:
                    recorded[attributes[sc.GEN_AI_RESPONSE_ID]] = attributes
                if attributes.get(sc.SPANMILL_TRAFFIC) == sc.TRAFFIC_TRAINING:
                    marked.add(span.trace_id)
    consumer.close()
    calls = [call for t in batch for call in t.calls]
    assert calls and {call.response_id for call in calls} <= set(recorded)
    assert {t.trace_id for t in batch} <= marked  # the gateway marked them as training traffic
    for call in calls:
        span = recorded[call.response_id]
        assert call.prompt_ids == list(span[sc.SPANMILL_PROMPT_TOKEN_IDS])
        assert call.completion_ids == list(span[sc.SPANMILL_COMPLETION_TOKEN_IDS])
        assert call.logprobs == list(span[sc.SPANMILL_COMPLETION_LOGPROBS])
    # ... and those are the tokens the model generated.
    sampled = {tuple(r.choices[0].token_ids) for r in generated}
    assert {tuple(call.completion_ids) for call in calls if call.completion_ids} <= sampled
    # An answer the policy ended ends with the end token it chose, which the loss below
    # scores: the policy learns when to stop, not only what to say (sampled at T 1.0 within
    # 48 tokens, a run may end none; tests/serving/test_continuous_batching.py's greedy
    # answers always do).
    ended = [c for r in generated for c in r.choices if c.finish_reason == "stop"]
    assert all(c.token_ids[-1] in policy.generator.eos_ids for c in ended)

    # The same weights score the sampled tokens as the sampler did: the ratio starts at 1.
    rows = [Row(c.prompt_ids, c.completion_ids, c.logprobs, 1.0) for c in calls if c.completion_ids]
    with torch.no_grad():
        new, mask = completion_logprobs(model, rows, tokenizer.eos_token_id, temperature=1.0)
    for i, row in enumerate(rows):
        n = len(row.completion_ids)
        scored = new[i, new.shape[1] - n :].tolist()
        assert mask[i].sum().item() == n
        assert scored == pytest.approx(row.old_logprobs, abs=2e-3)


def _settings(smollm2_dir: Path, **overrides: Any) -> TrainSettings:
    defaults: dict[str, Any] = {
        "base_model": str(smollm2_dir), "method": "grpo", "task": "calculator",
        "group_size": 2, "groups_per_step": 2, "rollout_max_tokens": 40, "max_steps": 2,
        "learning_rate": 1e-4, "batch_size": 4, "precision": "fp32",
        "num_threads": 2, "track": False, "lora_r": 4, "lora_alpha": 8,
    }  # fmt: skip
    # save_steps unset: GRPO keeps every step (SFT's default of 50 left a run of fewer
    # steps nothing to resume from).
    return TrainSettings(**{**defaults, **overrides})


class Interrupted(Exception):
    pass


def test_a_grpo_run_resumes_from_its_last_checkpoint_on_another_machine(
    rollout_kafka: KafkaSettings, smollm2_dir: Path, tmp_path: Path
) -> None:
    # Interrupted on one pod, started again on another with an empty output folder: the
    # checkpoints copied to the store as they were saved are where it resumes from.
    store = tmp_path / "store"
    settings = _settings(smollm2_dir, checkpoint_store=f"file://{store}", run_key="run/rl")
    first = tmp_path / "pod-a" / "grpo"

    def stop_after_first(step: int, stats: dict[str, float]) -> None:
        if step == 1:
            raise Interrupted

    with pytest.raises(Interrupted):
        train_grpo(first, settings, rollout_kafka, on_step=stop_after_first)
    assert (first / "checkpoints" / "step-1" / "state.json").is_file()
    assert not (first / "adapter_config.json").exists()
    assert [p.name for p in store.glob("*/step-1.complete")] == ["step-1.complete"]

    out = tmp_path / "pod-b" / "grpo"
    steps: list[int] = []
    result = train_grpo(out, settings, rollout_kafka, on_step=lambda s, _: steps.append(s))
    assert result.resumed_from_step == 1 and result.global_step == 2
    assert steps == [2]  # only the step the interrupted run had not done
    history = json.loads((out / "grpo-history.json").read_text())
    assert [h["step"] for h in history] == [1.0, 2.0]
    manifest = json.loads((out / "spanmill-train.json").read_text())
    assert manifest["method"] == "grpo" and manifest["task"] == "calculator"
    assert (out / "adapter_config.json").is_file()
    assert not (out / "checkpoints").exists()  # removed once the run finished
    assert list(store.iterdir()) == []  # and so is their copy

    with pytest.raises(TrainError, match="name the task"):
        train_grpo(tmp_path / "other", _settings(smollm2_dir, task=None), rollout_kafka)


def test_grpo_from_the_command_line(
    rollout_kafka: KafkaSettings,
    smollm2_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from spanmill.cli.main import app

    monkeypatch.setenv("SPANMILL_KAFKA_BOOTSTRAP_SERVERS", rollout_kafka.bootstrap_servers)
    monkeypatch.setenv("SPANMILL_KAFKA_ROLLOUTS_TOPIC", rollout_kafka.rollouts_topic)
    monkeypatch.setenv("SPANMILL_TRAIN_TRACK", "false")
    monkeypatch.setenv("SPANMILL_TRAIN_ROLLOUT_MAX_TOKENS", "32")
    runner = CliRunner()
    out = tmp_path / "policy"
    common = ["train", "--method", "grpo", "--base-model", str(smollm2_dir), "--steps", "1",
              "--group-size", "2", "--groups-per-step", "1", "--precision", "fp32"]  # fmt: skip
    result = runner.invoke(app, [*common, "--task", "calculator", str(out)])
    assert result.exit_code == 0, result.output
    assert "grpo adapter in" in result.output
    assert json.loads((out / "spanmill-train.json").read_text())["method"] == "grpo"
    # A dataset means supervised training; GRPO samples its own episodes.
    refused = runner.invoke(app, [*common, "--task", "calculator", str(tmp_path), str(out)])
    assert refused.exit_code != 0 and "give only OUTPUT" in _text(refused.output)
    refused = runner.invoke(app, [*common, str(tmp_path / "again")])
    assert refused.exit_code != 0 and "name the task" in _text(refused.output)


def _text(output: str) -> str:
    """The words of a message rich wrapped in a box."""
    return " ".join(output.replace("│", " ").split())
