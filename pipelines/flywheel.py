"""The flywheel: spans -> dataset -> LoRA -> evaluation -> (gate) -> registry.

Its first step checks the run's parameters together (``check_run``): a combination
that cannot work fails in seconds, naming each, not at training after the dataset.

Every parameter is one a person can set from the Kubeflow UI. Only a challenger
that passes the gate is registered as ``challenger``; the rollout controller, the
one writer of what Triton serves, then deploys it, gives it traffic step by step,
and promotes or rolls back.

Cluster settings compiled in: every step gets the chart's pipeline ConfigMap and
the Secrets beside it as environment (spanmill.pipeline.cluster), so a run
started from the UI needs only the agent; a connection parameter left empty
comes from there, and one a person sets wins. The training step asks for `gpus`
GPUs on the GPU node pool (node selector and toleration) and trains with one
process per GPU, or hands the run to the Kubeflow Trainer (`trainer=trainjob`,
spanmill.train.trainjob) for several nodes; steps retry on transient
failures, each has a deadline (``TIMEOUT_S``), and no step's output is reused from
an earlier run (each reads moving state: the span window, the champion, the
cluster's settings).
"""

from typing import Any

from kfp import dsl, kubernetes

from components.build_dataset import build_dataset
from components.check_run import check_run
from components.evaluate import evaluate
from components.register_model import register_model
from components.train_lora import train_lora
from components.train_rl import train_rl
from spanmill.pipeline import cluster

# The longest each step's pod may run (its active deadline): a hung step ends, where it
# held the recurring run (one at a time) and every nightly trigger after it was skipped.
# Training waits for a TrainJob up to its own deadline (24 h by default) and some more.
TIMEOUT_S = {
    "check": 600,
    "dataset": 4 * 3600,
    "train": 26 * 3600,
    "evaluate": 6 * 3600,
    "register": 3600,
}
GPU_POOL_LABEL = ("spanmill.io/pool", "gpu")
GPU_TAINT = ("nvidia.com/gpu", "Exists", "NoSchedule")


def _on_gpu_pool(task: dsl.PipelineTask) -> None:
    """On the GPU node pool, with the chart's settings."""
    kubernetes.add_node_selector(task, *GPU_POOL_LABEL)
    kubernetes.add_toleration(task, key=GPU_TAINT[0], operator=GPU_TAINT[1], effect=GPU_TAINT[2])
    _cluster(task)


