"""The flywheel: spans -> dataset -> LoRA -> evaluation -> (gate) -> registry -> Triton.

Every parameter is one a person can set from the Kubeflow UI. Only a challenger
that passes the gate is registered as ``challenger`` and staged in Triton; the
rollout controller then gives it traffic step by step and promotes or rolls back.

Cluster settings compiled in: the training step asks for a GPU on the GPU node
pool (node selector and toleration), credentials come from Kubernetes Secrets as
environment (MLflow and S3, the same Secrets the Helm chart references), steps
retry on transient failures, and caching is off for steps that read moving
state (the span window, the champion).
"""

from kfp import dsl, kubernetes

from components.build_dataset import build_dataset
from components.deploy_model import deploy_model
from components.evaluate import evaluate
from components.register_model import register_model
from components.train_lora import train_lora

GPU_POOL_LABEL = ("spanmill.io/pool", "gpu")
GPU_TAINT = ("nvidia.com/gpu", "Exists", "NoSchedule")
MLFLOW_SECRET = "spanmill-mlflow"
MLFLOW_ENV = {
    "tracking-uri": "SPANMILL_MLFLOW_TRACKING_URI",
    "username": "MLFLOW_TRACKING_USERNAME",
    "password": "MLFLOW_TRACKING_PASSWORD",
}
S3_SECRET = "spanmill-s3"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
}

# The LLM judge's endpoint key, for the evaluate step only.
JUDGE_SECRET = "spanmill-judge"
JUDGE_ENV = {"api-key": "SPANMILL_EVAL_JUDGE_API_KEY"}


def _credentials(task: dsl.PipelineTask) -> dsl.PipelineTask:
    kubernetes.use_secret_as_env(task, MLFLOW_SECRET, MLFLOW_ENV, optional=True)
    kubernetes.use_secret_as_env(task, S3_SECRET, S3_ENV, optional=True)
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
    credit: str = "episode",
    feedback_horizon_hours: float = 72.0,
    reward: str = "",
    base_model: str = "smollm2-135m",
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
    flavour: str = "python",
    triton_url: str = "",
    model_repository: str = "",
    tracking_uri: str = "",
    gpu_type: str = "nvidia.com/gpu",
) -> None:
    data = build_dataset(
        agent=agent, store_url=store_url, since=since, until=until, mode=dataset_mode,
        min_reward=min_reward, drop_examples=drop_examples, max_tokens=max_tokens,
        eval_fraction=eval_fraction, credit=credit, feedback_horizon_hours=feedback_horizon_hours,
        reward=reward,
    )  # fmt: skip
    data.set_caching_options(False).set_retry(num_retries=2, backoff_duration="30s")
    _credentials(data)

    trained = train_lora(
        dataset=data.outputs["dataset"], base_model=base_model, lora_r=lora_r,
        lora_alpha=lora_alpha, learning_rate=learning_rate, max_steps=max_steps,
        batch_size=batch_size, max_length=max_length, precision=precision,
        num_threads=num_threads, tracking_uri=tracking_uri,
    )  # fmt: skip
    trained.set_accelerator_type(gpu_type).set_accelerator_limit(1)
    trained.set_cpu_limit("8").set_memory_limit("32G")
    trained.set_retry(num_retries=1, backoff_duration="60s")
    kubernetes.add_node_selector(trained, *GPU_POOL_LABEL)
    kubernetes.add_toleration(trained, key=GPU_TAINT[0], operator=GPU_TAINT[1], effect=GPU_TAINT[2])
    _credentials(trained)

    judged = evaluate(
        dataset=data.outputs["dataset"], model=trained.outputs["model"], agent=agent,
        base_model=base_model, margin=margin, instances=eval_instances, evaluators=evaluators,
        gate_metric=gate_metric, judge_url=judge_url, judge_model=judge_model,
        num_threads=num_threads, triton_url=triton_url, model_repository=model_repository,
        flavour=flavour, tracking_uri=tracking_uri,
    )  # fmt: skip
    judged.set_caching_options(False)
    _credentials(judged)
    kubernetes.use_secret_as_env(judged, JUDGE_SECRET, JUDGE_ENV, optional=True)

    with dsl.If(judged.outputs["Output"] == True, name="gate-passed"):  # noqa: E712
        registered = register_model(
            model=trained.outputs["model"], evaluation=judged.outputs["evaluation"],
            agent=agent, base_model=base_model, pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            tracking_uri=tracking_uri,
        )  # fmt: skip
        registered.set_caching_options(False)
        _credentials(registered)
        staged = deploy_model(
            agent=agent, version=registered.output, triton_url=triton_url,
            model_repository=model_repository, flavour=flavour, tracking_uri=tracking_uri,
        )  # fmt: skip
        staged.set_caching_options(False).set_retry(num_retries=2, backoff_duration="30s")
        _credentials(staged)
