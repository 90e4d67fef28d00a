"""MLflow for a training run: the run itself, per-step metrics, the dataset input, pictures.

Only the main process of a distributed run talks to MLflow; the others get no
tracker. The tracker uses an explicit :class:`~mlflow.MlflowClient` and run id,
never mlflow's global active run, so a library caller's own runs are untouched.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spanmill.train.data import TrainingData
from spanmill.train.errors import TrainError

logger = logging.getLogger(__name__)

# Trainer log keys that are run summaries, not step metrics.
_SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second"})


class RunTracker:
    """One MLflow run, created or reopened, written to through an explicit client.

    A tracker that only adds to someone else's run (evaluation logging into the
    challenger's training run) leaves that run's status alone.
    """

    def __init__(self, tracking_uri: str, run_id: str, *, owns_status: bool = True) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri)
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.owns_status = owns_status
        self._metrics = _MetricSender(self._send_metrics)

    @classmethod
    def open(
        cls,
        tracking_uri: str,
        experiment: str,
        *,
        run_name: str | None,
        tags: Mapping[str, str],
        resume_run_id: str | None = None,
        add_to_existing: bool = False,
    ) -> RunTracker:
        """Create a run, or continue ``resume_run_id`` (marked running again, unless only
        ``add_to_existing``); fails fast when MLflow is unreachable."""
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        client = MlflowClient(tracking_uri)
        try:
            if resume_run_id:
                try:
                    client.get_run(resume_run_id)
                    if add_to_existing:
                        return cls(tracking_uri, resume_run_id, owns_status=False)
                    client.update_run(resume_run_id, status="RUNNING")
                    return cls(tracking_uri, resume_run_id)
                except MlflowException:
                    pass  # the run is gone (another server, a wiped store): start a new one
            found = client.get_experiment_by_name(experiment)
            experiment_id = (
                found.experiment_id if found is not None else client.create_experiment(experiment)
            )
            run = client.create_run(experiment_id, run_name=run_name, tags=dict(tags))
        except MlflowException as exc:
            raise TrainError(
                f"cannot use MLflow at {tracking_uri}: {exc.message}; start it (spanmill up) or "
                "set SPANMILL_MLFLOW_TRACKING_URI, or train without tracking"
            ) from None
        except OSError as exc:
            raise TrainError(
                f"cannot reach MLflow at {tracking_uri}: {exc}; start it (spanmill up) or set "
                "SPANMILL_MLFLOW_TRACKING_URI, or train without tracking"
            ) from None
        return cls(tracking_uri, run.info.run_id)

    def log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        # Params are write-once: a resumed run logged them already.
        known = self.client.get_run(self.run_id).data.params
        fresh = [Param(k, v[:6000]) for k, v in params.items() if k not in known]
        for start in range(0, len(fresh), 100):
            self.client.log_batch(self.run_id, params=fresh[start : start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Best effort: MLflow gone mid-run costs the step's metrics, never the training.
        Sent from a thread of the tracker's own: a step never waits for MLflow's answer
        (:meth:`finish` waits for what is still on its way, within a bound)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [
            Metric(key, float(value), now, step)
            for key, value in metrics.items()
            if isinstance(value, int | float) and math.isfinite(value)
        ]
        if entries:
            self._metrics.put(step, entries)

    def _send_metrics(self, entries: list[Any]) -> None:
        for start in range(0, len(entries), 1000):  # MLflow takes 1,000 a batch
            self.client.log_batch(self.run_id, metrics=entries[start : start + 1000])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)

    def log_dataset(self, data: TrainingData, context: str = "train") -> None:
        """The dataset as the run's input: its name, digest, source folder and card summary."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        summary = {
            "mode": data.mode,
            "train_rows": data.train.rows,
            "eval_rows": data.eval.rows if data.eval else 0,
            "counts": data.card.counts if data.card else None,
            "span_window": data.card.to_json()["span_window"] if data.card else None,
        }
        dataset = Dataset(
            name=data.name,
            digest=data.digest[:36],
            source_type="local" if "://" not in str(data.folder) else "external",
            source=json.dumps({"uri": str(data.folder.resolve())}),
            profile=json.dumps(summary, default=str),
        )
        tags = [InputTag("mlflow.data.context", context)]
        self.client.log_inputs(self.run_id, datasets=[DatasetInput(dataset, tags)])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Best effort: what is logged is a copy of what the run wrote in its folder."""
        log = self.client.log_artifacts if path.is_dir() else self.client.log_artifact
        _quietly(f"the artifact {path.name}", log, self.run_id, str(path), artifact_path)

    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        self.client.log_dict(self.run_id, dict(data), artifact_file)

    def finish(self, status: str) -> None:
        """Best effort: a run that ended (or failed, with its own error to tell) is not
        undone, nor its error hidden, by an MLflow that cannot be told."""
        # The metrics still on their way first, so a finished run holds all of them.
        self._metrics.close(FINISH_WAIT_S)
        if self.owns_status:
            _quietly(f"the run's status {status}", self.client.set_terminated, self.run_id,
                     status=status)  # fmt: skip


# How long a run's end waits for its metrics still on their way to MLflow.
FINISH_WAIT_S = 120.0


class _MetricSender:
    """A run's metrics sent one batch at a time from a daemon thread of its own. What
    steps log while a batch is on its way waits, and goes with the next: a step never
    waits for MLflow, and an MLflow that has gone quiet holds one batch, not a queue of
    them that the process must wait out at its exit (MLflow's own asynchronous logging
    sends every one it queued before the process may end)."""

    def __init__(self, send: Callable[[list[Any]], None]) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._waiting: list[tuple[int, list[Any]]] = []
        self._idle = threading.Event()
        self._idle.set()

    def put(self, step: int, entries: list[Any]) -> None:
        with self._lock:
            self._waiting.append((step, entries))
            if not self._idle.is_set():
                return  # the thread sending takes it with its next batch
            self._idle.clear()
        threading.Thread(target=self._run, name="mlflow-metrics", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._lock:
                batch, self._waiting = self._waiting, []
                if not batch:
                    self._idle.set()
                    return
            try:
                self._send([entry for _, entries in batch for entry in entries])
            except Exception as exc:
                steps = sorted({step for step, _ in batch})
                said = (
                    f"step {steps[0]}'s" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}'s"
                )
                logger.warning("MLflow did not take %s metrics: %s: %s", said,
                               type(exc).__name__, exc)  # fmt: skip

    def close(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for what is on its way; what is not sent by then is
        left, and said so."""
        if not self._idle.wait(timeout_s):
            with self._lock:
                waiting = len(self._waiting)
            logger.warning("MLflow had not taken the run's last metrics after %.0fs (%d steps "
                           "waiting besides the batch on its way); they are left", timeout_s,
                           waiting)  # fmt: skip


