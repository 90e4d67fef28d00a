"""Fine-tune a base model with LoRA on a spanmill dataset: checked, tracked, resumable.

``train(dataset_dir, output_dir, settings)`` is the whole job, the same function
the CLI and the pipeline component call. Folder in, folder out:

``output_dir``
    the adapter (``adapter_config.json``, ``adapter_model.safetensors``), the
    tokenizer, and ``spanmill-train.json`` (base model, dataset digest, MLflow
    run, settings, final metrics) that evaluation and registration read;
``output_dir/merged``
    the base model with the adapter merged in, when ``settings.merge``;
``output_dir/checkpoints``
    Trainer checkpoints while the run lasts. A run started again on the same
    folder resumes from the last one (same dataset and settings only) and
    continues the same MLflow run; they are removed once the run has finished.
    With ``settings.checkpoint_store`` each is also copied there as it is saved, and a
    run started again elsewhere resumes from that copy (:mod:`spanmill.train.mirror`).

Under torchrun or accelerate every process calls it (:mod:`spanmill.train.launch`
starts one per GPU): the Trainer runs data parallel from the launcher's environment,
every process checks the inputs, and only the main process logs to MLflow and
writes files.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spanmill import precision
from spanmill.contracts import CARD_FILE, TRAIN_MANIFEST_FILE, TrainManifest
from spanmill.cpus import set_torch_threads
from spanmill.errors import ModelError
from spanmill.models import resolve_model
from spanmill.precision import ServingDtype
from spanmill.train.data import TOOLS_COLUMN, TrainingData, load_training_data
from spanmill.train.errors import (
    CheckpointMismatchError,
    DatasetError,
    EmptyDatasetError,
    TrainError,
)
from spanmill.train.mirror import mirror_callback, mirror_url, restore
from spanmill.train.remote import remove
from spanmill.train.settings import TrainSettings
from spanmill.train.tracking import FiniteLoss, MetricsCallback, RunTracker, loss_curve_png

log = logging.getLogger(__name__)

MANIFEST_FILE = TRAIN_MANIFEST_FILE  # beside the adapter: the TrainManifest
CHECKPOINTS_DIRNAME = "checkpoints"
MERGED_DIRNAME = "merged"
# Written next to the checkpoints: what they were trained from, and the MLflow run.
RUN_STATE_FILE = "spanmill-run.json"
TAG_DATASET_DIGEST = "spanmill.dataset.digest"
TAG_BASE_MODEL = "spanmill.base_model"


@dataclass(frozen=True)
class TrainResult:
    """What a finished run left behind."""

    output_dir: Path
    base_model: str
    method: str
    global_step: int
    resumed_from_step: int | None
    run_id: str | None
    dataset_digest: str
    merged_dir: Path | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["output_dir"] = str(self.output_dir)
        data["merged_dir"] = str(self.merged_dir) if self.merged_dir else None
        return data

    @classmethod
    def of(cls, manifest: TrainManifest) -> TrainResult:
        """The result a run's manifest records."""
        return cls(
            output_dir=Path(manifest.output_dir),
            base_model=manifest.base_model,
            method=manifest.method,
            global_step=manifest.global_step,
            resumed_from_step=manifest.resumed_from_step,
            run_id=manifest.run_id,
            dataset_digest=manifest.dataset_digest,
            merged_dir=Path(manifest.merged_dir) if manifest.merged_dir else None,
            metrics=dict(manifest.metrics),
        )


@dataclass(frozen=True)
class _Plan:
    """Everything decided before the first tensor is allocated."""

    data: TrainingData
    method: str
    base_model: str
    checkpoints: Path
    resume_from: Path | None
    run_id: str | None
    bf16: bool
    fp16: bool


