"""The flywheel's steps as plain functions over paths and simple values.

The Kubeflow components in ``components/`` are thin shells around these; the
demo and the tests call them directly. Connections (MLflow, Triton, the span
store, the object store) and how versions are served come from the
``SPANMILL_*`` environment unless a value is given: on a cluster the chart's
pipeline ConfigMap and Secrets set that environment in every step's pod
(:mod:`spanmill.pipeline.cluster`), and a run parameter a person sets wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spanmill.config import (
    CollectorSettings,
    MLflowSettings,
    ServingSettings,
    TritonSettings,
    load_settings,
)
from spanmill.contracts import EvalReport


def build_dataset_step(
    out_dir: Path,
    *,
    store_url: str = "",
    agent: str = "",
    since: str = "",
    until: str = "",
    mode: str = "sft",
    min_reward: float | None = None,
    max_reward: float | None = None,
    drop_examples: bool = False,
    max_tokens: int = 0,
    eval_fraction: float = 0.1,
    min_train_rows: int = 1,
    credit: str = "episode",
    feedback_horizon_hours: float = 72.0,
    reward: str = "",
    trusted_producers: str = "",
) -> dict[str, Any]:
    """Build the dataset into ``out_dir``; returns its card.

    ``trusted_producers``: whose spans count, comma-separated; empty: every producer but
    ``anonymous``, ``*``: every span (:mod:`spanmill.producers`).

    Rewards (feedback included) are read from the calls' window extended by
    ``feedback_horizon_hours``: feedback that arrives after the window still counts.
    """
    from spanmill.dataset.output import build_dataset
    from spanmill.dataset.spec import DatasetSpec
    from spanmill.producers import Trust

    spec = DatasetSpec(
        mode=mode,
        since=since or None,
        until=until or None,
        agent=agent or None,
        min_reward=min_reward,
        max_reward=max_reward,
        drop_examples=drop_examples,
        max_tokens=max_tokens or None,
        eval_fraction=eval_fraction,
        min_train_rows=min_train_rows,
        credit=credit,
        feedback_horizon_hours=feedback_horizon_hours,
        reward=reward or None,
        trusted_producers=Trust.parse(trusted_producers).producers,
    )
    store = load_settings(CollectorSettings, **_given(store_url=store_url))
    return build_dataset(store.store_url, out_dir, spec, storage_options=store.storage_options)


def train_step(
    dataset_dir: Path,
    out_dir: Path,
    *,
    base_model: str = "",
    method: str = "auto",
    lora_r: int = 16,
    lora_alpha: int = 32,
    learning_rate: float = 3e-4,
    max_steps: int = 0,
    batch_size: int = 8,
    max_length: int = 1024,
    seed: int = 0,
    precision: str = "auto",
    num_threads: int = 0,
    experiment: str = "spanmill",
    tracking_uri: str = "",
    gpus: int = 1,
    trainer: str = "pod",
    trainjob_nodes: int = 2,
    trainjob_gpus_per_node: int = 1,
    gpu_resource: str = "nvidia.com/gpu",
    pipeline_run_id: str = "",
    task_name: str = "",
) -> dict[str, Any]:
    """Train a LoRA adapter into ``out_dir``; returns the training metrics.

    ``trainer`` "pod" trains here, one process per GPU of the ``gpus`` this pod was
    given (:mod:`spanmill.train.launch`); "trainjob" hands the same run to the
    Kubeflow Trainer, ``trainjob_nodes`` nodes of ``trainjob_gpus_per_node`` GPUs,
    and waits for it (:mod:`spanmill.train.trainjob`), named from ``pipeline_run_id``
    and ``task_name`` where given, so that every try of the step finds the same
    TrainJob. Either way rank 0 alone logs to MLflow and writes the adapter, and the
    result is that of a single process. Trained here, with a checkpoint store
    (``SPANMILL_TRAIN_CHECKPOINT_STORE``), a retried step resumes from the checkpoints
    its lost try copied there (:mod:`spanmill.train.mirror`).
    """
    from spanmill.errors import ConfigError
    from spanmill.train import TrainSettings
    from spanmill.train.launch import launch, plan_processes, visible_gpus

    problem = _trainer_problem(trainer, gpus, trainjob_nodes, trainjob_gpus_per_node)
    if problem:
        raise ConfigError(problem)
    key = _run_key(pipeline_run_id, task_name)
    settings = load_settings(
        TrainSettings,
        # max_steps 0: the settings' own (the environment's, else one epoch). The key names
        # the run's checkpoints in the checkpoint store, the same for every try of the step.
        **_given(base_model=base_model, max_steps=max_steps or None, run_key=key),
        method=method,
        lora_r=lora_r,
        lora_alpha=lora_alpha,
        learning_rate=learning_rate,
        batch_size=batch_size,
        max_length=max_length,
        seed=seed,
        precision=precision,
        num_threads=num_threads,
        experiment=experiment,
        mlflow=_mlflow(tracking_uri),
    )
    _servable(settings.lora_r)
    if trainer == "trainjob":
        from spanmill.pipeline import cluster
        from spanmill.train.settings import TrainJobSettings
        from spanmill.train.trainjob import train_on_trainer

        result = train_on_trainer(
            dataset_dir,
            out_dir,
            settings,
            nodes=trainjob_nodes,
            gpus_per_node=trainjob_gpus_per_node,
            gpu_resource=gpu_resource,
            job=load_settings(TrainJobSettings),
            config_maps={cluster.CONFIGMAP: cluster.SETTINGS},
            secrets=cluster.SECRETS,
            key=key,
        )
    else:
        result = launch(dataset_dir, out_dir, settings, plan_processes(gpus, visible_gpus()))
    return {**result.metrics, "global_step": result.global_step, "run_id": result.run_id}


def train_rl_step(
    out_dir: Path,
    init_model_dir: Path | None,
    *,
    agent: str,
    base_model: str = "",
    max_steps: int = 20,
    group_size: int = 8,
    groups_per_step: int = 4,
    temperature: float = 0.8,
    learning_rate: float = 1e-4,
    beta: float = 0.0,
    seed: int = 0,
    precision: str = "auto",
    num_threads: int = 0,
    experiment: str = "spanmill",
    tracking_uri: str = "",
    pipeline_run_id: str = "",
    task_name: str = "",
) -> dict[str, Any]:
    """GRPO on the agent's task into ``out_dir``, from the adapter in ``init_model_dir`` if any.

    The task is the agent's task plugin; rollouts go to and are read back from the
    rollout topic (``SPANMILL_KAFKA_*``, the chart's pipeline ConfigMap). Returns
    the training metrics. With a checkpoint store, a retried step resumes from the
    checkpoints its lost try copied there, found by ``pipeline_run_id`` and
    ``task_name`` (:mod:`spanmill.train.mirror`).
    """
    from spanmill.config import KafkaSettings
    from spanmill.errors import ConfigError
    from spanmill.tasks import find_task
    from spanmill.train import TrainSettings
    from spanmill.train.rl import train_grpo

    task = find_task(agent)
    if task is None:
        raise ConfigError(
            f"agent {agent!r} has no task plugin: GRPO samples episodes of a task's own "
            "code, with its verifier's rewards; train this agent with sft"
        )
    key = _run_key(pipeline_run_id, task_name)
    settings = load_settings(
        TrainSettings,
        **_given(base_model=base_model, run_key=key),
        method="grpo",
        task=task.name,
        init_adapter=str(init_model_dir) if init_model_dir is not None else None,
        max_steps=max_steps,
        group_size=group_size,
        groups_per_step=groups_per_step,
        rollout_temperature=temperature,
        learning_rate=learning_rate,
        beta=beta,
        seed=seed,
        precision=precision,
        num_threads=num_threads,
        experiment=experiment,
        mlflow=_mlflow(tracking_uri),
    )
    _servable(settings.lora_r)
    result = train_grpo(out_dir, settings, load_settings(KafkaSettings))
    return {**result.metrics, "global_step": result.global_step, "run_id": result.run_id}


def evaluate_step(
    dataset_dir: Path,
    model_dir: Path,
    out_dir: Path,
    *,
    agent: str,
    base_model: str,
    margin: float = 0.02,
    require_significant: bool | None = None,
    instances: int = 100,
    evaluators: str = "tool_calls,reference",
    gate_metric: str = "auto",
    judge_url: str = "",
    judge_model: str = "",
    num_threads: int = 0,
    experiment: str = "spanmill",
    tracking_uri: str = "",
    triton_url: str = "",
    model_repository: str = "",
    flavour: str = "",
    pipeline_run_id: str = "",
    task_name: str = "",
) -> dict[str, Any]:
    """Judge the challenger against the agent's champion, both served by Triton.

    The champion is whatever the ``champion`` alias points at in MLflow, as
    Triton serves it; the challenger is staged in Triton for the evaluation's
    length, its record naming ``pipeline_run_id`` and ``task_name`` where given, so
    that a retry of this step removes what a killed try left staged. No model is
    loaded in this step's own process. The judge's key, when it needs one, comes from
    ``SPANMILL_EVAL_JUDGE_API_KEY`` (a Secret on a cluster). Returns the evaluation's
    metrics.json content.
    """
    from spanmill.evaluate import EvalSettings, evaluate

    given: dict[str, Any] = {
        "agent": agent,
        "base_model": base_model,
        "instances": instances,
        "evaluators": [name.strip() for name in evaluators.split(",") if name.strip()],
        "serving": _serving(flavour, num_threads),
        "experiment": experiment,
        "mlflow": _mlflow(tracking_uri),
        "triton": _triton(triton_url, model_repository),
    }
    if pipeline_run_id:
        given["owner"] = _run_key(pipeline_run_id, task_name)
    if judge_url:
        given["judge_url"] = judge_url
    if judge_model:
        given["judge_model"] = judge_model
    # The gate's other fields (format and regression tolerances, the deciding suite, and
    # require_significant where not given) come from the environment, as for the CLI.
    settings = load_settings(EvalSettings, **given).with_gate(
        margin=margin, metric=gate_metric, require_significant=require_significant
    )
    evaluate(dataset_dir, model_dir, out_dir, settings)
    return EvalReport.read(out_dir).to_json()


def register_step(
    model_dir: Path,
    evaluation_dir: Path,
    *,
    agent: str,
    base_model: str,
    pipeline_run_id: str = "",
    tracking_uri: str = "",
) -> int:
    """Register the trained adapter; it becomes ``challenger`` when the gate passed."""
    from spanmill.registry import ModelRegistry

    registry = ModelRegistry(_mlflow(tracking_uri).tracking_uri)
    registration = registry.register_trained(
        agent,
        model_dir,
        EvalReport.read(evaluation_dir),
        pipeline_run_id=pipeline_run_id or None,
        base_model=base_model,
    )
    return registration.version.version


def _servable(lora_r: int) -> None:
    """Refuse, before any training, an adapter rank the serving engine could not load."""
    from spanmill.errors import ConfigError

    problem = _rank_problem(lora_r)
    if problem:
        raise ConfigError(problem)


def _rank_problem(lora_r: int) -> str | None:
    serving = load_settings(ServingSettings)
    if serving.flavour == "vllm" and lora_r > serving.vllm_max_lora_rank:
        return (
            f"lora_r {lora_r} is above the vLLM engine's max_lora_rank "
            f"{serving.vllm_max_lora_rank}: the adapter could not be served; lower lora_r or "
            "raise SPANMILL_SERVING_VLLM_MAX_LORA_RANK (the chart's triton.vllm.maxLoraRank)"
        )
    return None


def _trainer_problem(
    trainer: str, gpus: int, trainjob_nodes: int, trainjob_gpus_per_node: int
) -> str | None:
    if trainer not in ("pod", "trainjob"):
        return f"trainer must be pod or trainjob, not {trainer!r}"
    if trainer == "trainjob" and gpus:
        return (
            f"trainer=trainjob trains on the TrainJob's {trainjob_nodes} node(s) of "
            f"{trainjob_gpus_per_node} GPU(s); set gpus to 0, so that the training step's pod, "
            "which only waits, holds no GPU the TrainJob may need"
        )
    return None


def _run_key(pipeline_run_id: str, task_name: str) -> str:
    """What names a step across its tries: its run's id and its task's name (KFP's
    placeholders), the same on every try; empty outside a pipeline."""
    return f"{pipeline_run_id}/{task_name}" if pipeline_run_id else ""


# What each train_method of the flywheel trains on: the dataset mode its supervised part
# needs (None: GRPO alone, which samples its own episodes and reads the dataset only to
# evaluate).
TRAIN_METHODS: dict[str, str | None] = {
    "sft": "sft", "dpo": "preference", "grpo": None, "sft+grpo": "sft",
}  # fmt: skip


def check_run_step(
    *,
    dataset_mode: str = "sft",
    train_method: str = "sft",
    lora_r: int = 16,
    gpus: int = 1,
    trainer: str = "pod",
    trainjob_nodes: int = 2,
    trainjob_gpus_per_node: int = 1,
) -> str:
    """Refuse, before anything is built or trained, a run whose parameters cannot work
    together, naming every such parameter at once; what the run will do.

    Each later step checks its own parameters too (for runs outside the pipeline); here
    a combination that would fail hours in (training after the dataset build) fails in
    seconds: a train_method whose dataset_mode does not match, trainer=trainjob with GPUs
    for a pod that only waits, an adapter rank the serving engine cannot load.
    """
    from spanmill.errors import ConfigError

    problems: list[str] = []
    if train_method not in TRAIN_METHODS:
        problems.append(f"train_method must be one of {', '.join(TRAIN_METHODS)}, "
                        f"not {train_method!r}")  # fmt: skip
    needed = TRAIN_METHODS.get(train_method)
    if needed is not None:
        if dataset_mode != needed:
            problems.append(
                f"train_method {train_method} trains on a {needed} dataset, and dataset_mode "
                f"is {dataset_mode!r}: set it to {needed}"
            )
        for problem in (
            _trainer_problem(trainer, gpus, trainjob_nodes, trainjob_gpus_per_node),
            _rank_problem(lora_r),
        ):
            if problem:
                problems.append(problem)
    if problems:
        raise ConfigError("this run's parameters cannot work together: " + "; ".join(problems))
    where = f"a TrainJob of {trainjob_nodes} node(s)" if trainer == "trainjob" else f"{gpus} GPU(s)"
    return f"{train_method} on a {dataset_mode} dataset" + (
        f", trained on {where}" if needed is not None else ""
    )


def _given(**values: Any) -> dict[str, Any]:
    """The values a caller set; an empty one (a run parameter left blank) is not set."""
    return {k: v for k, v in values.items() if v not in ("", None)}


def _triton(http_url: str, model_repository: str) -> TritonSettings:
    return load_settings(
        TritonSettings, **_given(http_url=http_url, model_repository=model_repository)
    )


def _serving(flavour: str, num_threads: int = 0) -> ServingSettings:
    return load_settings(
        ServingSettings, **_given(flavour=flavour, num_threads=num_threads or None)
    )


def _mlflow(tracking_uri: str) -> MLflowSettings:
    """The step's MLflow, its calls bounded for the step's process and those it starts."""
    settings = load_settings(MLflowSettings, **_given(tracking_uri=tracking_uri))
    settings.bound_requests()
    return settings
