"""GRPO on LoRA over live rollouts of the agent's own episode code.

``train_grpo(output_dir, settings, kafka)`` is the whole job (``spanmill train
--method grpo``, the pipeline's ``train_rl`` step). Each step:

1. the policy being trained answers a gateway of its own
   (:class:`~spanmill.train.policy.RolloutGateway`) as version ``step + 1``;
2. ``groups_per_step`` training instances of the task are each run
   ``group_size`` times by the task's episode code, sampling at
   ``rollout_temperature`` (:func:`~spanmill.train.rollouts.run_groups`);
3. their spans are read back from the rollout topic and assembled into
   trajectories by the dataset builder's code
   (:func:`~spanmill.train.rollouts.trajectories`);
4. each episode's reward (:func:`~spanmill.train.grpo.weighted_rewards`) gives an
   advantage relative to its group (:func:`~spanmill.train.grpo.group_advantages`);
5. one optimizer step on the clipped loss (:func:`~spanmill.train.grpo.grpo_loss`)
   over the completion tokens of every call, with importance ratios against the
   logprobs recorded at sampling time.

Each LLM call is one row: the prompt the model was given (tool results and
earlier turns included, as the chat template rendered them) is context with
mask 0, the tokens it sampled carry the episode's advantage. With the loss
normalised over the batch's completion tokens this is the multi-turn episode
loss, and each turn is scored in exactly the context it was sampled in.

TRL's ``GRPOTrainer`` samples its own completions from a dataset of prompts;
here the agent's code samples, through the gateway, so the loop is spanmill's
and the numbers are :mod:`spanmill.train.grpo`'s (which follows TRL's
definitions). Where it differs from TRL: groups whose rewards are all equal are
left out of the forward pass (their gradient is exactly 0; the loss is then a
mean over the tokens that carry a signal), and dropout is off while the loss is
computed, so that the ratio compares the policy with itself and not with a
dropped-out copy. The end-of-turn token is not trained: the gateway records
the tokens up to it, not the token itself.

Checkpoints (adapter, optimizer, scheduler, step, history) go to
``output_dir/checkpoints/step-N`` every ``save_steps`` (GRPO_RECIPE: every step) and at
the end; a run started again on the same folder with the same settings resumes from the
last.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from spanmill import semconv as sc
from spanmill.config import KafkaSettings
from spanmill.contracts import TrainManifest
from spanmill.cpus import set_torch_threads
from spanmill.tasks.base import Task, get_task
from spanmill.tasks.runner import EpisodeResult
from spanmill.train.data import files_digest
from spanmill.train.errors import CheckpointMismatchError, RewardError, TrainError
from spanmill.train.grpo import (
    group_advantages,
    grpo_loss,
    weighted_rewards,
)
from spanmill.train.mirror import copy_checkpoints, mirror_url, restore
from spanmill.train.remote import remove
from spanmill.train.rollouts import Trajectory
from spanmill.train.settings import TrainSettings
from spanmill.train.trainer import (
    CHECKPOINTS_DIRNAME,
    MANIFEST_FILE,
    RUN_STATE_FILE,
    TAG_BASE_MODEL,
    TrainResult,
    _check_base_model,
    _peak_rss_mb,
    _precision,
    _write_json,
    begin_run,
    lora_config,
)

log = logging.getLogger(__name__)

STEP_PREFIX = "step-"
STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
DEFAULT_STEPS = 20

StepCallback = Callable[[int, dict[str, float]], None]


@dataclass(frozen=True)
class Row:
    """One LLM call to train on: its tokens, the sampler's logprobs, its episode's advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float