def train(
    dataset_dir: Path,
    output_dir: Path,
    settings: TrainSettings | None = None,
    *,
    metrics_path: Path | None = None,
    callbacks: Sequence[Any] = (),
) -> TrainResult:
    """Train a LoRA adapter on ``dataset_dir`` into ``output_dir``; see the module doc.

    Bad inputs (a missing or empty dataset, missing columns, a base model that
    does not exist, checkpoints from another run, an unreachable MLflow) raise a
    SpanmillError before any model is loaded. ``callbacks`` are extra
    ``transformers.TrainerCallback`` objects (progress bars, tests).
    """
    settings = settings or TrainSettings()
    output_dir = Path(output_dir)
    main = _is_main_process()
    mirror = mirror_url(settings, output_dir)
    if mirror is not None and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        # Several processes read the folder at once: their launcher restores it first.
        restore(mirror, output_dir / CHECKPOINTS_DIRNAME)
    plan = _plan(Path(dataset_dir), output_dir, settings)
    if mirror is not None and main:
        callbacks = [*callbacks, mirror_callback(mirror, plan.checkpoints)]
    tracker: RunTracker | None = None
    if settings.track and main:
        tracker = RunTracker.open(
            settings.mlflow.tracking_uri,
            settings.experiment,
            run_name=settings.run_name or f"{plan.data.name}-{plan.method}",
            tags={
                TAG_DATASET_DIGEST: plan.data.digest,
                TAG_BASE_MODEL: settings.base_model,
                "spanmill.method": plan.method,
            },
            resume_run_id=plan.run_id,
        )
    if main:
        begin_run(
            output_dir,
            plan.checkpoints,
            resuming=plan.resume_from is not None,
            state={
                "dataset_digest": plan.data.digest,
                "fingerprint": settings.training_fingerprint(),
                "run_id": tracker.run_id if tracker else None,
            },
        )
    try:
        result = _run(plan, output_dir, settings, tracker, list(callbacks))
    except BaseException as exc:
        if tracker is not None:
            interrupted = isinstance(exc, KeyboardInterrupt)
            tracker.finish("KILLED" if interrupted else "FAILED")
        raise
    if main:
        _manifest(result, settings, plan.data).write(output_dir)
        if metrics_path is not None:
            _write_json(Path(metrics_path), result.metrics)
        if tracker is not None:
            tracker.log_artifact(output_dir / MANIFEST_FILE)
            tracker.finish("FINISHED")
        if not settings.keep_checkpoints:
            shutil.rmtree(plan.checkpoints, ignore_errors=True)
            if mirror is not None:
                remove(mirror)
    return result


def begin_run(
    output_dir: Path, checkpoints: Path, *, resuming: bool, state: dict[str, Any]
) -> None:
    """Make ``output_dir`` ready for a run: no training manifest until this run writes
    its own (an earlier run's, beside weights this one is writing, would lend them its
    dataset and base model should this one fail), checkpoints kept only to resume, and
    the run's state beside them."""
    (output_dir / MANIFEST_FILE).unlink(missing_ok=True)
    if not resuming:
        # Starting over: leftovers of an earlier run would be rotated into this one's.
        shutil.rmtree(checkpoints, ignore_errors=True)
    checkpoints.mkdir(parents=True, exist_ok=True)
    _write_json(checkpoints / RUN_STATE_FILE, state)


def _plan(dataset_dir: Path, output_dir: Path, settings: TrainSettings) -> _Plan:
    data = load_training_data(dataset_dir)
    method = _method(settings, data)
    if data.weighted and settings.sample_weights and settings.packing:
        raise DatasetError(
            f"{dataset_dir} weighs its samples differently, and packing cannot apply a "
            "weight per sample; turn packing off, or sample_weights off to train unweighted"
        )
    base_model = _check_base_model(settings.base_model)
    checkpoints = output_dir / CHECKPOINTS_DIRNAME
    resume_from, run_id = _resume_point(checkpoints, data, settings)
    bf16, fp16 = _precision(settings)
    return _Plan(data, method, base_model, checkpoints, resume_from, run_id, bf16, fp16)