def _quietly(what: str, call: Any, *args: Any, **kwargs: Any) -> None:
    """``call`` for the tracker; MLflow failing it is logged, not raised."""
    try:
        call(*args, **kwargs)
    except Exception as exc:
        logger.warning("MLflow did not take %s: %s: %s", what, type(exc).__name__, exc)


class MetricsCallback(TrainerCallback):
    """Logs every Trainer log event as step metrics, with the tokens per second of those steps.

    Tokens per second counts only the time inside training steps, so checkpoint
    saving and evaluation do not drag the figure down.
    """

    def __init__(self, tracker: RunTracker | None) -> None:
        self.tracker = tracker
        self._step_started = 0.0
        self._step_seconds = 0.0
        self._tokens_at_last_log: float | None = None
        self.last_tokens_per_second: float | None = None

    def on_step_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        self._step_started = time.perf_counter()

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        self._step_seconds += time.perf_counter() - self._step_started

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs or not state.is_world_process_zero:
            return
        metrics = {k: v for k, v in logs.items() if k not in _SUMMARY_KEYS}
        tokens = logs.get("num_tokens")
        if tokens is not None and "loss" in logs:
            if self._tokens_at_last_log is not None and self._step_seconds > 0:
                rate = (tokens - self._tokens_at_last_log) / self._step_seconds
                metrics["tokens_per_second"] = rate
                self.last_tokens_per_second = rate
            self._tokens_at_last_log = tokens
            self._step_seconds = 0.0
        if "loss" in metrics:
            logger.info(
                "step %d/%d loss %.4f lr %.2e tokens/s %s",
                state.global_step,
                state.max_steps,
                metrics["loss"],
                metrics.get("learning_rate", 0.0),
                f"{metrics['tokens_per_second']:.0f}" if "tokens_per_second" in metrics else "-",
            )
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, state.global_step)


_WATCHED = {"loss": "loss", "grad_norm": "gradient norm"}


class FiniteLoss(TrainerCallback):
    """Stops a run whose training loss or gradient norm is not a number: the optimizer
    has written it into the weights, and every later step trains a broken model.
    Needs the Trainer's ``logging_nan_inf_filter`` off, which otherwise leaves such
    steps out of the logged loss.

    ``fp16``: the gradient norm is not looked at. fp16's loss scaler meets an infinite
    norm now and then by design (its scale grew too far), skips that step without
    touching the weights, and lowers the scale: a normal step, not a broken run.
    """

    def __init__(self, *, fp16: bool = False) -> None:
        self.watched = ("loss",) if fp16 else ("loss", "grad_norm")

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        for name in self.watched:
            value = (logs or {}).get(name)
            if isinstance(value, int | float) and not math.isfinite(value):
                raise TrainError(
                    f"the training {_WATCHED[name]} at step {state.global_step} is "
                    f"{value}; the run stops with no adapter. Check the dataset's weights and "
                    "the precision (fp16 overflows where bf16 does not), or lower the "
                    "learning rate"
                )


def loss_curve_png(log_history: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Plot training (and eval) loss against the step; None when nothing was logged."""
    train = [(e["step"], e["loss"]) for e in log_history if "loss" in e and "step" in e]
    evals = [(e["step"], e["eval_loss"]) for e in log_history if "eval_loss" in e]
    if not train:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4), dpi=110)
    steps, losses = zip(*sorted(dict(train).items()), strict=True)
    axes.plot(steps, losses, label="train loss", color="#1f77b4")
    if evals:
        axes.scatter(*zip(*evals, strict=True), label="eval loss", color="#d62728", zorder=3)
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