def rows_of(
    batch: Sequence[Trajectory], settings: TrainSettings
) -> tuple[list[Row], dict[str, float]]:
    """The rows of the groups whose episodes differ, and the rollout's reward stats."""
    weights = settings.reward_weights
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in batch:
        groups[trajectory.group].append(trajectory)
    rows: list[Row] = []
    rewards_seen: list[float] = []
    primaries: list[float] = []
    informative = 0
    for members in groups.values():
        primary = members[0].primary
        if weights is None and primary is None:
            raise RewardError(
                "the episodes' rewards mark none as primary; set reward_weights to name one"
            )
        mix = weights if weights is not None else {str(primary): 1.0}
        rewards = weighted_rewards([t.rewards for t in members], mix)
        rewards_seen.extend(rewards)
        if primary is not None:
            primaries.extend(float(t.rewards.get(primary, 0.0)) for t in members)
        advantages = group_advantages(rewards, scale_rewards=settings.scale_rewards)
        if not any(advantages):
            continue
        before = len(rows)
        for trajectory, advantage in zip(members, advantages, strict=True):
            for call in trajectory.calls:
                if call.completion_ids:
                    rows.append(Row(call.prompt_ids, call.completion_ids, call.logprobs, advantage))
        informative += len(rows) > before  # rewards that differ, on calls to learn from
    stats = {
        "reward_mean": fmean(rewards_seen) if rewards_seen else 0.0,
        "primary_mean": fmean(primaries) if primaries else 0.0,
        "groups": float(len(groups)),
        "groups_with_signal": float(informative),
    }
    return rows, stats


def completion_logprobs(
    model: Any, rows: Sequence[Row], pad_id: int, temperature: float
) -> tuple[Any, Any]:
    """Per-token logprobs of each row's completion under ``model``, and the mask.

    Rows are left-padded, with position ids counted from each row's first real
    token (as generation counts them), so a row's numbers do not depend on its
    neighbours; only the completion positions' logits are computed.
    """
    import torch

    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    keep = max(len(r.completion_ids) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    targets = torch.full((len(rows), keep), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), keep), dtype=torch.long)
    for i, row in enumerate(rows):
        ids = row.prompt_ids + row.completion_ids
        input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention[i, width - len(ids) :] = 1
        n = len(row.completion_ids)
        targets[i, keep - n :] = torch.tensor(row.completion_ids, dtype=torch.long)
        mask[i, keep - n :] = 1
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    device = next(model.parameters()).device
    out = model(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        logits_to_keep=keep + 1,
    )
    # The logits at position t predict token t + 1: the last keep + 1 positions' first
    # keep logits predict the last keep tokens.
    logits = out.logits[:, :-1, :].float() / temperature
    logps = torch.log_softmax(logits, dim=-1)
    per_token = torch.gather(logps, 2, targets.to(device).unsqueeze(-1)).squeeze(-1)
    return per_token, mask.to(device)


def _aligned(rows: Sequence[Row], keep: int) -> Any:
    import torch

    old = torch.zeros((len(rows), keep), dtype=torch.float32)
    for i, row in enumerate(rows):
        n = len(row.old_logprobs)
        old[i, keep - n :] = torch.tensor(row.old_logprobs, dtype=torch.float32)
    return old


def grpo_step(
    model: Any,
    optimizer: Any,
    rows: Sequence[Row],
    settings: TrainSettings,
    pad_id: int,
    reference: Any = None,
) -> dict[str, float]:
    """One optimizer step over ``rows``, in micro-batches of ``batch_size`` rows."""
    import torch

    total = sum(len(r.completion_ids) for r in rows)
    sums: dict[str, float] = defaultdict(float)
    optimizer.zero_grad(set_to_none=True)
    for start in range(0, len(rows), settings.batch_size):
        chunk = rows[start : start + settings.batch_size]
        tokens = sum(len(r.completion_ids) for r in chunk)
        per_token, mask = completion_logprobs(model, chunk, pad_id, settings.rollout_temperature)
        old = _aligned(chunk, per_token.shape[1]).to(per_token.device)
        ref = None
        if reference is not None:
            with torch.no_grad():
                ref, _ = completion_logprobs(reference, chunk, pad_id, settings.rollout_temperature)
        advantages = torch.tensor([r.advantage for r in chunk], device=per_token.device)
        loss, stats = grpo_loss(
            per_token, old, mask, advantages,
            epsilon_low=settings.epsilon_low, epsilon_high=settings.epsilon_high,
            ref_per_token_logps=ref, beta=settings.beta,
        )  # fmt: skip
        (loss * tokens / total).backward()
        sums["loss"] += loss.item() * tokens / total
        for key, value in stats.items():
            sums[key] += value * tokens / total
    norm = torch.nn.utils.clip_grad_norm_(
        [p for p in model.parameters() if p.requires_grad], settings.max_grad_norm
    )
    if not math.isfinite(sums["loss"]) or not math.isfinite(float(norm)):
        # Clipping does not mend a NaN: the step would write it into every weight.
        optimizer.zero_grad(set_to_none=True)
        raise TrainError(
            f"GRPO's loss ({sums['loss']}) or gradient norm ({float(norm)}) is not finite; "
            "nothing was applied. Check the rewards and the sampler's logprobs, or lower "
            "the learning rate"
        )
    optimizer.step()
    return {**sums, "grad_norm": float(norm), "tokens": float(total), "rows": float(len(rows))}