def _method(settings: TrainSettings, data: TrainingData) -> str:
    if settings.method == "grpo":
        raise TrainError(
            "grpo trains online, on episodes it samples, not on a dataset: "
            "spanmill train --method grpo --task TASK OUTPUT (spanmill.train.rl)"
        )
    wanted = {"sft": "sft", "preference": "dpo"}.get(data.mode)
    if wanted is None:
        raise DatasetError(
            f"{data.folder} is an {data.mode} dataset; spanmill trains on sft and preference "
            "datasets, and with RL online on the episodes it samples (method grpo)"
        )
    if settings.method != "auto" and settings.method != wanted:
        needed = "preference" if settings.method == "dpo" else "sft"
        raise DatasetError(
            f"method {settings.method} needs a {needed} dataset, and {data.folder} is a "
            f"{data.mode} dataset; set method to auto"
        )
    return wanted


def _check_base_model(ref: str) -> str:
    """The base model as from_pretrained takes it; its config must load, which costs no compute."""
    resolved = resolve_model(ref)
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(resolved)
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"base model {ref} cannot be loaded ({exc.__class__.__name__}: {exc}); "
            "pass a folder with config.json and weights, or a reachable Hugging Face id"
        ) from None
    return resolved


def _resume_point(
    checkpoints: Path, data: TrainingData, settings: TrainSettings
) -> tuple[Path | None, str | None]:
    if not settings.resume or not checkpoints.is_dir():
        return None, None
    state_path = checkpoints / RUN_STATE_FILE
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    last = _last_checkpoint(checkpoints)
    if last is None:
        return None, state.get("run_id")
    if state.get("dataset_digest") != data.digest or (
        state.get("fingerprint") != settings.training_fingerprint()
    ):
        raise CheckpointMismatchError(
            f"{checkpoints} holds checkpoints of a run on another dataset or with other "
            "settings; use another output folder, delete that one, or turn resume off"
        )
    return last, state.get("run_id")


def _last_checkpoint(checkpoints: Path) -> Path | None:
    found = [
        p
        for p in checkpoints.glob("checkpoint-*")
        if p.is_dir() and p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").is_file()
    ]
    return max(found, key=lambda p: int(p.name.split("-")[-1])) if found else None


def within_length(table: Any, tokenizer: Any, max_length: int) -> tuple[Any, int]:
    """The rows of a training table that fit ``max_length`` tokens as the chat template
    renders them (prompt and completion; prompt and the longer of chosen and rejected),
    and how many did not. TRL cuts a longer row to fit, keeping its start: a completion
    lost its end (and its end-of-turn), and a preference pair could become one answer."""
    answers = [
        table.column(name).to_pylist()
        for name in ("completion", "chosen", "rejected")
        if name in table.column_names
    ]
    offered = (
        table.column(TOOLS_COLUMN).to_pylist()
        if TOOLS_COLUMN in table.column_names
        else [None] * table.num_rows
    )
    kept = []
    rows = zip(table.column("prompt").to_pylist(), offered, *answers, strict=True)
    for prompt, tools, *replies in rows:
        texts = [
            tokenizer.apply_chat_template(
                prompt + r, tools=json.loads(tools) if tools else None, tokenize=False
            )
            for r in replies
        ]
        longest = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
        kept.append(longest <= max_length)
    over = kept.count(False)
    return (table.filter(kept) if over else table), over