def _cluster(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """The chart's settings and the Secrets, as every step's environment."""
    kubernetes.use_config_map_as_env(task, cluster.CONFIGMAP, {k: k for k in cluster.SETTINGS})
    for secret, keys in cluster.SECRETS.items():
        kubernetes.use_secret_as_env(task, secret, keys, optional=True)
    kubernetes.use_secret_as_volume(
        task, cluster.KAFKA_CA_SECRET, mount_path=cluster.KAFKA_CA_FOLDER, optional=True
    )
    return task


@dsl.pipeline(
    name="flywheel",
    description="Turn an agent's recent traces into a better model, and stage it for rollout.",
)
def flywheel(
    agent: str = "calculator",
    store_url: str = "",
    since: str = "",
    until: str = "",
    dataset_mode: str = "sft",
    min_reward: float = 1.0,
    drop_examples: bool = True,
    max_tokens: int = 0,
    eval_fraction: float = 0.1,
    min_train_rows: int = 1,
    credit: str = "episode",
    feedback_horizon_hours: float = 72.0,
    reward: str = "",
    trusted_producers: str = "",
    base_model: str = "",
    lora_r: int = 16,
    lora_alpha: int = 32,
    learning_rate: float = 3e-4,
    max_steps: int = 90,
    batch_size: int = 8,
    max_length: int = 1024,
    precision: str = "auto",
    eval_instances: int = 100,
    evaluators: str = "tool_calls,reference",
    gate_metric: str = "auto",
    judge_url: str = "",
    judge_model: str = "",
    margin: float = 0.05,
    num_threads: int = 0,
    flavour: str = "",
    triton_url: str = "",
    model_repository: str = "",
    tracking_uri: str = "",
    gpu_type: str = "nvidia.com/gpu",
    gpus: int = 1,
    trainer: str = "pod",
    trainjob_nodes: int = 2,
    trainjob_gpus_per_node: int = 1,
    train_method: str = "sft",
    rl_steps: int = 20,
    rl_group_size: int = 8,
    rl_groups_per_step: int = 4,
    rl_temperature: float = 0.8,
    rl_learning_rate: float = 1e-4,
    rl_beta: float = 0.0,
) -> None:
    # Parameters that cannot work together fail here, in seconds, not hours in.
    checked = check_run(
        dataset_mode=dataset_mode, train_method=train_method, lora_r=lora_r, gpus=gpus,
        trainer=trainer, trainjob_nodes=trainjob_nodes,
        trainjob_gpus_per_node=trainjob_gpus_per_node,
    )  # fmt: skip
    checked.set_caching_options(False)  # it reads the cluster's serving settings
    checked.set_cpu_limit("1").set_memory_limit("1G")
    kubernetes.set_timeout(checked, TIMEOUT_S["check"])
    _cluster(checked)
    data = build_dataset(
        agent=agent, store_url=store_url, since=since, until=until, mode=dataset_mode,
        min_reward=min_reward, drop_examples=drop_examples, max_tokens=max_tokens,
        eval_fraction=eval_fraction, min_train_rows=min_train_rows, credit=credit,
        feedback_horizon_hours=feedback_horizon_hours, reward=reward,
        trusted_producers=trusted_producers,
    )  # fmt: skip
    data.after(checked)
    data.set_caching_options(False).set_retry(num_retries=2, backoff_duration="30s")
    kubernetes.set_timeout(data, TIMEOUT_S["dataset"])
    _cluster(data)

    def supervised(method: str) -> dsl.PipelineTask:
        trained = train_lora(
            dataset=data.outputs["dataset"], base_model=base_model, method=method, lora_r=lora_r,
            lora_alpha=lora_alpha, learning_rate=learning_rate, max_steps=max_steps,
            batch_size=batch_size, max_length=max_length, precision=precision,
            num_threads=num_threads, tracking_uri=tracking_uri, gpus=gpus, trainer=trainer,
            trainjob_nodes=trainjob_nodes, trainjob_gpus_per_node=trainjob_gpus_per_node,
            gpu_resource=gpu_type,
            # What names the step across its tries: a retried run may give it other paths.
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
        )  # fmt: skip
        # One training process per GPU of the pod (0: the CPU); with trainer=trainjob the pod
        # only waits for the Kubeflow Trainer and asks for none (gpus=0).
        trained.set_accelerator_type(gpu_type).set_accelerator_limit(gpus)
        trained.set_cpu_limit("8").set_memory_limit("32G")
        trained.set_retry(num_retries=1, backoff_duration="60s")
        # Its cache key is its parameters and the dataset artifact's name, not the
        # ConfigMap's settings (the base model, the TrainJob's): never reused.
        trained.set_caching_options(False)
        kubernetes.set_timeout(trained, TIMEOUT_S["train"])
        _on_gpu_pool(trained)
        trainjob = {key: key for key in cluster.TRAINJOB_SETTINGS}
        kubernetes.use_config_map_as_env(
            trained, cluster.TRAINJOB_CONFIGMAP, trainjob, optional=True
        )
        return trained

    def reinforced(init: dsl.PipelineTask | None) -> dsl.PipelineTask:
        rl = train_rl(
            agent=agent, base_model=base_model, max_steps=rl_steps, group_size=rl_group_size,
            groups_per_step=rl_groups_per_step, temperature=rl_temperature,
            learning_rate=rl_learning_rate, beta=rl_beta, precision=precision,
            num_threads=num_threads, tracking_uri=tracking_uri,
            # What names the step across its tries: a retry resumes from its checkpoints.
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
            **({"init_model": init.outputs["model"]} if init is not None else {}),
        )  # fmt: skip
        rl.after(checked)
        # The policy generates and trains in one process on one GPU (spanmill.train.rl).
        rl.set_accelerator_type(gpu_type).set_accelerator_limit(1)
        rl.set_cpu_limit("8").set_memory_limit("32G")
        rl.set_caching_options(False)  # it samples fresh episodes
        rl.set_retry(num_retries=1, backoff_duration="60s")
        kubernetes.set_timeout(rl, TIMEOUT_S["train"])
        _on_gpu_pool(rl)
        return rl

    def judge_and_stage(trained_model: Any) -> None:
        """Evaluate the model a branch trained; register it if the gate passes."""
        judged = evaluate(
            dataset=data.outputs["dataset"], model=trained_model, agent=agent,
            base_model=base_model, margin=margin, instances=eval_instances,
            evaluators=evaluators, gate_metric=gate_metric, judge_url=judge_url,
            judge_model=judge_model, num_threads=num_threads, triton_url=triton_url,
            model_repository=model_repository, flavour=flavour, tracking_uri=tracking_uri,
            # What names the step across its tries: a retry removes what a killed try staged.
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
        )  # fmt: skip
        # Retried once: a Triton or MLflow blip no longer throws the night's training away.
        judged.set_caching_options(False).set_retry(num_retries=1, backoff_duration="60s")
        kubernetes.set_timeout(judged, TIMEOUT_S["evaluate"])
        _cluster(judged)
        for secret, keys in cluster.JUDGE_SECRETS.items():
            kubernetes.use_secret_as_env(judged, secret, keys, optional=True)

        with dsl.If(judged.outputs["Output"] == True, name="gate-passed"):  # noqa: E712
            registered = register_model(
                model=trained_model, evaluation=judged.outputs["evaluation"], agent=agent,
                base_model=base_model, pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                tracking_uri=tracking_uri,
            )  # fmt: skip
            # A registration retried finishes what the failed try began (one version a
            # run, by its id): an MLflow blip no longer throws the night's training away.
            registered.set_caching_options(False).set_retry(num_retries=3,
                                                            backoff_duration="60s")  # fmt: skip
            kubernetes.set_timeout(registered, TIMEOUT_S["register"])
            _cluster(registered)

    # train_method: sft or dpo (the dataset's mode must match), grpo from the base model,
    # or sft+grpo: GRPO from the SFT adapter. Each branch evaluates what it trained (kfp's
    # local runner cannot select one artifact of several branches, dsl.OneOf).
    with dsl.If(train_method == "grpo", name="grpo"):
        judge_and_stage(reinforced(None).outputs["model"])
    with dsl.Elif(train_method == "sft+grpo", name="sft-then-grpo"):
        judge_and_stage(reinforced(supervised("sft")).outputs["model"])
    with dsl.Else(name="supervised"):
        judge_and_stage(supervised(train_method).outputs["model"])