def episodes_finished(step: int, results: Sequence[EpisodeResult]) -> list[EpisodeResult]:
    """The step's episodes that ran to their end; TrainError when none did (a step over
    no episode trains nothing, and a run of such steps would be reported as trained)."""
    finished = [r for r in results if r.error is None]
    if results and not finished:
        errors = Counter(str(r.error) for r in results)
        common = "; ".join(f"{error} ({n}x)" for error, n in errors.most_common(3))
        raise TrainError(
            f"GRPO step {step}: all {len(results)} episodes failed, e.g. {common}; check "
            "the agent's episode code and the policy's gateway"
        )
    return finished


def train_grpo(
    output_dir: Path,
    settings: TrainSettings,
    kafka: KafkaSettings,
    *,
    on_step: StepCallback | None = None,
) -> TrainResult:
    """Train the policy with GRPO into ``output_dir``; see the module doc."""
    if settings.task is None:
        raise TrainError("GRPO samples a task's episodes: name the task (--task calculator)")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Each rank would run its own rollouts, gateway and MLflow run on the first GPU,
        # with no gradients shared, and all of them write the one output folder.
        raise TrainError(
            "GRPO trains in one process on one GPU; run it without torchrun "
            f"(WORLD_SIZE is {os.environ['WORLD_SIZE']})"
        )
    if settings.precision == "fp16":
        # float16 weights with no loss scaling: small gradients vanish, large ones stop
        # the run; bf16 (auto, where the GPU has it) or fp32 train as asked.
        raise TrainError("GRPO does not train in fp16: use bf16, fp32 or auto")
    task = get_task(settings.task)
    _check_init_base(settings)
    base_model = _check_base_model(settings.base_model)
    if (
        settings.init_adapter
        and not (Path(settings.init_adapter) / "adapter_config.json").is_file()
    ):
        raise TrainError(
            f"init adapter {settings.init_adapter} has no adapter_config.json; pass the "
            "output folder of an SFT run"
        )
    steps = settings.max_steps or DEFAULT_STEPS
    output_dir = Path(output_dir)
    checkpoints = output_dir / CHECKPOINTS_DIRNAME
    mirror = mirror_url(settings, output_dir)
    if mirror is not None:  # a run started again elsewhere resumes from the copy
        restore(mirror, checkpoints, STEP_PREFIX)
        step_done = on_step

        def on_step(step: int, stats: dict[str, float]) -> None:
            # After a step that saved nothing, only the run state is sent again.
            copy_checkpoints(checkpoints, mirror, step, STEP_PREFIX)
            if step_done is not None:
                step_done(step, stats)

    resume_from, run_id = _resume_point(checkpoints, settings)
    tracker = None
    if settings.track:
        from spanmill.train.tracking import RunTracker

        tracker = RunTracker.open(
            settings.mlflow.tracking_uri,
            settings.experiment,
            run_name=settings.run_name or f"{task.name}-grpo",
            tags={TAG_BASE_MODEL: settings.base_model, "spanmill.method": "grpo"},
            resume_run_id=run_id,
        )
    begin_run(
        output_dir,
        checkpoints,
        resuming=resume_from is not None,
        state={
            "fingerprint": settings.training_fingerprint(),
            "init_adapter": _adapter_digest(settings.init_adapter),
            "run_id": tracker.run_id if tracker else None,
        },
    )
    log.info("torch runs %d thread(s)", set_torch_threads(settings.num_threads))
    try:
        result = _run(
            task, base_model, output_dir, checkpoints, resume_from, steps, settings, kafka,
            tracker, on_step,
        )  # fmt: skip
    except BaseException as exc:
        if tracker is not None:
            tracker.finish("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    _manifest(result, settings, task).write(output_dir)
    if tracker is not None:
        tracker.log_artifact(output_dir / MANIFEST_FILE)
        tracker.finish("FINISHED")
    if not settings.keep_checkpoints:
        shutil.rmtree(checkpoints, ignore_errors=True)
        if mirror is not None:
            remove(mirror)
    return result


def placement(settings: TrainSettings) -> tuple[str, Any]:
    """Where the policy lives and in which dtype: the first GPU when there is one, where
    it both generates and trains; else the CPU. The format is the precision setting's, auto
    being bf16 where the device computes it natively (``spanmill.precision``), else fp32."""
    import torch

    bf16, fp16 = _precision(settings)
    dtype = torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32
    return ("cuda" if torch.cuda.is_available() else "cpu"), dtype


def _resume_point(checkpoints: Path, settings: TrainSettings) -> tuple[Path | None, str | None]:
    if not settings.resume or not checkpoints.is_dir():
        return None, None
    state_path = checkpoints / RUN_STATE_FILE
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    done = [
        p
        for p in checkpoints.glob(f"{STEP_PREFIX}*")
        if p.name[len(STEP_PREFIX) :].isdigit() and (p / STATE_FILE).is_file()
    ]
    if not done:
        return None, state.get("run_id")
    if state.get("fingerprint") != settings.training_fingerprint():
        raise CheckpointMismatchError(
            f"{checkpoints} holds checkpoints of a run with other settings; use another "
            "output folder, delete that one, or turn resume off"
        )
    if "init_adapter" not in state and settings.init_adapter:
        raise CheckpointMismatchError(
            f"{checkpoints} holds checkpoints that do not record which weights of "
            f"{settings.init_adapter} they started from (an earlier spanmill's); use another "
            "output folder, delete that one, or turn resume off"
        )
    if state.get("init_adapter") != _adapter_digest(settings.init_adapter):
        # The settings name the same folder, but what is in it was trained again: its
        # checkpoints grew from the other weights, and its manifest's lineage would be
        # recorded for them.
        raise CheckpointMismatchError(
            f"{checkpoints} holds checkpoints of a run that started from other weights "
            f"than {settings.init_adapter} holds now; use another output folder, delete "
            "that one, or turn resume off"
        )
    last = max(done, key=lambda p: int(p.name[len(STEP_PREFIX) :]))
    return last, state.get("run_id")


def _adapter_digest(folder: str | None) -> str | None:
    """What tells one adapter's weights from another's in the same folder: a hash of its
    config and weight files (a LoRA adapter is megabytes)."""
    if not folder:
        return None
    return files_digest(Path(folder), sorted(p.name for p in Path(folder).glob("adapter_*")))


def _load_policy(base_model: str, settings: TrainSettings, dtype: Any, start: Path | None) -> Any:
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype)
    adapter = str(start) if start is not None else settings.init_adapter
    if adapter:
        return PeftModel.from_pretrained(model, adapter, is_trainable=True)
    return get_peft_model(model, lora_config(settings))