def _run(
    plan: _Plan,
    output_dir: Path,
    settings: TrainSettings,
    tracker: RunTracker | None,
    callbacks: list[Any],
) -> TrainResult:
    import torch

    log.info("torch runs %d thread(s)", set_torch_threads(settings.num_threads))
    bf16, fp16 = plan.bf16, plan.fp16
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(plan.base_model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        plan.base_model, dtype=torch.bfloat16 if bf16 else torch.float32
    )
    lora = lora_config(settings)
    train_table, over = within_length(plan.data.train.table, tokenizer, settings.max_length)
    eval_table = plan.data.eval.table if plan.data.eval else None
    if eval_table is not None:
        eval_table, _ = within_length(eval_table, tokenizer, settings.max_length)
    if over:
        log.warning("%d of %d training rows are longer than max_length (%d tokens) as the "
                    "chat template renders them, and are left out: cut to fit, an answer "
                    "loses its end", over, plan.data.train.table.num_rows,
                    settings.max_length)  # fmt: skip
    if train_table.num_rows == 0:
        raise EmptyDatasetError(
            f"every training row is longer than max_length ({settings.max_length} tokens): "
            "raise max_length, or build the dataset with a lower max_tokens"
        )
    train_set = Dataset(train_table)
    eval_set = Dataset(eval_table) if eval_table is not None and settings.eval_loss else None
    metrics_callback = MetricsCallback(tracker)
    common: dict[str, Any] = {
        "output_dir": str(plan.checkpoints),
        "num_train_epochs": settings.epochs,
        "max_steps": settings.max_steps or -1,
        "per_device_train_batch_size": settings.batch_size,
        "per_device_eval_batch_size": settings.batch_size,
        "gradient_accumulation_steps": settings.gradient_accumulation_steps,
        "learning_rate": settings.learning_rate,
        "lr_scheduler_type": settings.lr_scheduler,
        "warmup_steps": settings.warmup_ratio,
        "weight_decay": settings.weight_decay,
        "max_grad_norm": settings.max_grad_norm,
        "max_length": settings.max_length,
        "seed": settings.seed,
        "data_seed": settings.seed,
        "bf16": bf16,
        "fp16": fp16,
        "activation_checkpointing": settings.gradient_checkpointing,
        "logging_steps": settings.logging_steps,
        "logging_nan_inf_filter": False,  # FiniteLoss must see them
        "save_strategy": "steps",
        "save_steps": settings.save_steps,
        "save_total_limit": settings.save_total_limit,
        "eval_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": not torch.cuda.is_available(),
        "ddp_find_unused_parameters": False,
        "dataloader_num_workers": 0,
    }
    if plan.method == "dpo":
        from trl import DPOConfig, DPOTrainer

        trainer: Any = DPOTrainer(
            model=model,
            args=DPOConfig(**common, beta=settings.dpo_beta),
            train_dataset=train_set,
            eval_dataset=eval_set,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=[metrics_callback, FiniteLoss(fp16=fp16), *callbacks],
        )
    else:
        from trl import SFTConfig

        from spanmill.train.sft import SpanmillSFTTrainer

        weighted = plan.data.weighted and settings.sample_weights
        if not weighted:
            train_set = train_set.remove_columns("weight")
            eval_set = eval_set.remove_columns("weight") if eval_set is not None else None
        trainer = SpanmillSFTTrainer(
            model=model,
            args=SFTConfig(**common, packing=settings.packing, completion_only_loss=True),
            train_dataset=train_set,
            eval_dataset=eval_set,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=[metrics_callback, FiniteLoss(fp16=fp16), *callbacks],
            weighted=weighted,
            scored_logits_only=not torch.cuda.is_available(),
        )
    from transformers import PrinterCallback

    # Progress goes to the caller's callbacks and to logging, not to stdout as dicts.
    trainer.remove_callback(PrinterCallback)
    trainable, total = trainer.model.get_nb_trainable_parameters()
    if tracker is not None:
        tracker.log_params(
            {
                **settings.as_params(),
                "method": plan.method,
                "base_model_path": plan.base_model,
                "dataset": str(plan.data.folder),
                "dataset_digest": plan.data.digest,
                "dataset_mode": plan.data.mode,
                "train_rows": str(plan.data.train.rows),
                "eval_rows": str(plan.data.eval.rows if plan.data.eval else 0),
                "sample_weights_applied": str(plan.method == "sft" and plan.data.weighted),
                "trainable_parameters": str(trainable),
                "total_parameters": str(total),
                "world_size": str(trainer.args.world_size),
            }
        )
        tracker.log_dataset(plan.data)
        if plan.data.card:
            tracker.log_dict(plan.data.card.to_json(), f"dataset/{CARD_FILE}")

    started = time.perf_counter()
    resumed_from = _step_of(plan.resume_from)
    output = trainer.train(
        resume_from_checkpoint=str(plan.resume_from) if plan.resume_from else None
    )
    seconds = time.perf_counter() - started
    metrics: dict[str, float] = {
        "train_loss": float(output.training_loss),
        "train_runtime_s": seconds,
        "global_step": float(trainer.state.global_step),
        "trainable_parameters": float(trainable),
    }
    tokens = _total_tokens(trainer)
    if tokens:
        metrics["train_tokens_per_second"] = tokens / seconds
    if eval_set is not None:
        evaluated = trainer.evaluate()
        metrics["eval_loss"] = float(evaluated["eval_loss"])
    metrics["peak_rss_mb"] = _peak_rss_mb()

    merged_dir = None
    if trainer.is_world_process_zero():
        output_dir.mkdir(parents=True, exist_ok=True)
        trainer.model.save_pretrained(str(output_dir))
        tokenizer.save_pretrained(str(output_dir))
        if settings.merge:
            merged_dir = output_dir / MERGED_DIRNAME
            merged = trainer.model.merge_and_unload()
            merged.save_pretrained(str(merged_dir))
            tokenizer.save_pretrained(str(merged_dir))
        if tracker is not None:
            tracker.log_metrics(metrics, trainer.state.global_step)
            curve = loss_curve_png(
                trainer.state.log_history,
                plan.checkpoints / "loss_curve.png",
                f"{plan.method} on {plan.data.name}",
            )
            if curve is not None:
                tracker.log_artifact(curve, "plots")
            adapter_files = [
                p for p in output_dir.iterdir() if p.is_file() and p.name != MANIFEST_FILE
            ]
            for path in adapter_files:
                tracker.log_artifact(path, "adapter")
    return TrainResult(
        output_dir=output_dir,
        base_model=plan.base_model,
        method=plan.method,
        global_step=trainer.state.global_step,
        resumed_from_step=resumed_from,
        run_id=tracker.run_id if tracker else None,
        dataset_digest=plan.data.digest,
        merged_dir=merged_dir,
        metrics=metrics,
    )