def _load_reference(base_model: str, settings: TrainSettings, dtype: Any) -> Any:
    """The start policy, frozen: the base model with the init adapter merged in."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype)
    if settings.init_adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, settings.init_adapter).merge_and_unload()
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def _run(
    task: Task,
    base_model: str,
    output_dir: Path,
    checkpoints: Path,
    resume_from: Path | None,
    steps: int,
    settings: TrainSettings,
    kafka: KafkaSettings,
    tracker: Any,
    on_step: StepCallback | None,
) -> TrainResult:
    import torch
    from transformers import AutoTokenizer, get_scheduler

    from spanmill import sdk
    from spanmill.tasks.runner import make_client
    from spanmill.train.policy import PolicyServer, RolloutGateway
    from spanmill.train.rollouts import RolloutReader, run_groups, trajectories

    device, dtype = placement(settings)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    model = _load_policy(base_model, settings, dtype, resume_from).to(device)
    reference = _load_reference(base_model, settings, dtype).to(device) if settings.beta else None
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=settings.learning_rate, weight_decay=settings.weight_decay
    )
    scheduler = get_scheduler(
        settings.lr_scheduler,
        optimizer,
        num_warmup_steps=math.ceil(settings.warmup_ratio * steps),
        num_training_steps=steps,
    )
    start, history = 0, []
    if resume_from is not None:
        state = json.loads((resume_from / STATE_FILE).read_text())
        start, history = int(state["step"]), list(state["history"])
        optimizer.load_state_dict(torch.load(resume_from / OPTIMIZER_FILE, weights_only=True))
        scheduler.load_state_dict(torch.load(resume_from / SCHEDULER_FILE, weights_only=True))
        log.info("resuming GRPO at step %d from %s", start, resume_from)
    if tracker is not None and resume_from is None:
        tracker.log_params(
            {**settings.as_params(), "method": "grpo", "base_model_path": base_model,
             "task": task.name}
        )  # fmt: skip

    # Every step's instances are drawn up front from the task's training split, so a
    # resumed run samples the instances the interrupted one would have.
    instances = task.instances("train", steps * settings.groups_per_step, settings.seed)
    rollout_kafka = kafka.model_copy(update={"spans_topic": kafka.rollouts_topic})
    policy = PolicyServer(model, tokenizer, max_tokens_limit=settings.rollout_max_tokens)
    sdk.configure(
        f"{task.agent_name}-rollouts",
        kafka=rollout_kafka,
        agent_name=task.agent_name,
        resource_attributes={sc.SPANMILL_TRAFFIC: sc.TRAFFIC_TRAINING},
        set_global=False,
    )
    reader = RolloutReader(kafka, kafka.rollouts_topic)
    gateway = RolloutGateway(policy, task.agent_name, rollout_kafka).start()
    client = make_client(gateway.base_url)
    episodes_per_step = settings.groups_per_step * settings.group_size
    started = time.perf_counter()
    try:
        for step in range(start, steps):
            chosen = instances[
                step * settings.groups_per_step : (step + 1) * settings.groups_per_step
            ]
            gateway.serve_version(step + 1)
            model.eval()
            seed = settings.seed * 100_003 + step
            torch.manual_seed(seed)
            random.seed(seed)
            reader.mark()
            clock = time.perf_counter()
            results = run_groups(
                client, task.agent_name, task, chosen, settings.group_size,
                temperature=settings.rollout_temperature,
                max_tokens=settings.rollout_max_tokens,
                concurrency=settings.rollout_concurrency or episodes_per_step,
                timeout_s=settings.rollout_timeout_s,
            )  # fmt: skip
            stopped = policy.hold()
            if stopped:
                log.info("GRPO step %d: %d calls of abandoned episodes stopped", step + 1, stopped)
            finished = episodes_finished(step + 1, results)
            if not sdk.force_flush():
                raise TrainError("the episodes' spans were not all written to the rollout topic")
            batch = trajectories(reader.read(finished), finished)
            rollout_s = time.perf_counter() - clock
            rows, stats = rows_of(batch, settings)
            clock = time.perf_counter()
            if rows:
                stats.update(grpo_step(model, optimizer, rows, settings, pad_id, reference))
            else:  # every group agreed: nothing to learn from this step's episodes
                optimizer.step()  # no parameter has a gradient: a no-op the schedule counts
                stats.update({"loss": 0.0, "rows": 0.0, "tokens": 0.0})
            scheduler.step()
            stats.update(
                step=float(step + 1),
                seed=float(seed),
                rollout_s=rollout_s,
                train_s=time.perf_counter() - clock,
                episodes_per_s=len(results) / rollout_s,
                failed_episodes=float(len(results) - len(finished)),
                learning_rate=float(scheduler.get_last_lr()[0]),
            )
            history.append(stats)
            log.info(
                "GRPO step %d/%d: reward %.3f, %d/%d groups with signal, loss %.4f, "
                "rollout %.1fs, train %.1fs",
                step + 1, steps, stats["reward_mean"], int(stats["groups_with_signal"]),
                int(stats["groups"]), stats["loss"], stats["rollout_s"], stats["train_s"],
            )  # fmt: skip
            if (step + 1) % settings.save_steps == 0 or step + 1 == steps:
                _save_checkpoint(checkpoints, step + 1, model, optimizer, scheduler, history)
            if tracker is not None:
                tracker.log_metrics(
                    {k: v for k, v in stats.items() if k not in ("step", "seed")}, step + 1
                )
            if on_step is not None:
                on_step(step + 1, stats)
    finally:
        gateway.stop()
        reader.close()
        sdk.shutdown()
    seconds = time.perf_counter() - started
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(output_dir))
    tokenizer.save_pretrained(str(output_dir))
    trained = history[start:] if len(history) > start else history
    metrics: dict[str, float] = {
        "train_runtime_s": seconds,
        "global_step": float(steps),
        "peak_rss_mb": _peak_rss_mb(),
        "trainable_parameters": float(sum(p.numel() for p in trainable)),
    }
    # Steps that changed the weights: a run of none (every group tied, or no call to
    # learn from) ends with the adapter it began with, and says so.
    metrics["steps_with_signal"] = float(sum(h.get("rows", 0.0) > 0 for h in trained))
    if trained and not metrics["steps_with_signal"]:
        log.error("GRPO: no step of this run had a group whose rewards differed; the "
                  "adapter is the one it started from")  # fmt: skip
    if trained:
        metrics["reward_mean_first"] = trained[0]["reward_mean"]
        metrics["reward_mean_last"] = trained[-1]["reward_mean"]
        metrics["step_s"] = fmean(h["rollout_s"] + h["train_s"] for h in trained)
        metrics["episodes_per_s"] = fmean(h["episodes_per_s"] for h in trained)
    if tracker is not None:
        tracker.log_metrics(metrics, steps)
    _write_json(output_dir / "grpo-history.json", history)
    return TrainResult(
        output_dir=output_dir,
        base_model=base_model,
        method="grpo",
        global_step=steps,
        resumed_from_step=start if resume_from is not None else None,
        run_id=tracker.run_id if tracker else None,
        dataset_digest="",
        metrics=metrics,
    )


def _save_checkpoint(
    checkpoints: Path, step: int, model: Any, optimizer: Any, scheduler: Any, history: list[Any]
) -> None:
    """Written to a temporary folder, then renamed: a checkpoint is whole or absent."""
    import torch

    final = checkpoints / f"{STEP_PREFIX}{step}"
    partial = checkpoints / f".{STEP_PREFIX}{step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial))
    torch.save(optimizer.state_dict(), partial / OPTIMIZER_FILE)
    torch.save(scheduler.state_dict(), partial / SCHEDULER_FILE)
    _write_json(partial / STATE_FILE, {"step": step, "history": history})
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    for older in checkpoints.glob(f"{STEP_PREFIX}*"):
        if older != final and older.name[len(STEP_PREFIX) :].isdigit():
            shutil.rmtree(older, ignore_errors=True)


def _check_init_base(settings: TrainSettings) -> None:
    """The init adapter learnt on the base this run is asked for: PEFT loads an adapter
    onto any base of its shape without a word, and the manifest would then pair it with
    a base it never saw (evaluation and serving alike)."""
    if not settings.init_adapter:
        return
    start = TrainManifest.read_if_present(settings.init_adapter)
    trained_on = start.asked_base_model() if start is not None else ""
    if trained_on and trained_on != settings.base_model:
        raise TrainError(
            f"init adapter {settings.init_adapter} was trained on {trained_on}, and this "
            f"run is asked for {settings.base_model}: train from that base (--base-model "
            f"{trained_on}), or from another adapter"
        )


def _manifest(result: TrainResult, settings: TrainSettings, task: Task) -> TrainManifest:
    """The run's manifest; after SFT, the dataset the start adapter learnt from stays in the
    lineage (``dataset``, ``dataset_digest``), and that run's manifest is kept whole."""
    start = TrainManifest.read_if_present(settings.init_adapter) if settings.init_adapter else None
    return TrainManifest(
        **{**result.to_json(), "dataset_digest": (start or result).dataset_digest},
        dataset=start.dataset if start else None,
        init_manifest=start,
        dataset_mode="rl",
        task=task.name,
        init_adapter=settings.init_adapter,
        tracking_uri=settings.mlflow.tracking_uri if result.run_id else None,
        settings=settings.model_dump(mode="json", exclude={"mlflow"}),
    )