def lora_config(settings: TrainSettings) -> Any:
    """The PEFT LoRA configuration of a run's settings (SFT, DPO and GRPO alike)."""
    from peft import LoraConfig

    return LoraConfig(
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=(
            "all-linear" if settings.target_modules == ["all-linear"] else settings.target_modules
        ),
        task_type="CAUSAL_LM",
    )


_FORMATS: dict[str, ServingDtype] = {
    "auto": "auto", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"
}  # fmt: skip


def _precision(settings: TrainSettings) -> tuple[bool, bool]:
    """(bf16, fp16) on the device training runs on: auto is bf16 where it is native."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if settings.precision == "fp16" and device == "cpu":
        raise TrainError("precision fp16 needs a GPU; use fp32 or bf16 on a CPU")
    dtype = precision.resolve(_FORMATS[settings.precision], device)
    return dtype == "bfloat16", dtype == "float16"


def _total_tokens(trainer: Any) -> float:
    for entry in reversed(trainer.state.log_history):
        if "num_tokens" in entry:
            return float(entry["num_tokens"])
    return 0.0


def _step_of(checkpoint: Path | None) -> int | None:
    return int(checkpoint.name.split("-")[-1]) if checkpoint is not None else None


def _is_main_process() -> bool:
    # torchrun and accelerate both set RANK; a plain process is rank 0.
    return int(os.environ.get("RANK", "0")) == 0


def _peak_rss_mb() -> float:
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    return peak_kb / (1024 * 1024) if sys.platform == "darwin" else peak_kb / 1024


def _manifest(result: TrainResult, settings: TrainSettings, data: TrainingData) -> TrainManifest:
    return TrainManifest(
        **result.to_json(),
        dataset=str(data.folder),
        dataset_mode=data.mode,
        dataset_card=data.card,
        tracking_uri=settings.mlflow.tracking_uri if result.run_id else None,
        settings=settings.model_dump(mode="json", exclude={"mlflow"}),
    )


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
