"""The hand-over to the Kubeflow Trainer: the TrainJob, checked against the Trainer's CRD,
and the step's submit-and-wait against kmock's Kubernetes API.

kmock stands in for the API server; a small stand-in for the Trainer's controller runs
what the TrainJob asks for as the Trainer would: each node's container command, with
the TrainJob's environment (its ConfigMap and Secret references resolved from the API)
and the PET_* variables of the torch policy, on this machine, then reports the outcome
in the TrainJob's status conditions.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from helm_render import manifest_validator

from spanmill.pipeline import cluster
from spanmill.stack.ports import free_port
from spanmill.train import TrainError, TrainSettings
from spanmill.train.settings import TrainJobSettings
from spanmill.train.trainer import CHECKPOINTS_DIRNAME, MANIFEST_FILE
from spanmill.train.trainjob import (
    GROUP,
    PLURAL,
    VERSION,
    job_name,
    job_state,
    render_trainjob,
    train_on_trainer,
)

NAMESPACE = "kubeflow"
SECRET_WORDS = {"PASSWORD", "SECRET", "TOKEN"}  # whole words of a name (not MAX_TOKENS)


def _secret(name: str) -> bool:
    return bool(SECRET_WORDS & set(name.split("_"))) or "ACCESS_KEY" in name


def _render(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "name": "spanmill-train-0123456789",
        "namespace": NAMESPACE,
        "dataset_url": "s3://spanmill/trainjobs/x/dataset",
        "output_url": "s3://spanmill/trainjobs/x/output",
        "nodes": 4,
        "gpus_per_node": 8,
        "gpu_resource": "nvidia.com/gpu",
        "settings": TrainSettings(
            base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
            lora_r=32,
            max_steps=500,
            mlflow={"tracking_uri": "http://spanmill-mlflow.spanmill.svc:5000"},
        ),
        "job": TrainJobSettings(image="ghcr.io/spanmill/pipeline:0.1.0-cu128"),
        "config_maps": {cluster.CONFIGMAP: cluster.SETTINGS},
        "secrets": cluster.SECRETS,
        **overrides,
    }
    return render_trainjob(**values)


def test_the_trainjob_conforms_to_the_trainers_crd() -> None:
    validator = manifest_validator()
    for manifest in (_render(), _render(nodes=1, gpus_per_node=0, job=TrainJobSettings())):
        assert validator.crd_errors(manifest) == []
    # The check is strict: what the Trainer would not know is an error, named.
    bad = _render()
    bad["spec"]["trainer"]["numNode"] = 4
    bad["spec"]["trainer"]["resourcesPerNode"]["limit"] = {}
    bad["metadata"]["name"] = "Spanmill_Train"
    errors = validator.crd_errors(bad)
    assert len(errors) == 3
    assert any("numNode" in e for e in errors) and any("'limit'" in e for e in errors)
    assert any(e.startswith("metadata.name") for e in errors)


def test_the_trainjob_asks_for_nodes_gpus_and_the_same_command() -> None:
    manifest = _render()
    spec = manifest["spec"]
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert manifest["kind"] == "TrainJob"
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": "spanmill-train",
    }  # fmt: skip
    trainer = spec["trainer"]
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"]["limits"] == {
        "cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 8,
    }  # fmt: skip
    assert trainer["image"] == "ghcr.io/spanmill/pipeline:0.1.0-cu128"
    assert trainer["command"] == ["python", "-m", "spanmill.train.trainjob"]
    assert trainer["args"] == [
        "s3://spanmill/trainjobs/x/dataset",
        "s3://spanmill/trainjobs/x/output",
    ]
    assert spec["activeDeadlineSeconds"] == 86400
    # CPU nodes: one process each, not one per core, and no GPU asked for.
    cpu = _render(gpus_per_node=0, nodes=2)["spec"]["trainer"]
    assert cpu["numProcPerNode"] == 1 and "nvidia.com/gpu" not in cpu["resourcesPerNode"]["limits"]
    with pytest.raises(TrainError, match="at least one node"):
        _render(nodes=0)


def test_the_trainjob_gets_the_runs_settings_and_the_clusters_by_reference() -> None:
    env = _render()["spec"]["trainer"]["env"]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names)), "the Trainer keys env by name"
    by_name = {e["name"]: e for e in env}
    assert by_name["SPANMILL_TRAIN_LORA_R"]["value"] == "32"
    assert by_name["SPANMILL_TRAIN_MAX_STEPS"]["value"] == "500"
    assert by_name["SPANMILL_TRAIN_BASE_MODEL"]["value"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    # The run's own MLflow URI wins over the ConfigMap's.
    assert by_name["SPANMILL_MLFLOW_TRACKING_URI"] == {
        "name": "SPANMILL_MLFLOW_TRACKING_URI",
        "value": "http://spanmill-mlflow.spanmill.svc:5000",
    }
    # The rest of the cluster settings, as the step's own pod has them.
    assert set(cluster.SETTINGS) <= set(by_name)
    referenced = {e["name"] for e in env if "configMapKeyRef" in e.get("valueFrom", {})}
    assert referenced == set(cluster.SETTINGS) - {
        "SPANMILL_MLFLOW_TRACKING_URI", "SPANMILL_TRAIN_BASE_MODEL",
    }  # fmt: skip
    # Credentials only by reference: no Secret's value is ever in the TrainJob.
    for entry in env:
        if _secret(entry["name"]):
            assert "value" not in entry, entry["name"]
            assert entry["valueFrom"]["secretKeyRef"]["optional"] is True
    secret_vars = {v for keys in cluster.SECRETS.values() for v in keys.values()}
    assert secret_vars <= set(by_name)


@pytest.mark.parametrize(
    ("conditions", "state"),
    [
        ([], "Running"),
        ([{"type": "Suspended", "status": "True", "reason": "Suspended"}], "Suspended"),
        ([{"type": "Suspended", "status": "False"}], "Running"),
        ([{"type": "Complete", "status": "True", "reason": "JobSetCompleted"}], "Complete"),
        ([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}], "Failed"),
    ],
)
def test_the_state_is_read_from_the_conditions(conditions: list[Any], state: str) -> None:
    assert job_state({"status": {"conditions": conditions}})[0] == state


def test_a_base_model_folder_of_the_pod_is_refused(tmp_path: Path) -> None:
    job = TrainJobSettings(namespace=NAMESPACE, staging_url=f"file://{tmp_path}/staging")
    with pytest.raises(TrainError, match="cannot see"):
        train_on_trainer(
            tmp_path, tmp_path / "out", TrainSettings(base_model=str(tmp_path)), nodes=2,
            gpus_per_node=1, job=job, config_maps={}, secrets={}, api_client=object(),
        )  # fmt: skip
    with pytest.raises(TrainError, match="SPANMILL_TRAINJOB_STAGING_URL"):
        train_on_trainer(
            tmp_path, tmp_path / "out", TrainSettings(), nodes=2, gpus_per_node=1,
            job=TrainJobSettings(namespace=NAMESPACE), config_maps={}, secrets={},
            api_client=object(),
        )  # fmt: skip


# ---- against kmock's Kubernetes API, with a stand-in for the Trainer's controller ----


@pytest.fixture
def kube_api() -> Iterator[Any]:
    """An API client of kmock's in-memory Kubernetes API, served from its own thread."""
    import kmock
    from kubernetes import client

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stack = AsyncExitStack()

    async def start() -> str:
        emulator = await stack.enter_async_context(kmock.KubernetesEmulator())
        # The CRD, installed: the kind is listed as the real API server lists it.
        emulator.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = {}
        server = await stack.enter_async_context(kmock.Server(emulator))
        return str(server.url).rstrip("/")

    try:
        configuration = client.Configuration()
        configuration.host = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
        yield client.ApiClient(configuration)
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stack.aclose(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def _objects(api_client: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api_client)


def _set_status(api_client: Any, name: str, kind: str, message: str) -> None:
    condition = {"type": kind, "status": "True", "reason": kind, "message": message}
    _objects(api_client).patch_namespaced_custom_object_status(
        GROUP, VERSION, NAMESPACE, PLURAL, name, {"status": {"conditions": [condition]}}
    )


def _resolve_env(api_client: Any, env: list[dict[str, Any]]) -> dict[str, str]:
    """The container environment the kubelet would build from the TrainJob's env."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    resolved: dict[str, str] = {}
    for entry in env:
        if "value" in entry:
            resolved[entry["name"]] = entry["value"]
            continue
        source = entry["valueFrom"]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            resolved[entry["name"]] = core.read_namespaced_config_map(ref["name"], NAMESPACE).data[
                ref["key"]
            ]
        else:
            ref = source["secretKeyRef"]
            try:
                data = core.read_namespaced_secret(ref["name"], NAMESPACE).data or {}
            except client.ApiException:
                if ref.get("optional"):
                    continue
                raise
            resolved[entry["name"]] = base64.b64decode(data[ref["key"]]).decode()
    return resolved


class FakeTrainer:
    """Does what the Trainer's controller does with a new TrainJob, on this machine.

    ``act`` receives the TrainJob and returns ("Complete" | "Failed", message).
    """

    def __init__(self, api_client: Any, act: Callable[[dict[str, Any]], tuple[str, str]]) -> None:
        self.api_client = api_client
        self.act = act
        self.seen: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> FakeTrainer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert self.errors == []

    def _loop(self) -> None:
        api = _objects(self.api_client)
        while not self._stop.is_set():
            try:
                listed = api.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
                for trainjob in listed.get("items", []):
                    if trainjob.get("status"):
                        continue
                    self.seen.append(trainjob)
                    state, message = self.act(trainjob)
                    _set_status(self.api_client, trainjob["metadata"]["name"], state, message)
            except Exception as exc:  # the step gives up after its wait_s; the test says why
                self.errors.append(exc)
                return
            self._stop.wait(0.1)


def run_nodes(api_client: Any, trainjob: dict[str, Any]) -> tuple[str, str]:
    """Every node's container, as the torch policy starts it: one process per node here."""
    trainer = trainjob["spec"]["trainer"]
    env = {**os.environ, **_resolve_env(api_client, trainer["env"])}
    # The training image's `python` is this interpreter.
    command = [sys.executable, *trainer["command"][1:], *trainer["args"]]
    nodes = trainer["numNodes"]
    port = free_port()
    processes = []
    for rank in range(nodes):
        pet = {
            "PET_NNODES": str(nodes),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
        }
        processes.append(subprocess.Popen(command, env={**env, **pet}))
    codes = [p.wait(timeout=600) for p in processes]
    if any(codes):
        return "Failed", f"node exit codes {codes}"
    return "Complete", "JobSet completed"


def _configmap(api_client: Any) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    data = {key: f"unused-{key.lower()}" for key in cluster.SETTINGS}
    core.create_namespaced_config_map(
        NAMESPACE, {"metadata": {"name": cluster.CONFIGMAP}, "data": data}
    )


def test_the_step_trains_on_two_trainjob_nodes_and_gets_rank_0s_adapter(
    tmp_path: Path,
    small_dataset: Path,
    tiny_model_dir: Path,
    kube_api: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _configmap(kube_api)
    # Each node copies the base model from the "object store" into its own home once.
    monkeypatch.setenv("SPANMILL_HOME", str(tmp_path / "home"))
    staging = f"file://{tmp_path}/staging"
    job = TrainJobSettings(namespace=NAMESPACE, staging_url=staging, poll_s=0.2, wait_s=300)
    settings = TrainSettings(
        base_model=f"file://{tiny_model_dir}", max_steps=2, batch_size=2, max_length=512,
        lora_r=4, lora_alpha=8, track=False, eval_loss=False,
    )  # fmt: skip
    out = tmp_path / "adapter"
    with FakeTrainer(kube_api, lambda trainjob: run_nodes(kube_api, trainjob)) as trainer:
        result = train_on_trainer(
            small_dataset, out, settings, nodes=2, gpus_per_node=0, job=job,
            config_maps={cluster.CONFIGMAP: cluster.SETTINGS}, secrets=cluster.SECRETS,
            api_client=kube_api,
        )  # fmt: skip

    (created,) = trainer.seen
    assert created["metadata"]["name"] == job_name(out)
    assert created["spec"]["trainer"]["numNodes"] == 2
    assert manifest_validator().crd_errors(created) == []
    # Rank 0's result, as training in the pod returns it; node 1 wrote nothing back
    # (it would have failed, with no files to copy).
    assert result.global_step == 2 and result.output_dir == out
    assert {"train_loss", "train_runtime_s", "global_step", "peak_rss_mb"} <= set(result.metrics)
    assert (out / "adapter_model.safetensors").is_file() and (out / MANIFEST_FILE).is_file()
    assert json.loads((out / MANIFEST_FILE).read_text())["global_step"] == 2
    assert not (out / CHECKPOINTS_DIRNAME).exists()
    # Cleaned up: the TrainJob and the staging folder are gone.
    from kubernetes import client

    with pytest.raises(client.ApiException) as gone:
        _objects(kube_api).get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, job_name(out)
        )
    assert gone.value.status == 404
    assert not (tmp_path / "staging" / job_name(out)).exists()


def _fake_output(staging: Path, name: str) -> None:
    output = staging / name / "output"
    output.mkdir(parents=True)
    (output / "adapter_config.json").write_text("{}")
    manifest = {
        "output_dir": "/tmp/spanmill-train-x/output", "base_model": "org/model", "method": "sft",
        "global_step": 7, "resumed_from_step": None, "run_id": "r1", "dataset_digest": "d",
        "merged_dir": None, "metrics": {"train_loss": 1.5},
    }  # fmt: skip
    (output / MANIFEST_FILE).write_text(json.dumps(manifest))


def test_a_failed_trainjob_fails_the_step_and_a_retry_replaces_it(
    tmp_path: Path, small_dataset: Path, kube_api: Any
) -> None:
    staging = tmp_path / "staging"
    job = TrainJobSettings(
        namespace=NAMESPACE, staging_url=f"file://{staging}", poll_s=0.1, wait_s=30
    )
    out = tmp_path / "adapter"
    name = job_name(out)
    run = {
        "nodes": 2, "gpus_per_node": 1, "job": job, "config_maps": {}, "secrets": {},
        "api_client": kube_api,
    }  # fmt: skip
    failing = FakeTrainer(kube_api, lambda trainjob: ("Failed", "node 1 exited with 1"))
    with failing as trainer, pytest.raises(TrainError, match=r"failed .*node 1 exited with 1"):
        train_on_trainer(small_dataset, out, TrainSettings(), **run)
    assert len(trainer.seen) == 1
    # Left for inspection, with the dataset it was given.
    failed = _objects(kube_api).get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, name
    )
    assert job_state(failed)[0] == "Failed"
    assert (staging / name / "dataset" / "train.parquet").is_file()

    def succeed(trainjob: dict[str, Any]) -> tuple[str, str]:
        _fake_output(staging, trainjob["metadata"]["name"])
        return "Complete", "done"

    # The step's retry: same output folder, same name; the failed TrainJob is replaced.
    with FakeTrainer(kube_api, succeed) as trainer:
        result = train_on_trainer(small_dataset, out, TrainSettings(), **run)
    assert len(trainer.seen) == 1 and trainer.seen[0]["metadata"]["name"] == name
    assert result.global_step == 7 and result.output_dir == out and result.run_id == "r1"
    assert (out / "adapter_config.json").is_file()


def test_a_retry_with_other_paths_waits_for_the_same_trainjob(
    tmp_path: Path, small_dataset: Path, kube_api: Any
) -> None:
    """A retried Kubeflow run may hand the step another output folder: named from the
    folder, the retry started a second TrainJob beside the first, still running on the
    GPUs. Named from the run and the task, it waits for the first."""
    staging = tmp_path / "staging"
    key = "run-0c1d/train-lora"
    first_out, retry_out = tmp_path / "try-1" / "model", tmp_path / "try-2" / "model"
    name = job_name(first_out, key)
    assert name == job_name(retry_out, key) != job_name(retry_out)
    run = {
        "nodes": 2, "gpus_per_node": 1, "config_maps": {}, "secrets": {},
        "api_client": kube_api, "key": key,
    }  # fmt: skip
    # The first try's pod is lost while its TrainJob runs (here: it stops waiting).
    brief = TrainJobSettings(
        namespace=NAMESPACE, staging_url=f"file://{staging}", poll_s=0.1, wait_s=1
    )
    with pytest.raises(TrainError):
        train_on_trainer(small_dataset, first_out, TrainSettings(), job=brief, **run)

    def succeed(trainjob: dict[str, Any]) -> tuple[str, str]:
        _fake_output(staging, trainjob["metadata"]["name"])
        return "Complete", "done"

    job = TrainJobSettings(
        namespace=NAMESPACE, staging_url=f"file://{staging}", poll_s=0.1, wait_s=30
    )
    with FakeTrainer(kube_api, succeed) as trainer:
        result = train_on_trainer(small_dataset, retry_out, TrainSettings(), job=job, **run)
    assert [t["metadata"]["name"] for t in trainer.seen] == [name]
    assert result.output_dir == retry_out and (retry_out / "adapter_config.json").is_file()
    listed = _objects(kube_api).list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
    assert [t["metadata"]["name"] for t in listed.get("items", [])] == []  # deleted once done


def test_the_wait_outlasts_an_api_server_out_of_reach_for_a_while(
    tmp_path: Path, kube_api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Hours into a training, the API server times out, then answers 503 while it fails
    over: the step goes on waiting (the TrainJob trains on), and takes the end up."""
    from kubernetes import client
    from urllib3.exceptions import ReadTimeoutError

    from spanmill.train.trainjob import run_trainjob

    faults: list[Exception] = [
        ReadTimeoutError(None, "/apis", "Read timed out."),  # type: ignore[arg-type]
        client.ApiException(status=503, reason="Service Unavailable"),
    ]
    reads: list[str] = []

    class FailingOver(client.ApiClient):  # type: ignore[misc]
        """kmock's API, whose first reads of the TrainJob fail as an API server failing
        over fails them."""

        def call_api(self, resource_path: str, method: str, *args: Any, **kwargs: Any) -> Any:
            if method == "GET" and resource_path.endswith("{plural}/{name}"):
                reads.append(resource_path)
                if faults:
                    raise faults.pop(0)
            return super().call_api(resource_path, method, *args, **kwargs)

    api_client = FailingOver(kube_api.configuration)
    manifest = _render()

    def complete(trainjob: dict[str, Any]) -> tuple[str, str]:
        return "Complete", "done"

    caplog.set_level("WARNING", logger="spanmill.train.trainjob")
    with FakeTrainer(kube_api, complete):
        run_trainjob(api_client, manifest, poll_s=0.1, timeout_s=60)
    assert faults == [] and len(reads) >= 3
    warned = [r.getMessage() for r in caplog.records]
    assert any("Read timed out" in m for m in warned), warned
    assert any("503 Service Unavailable; trying again" in m for m in warned), warned


def test_an_unknown_kind_or_a_missing_permission_is_named(
    tmp_path: Path, small_dataset: Path
) -> None:
    from kubernetes import client

    class Refusing:
        def __init__(self, status: int) -> None:
            self.status = status

        def create_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
            raise client.ApiException(status=self.status, reason="refused")

    from spanmill.train.trainjob import _create

    manifest = _render()
    for status, expected in ((404, "install the Kubeflow Trainer"), (403, "trainer.enabled")):
        with pytest.raises(TrainError, match=expected):
            _create(Refusing(status), manifest, "TrainJob x", poll_s=0.1, sleep=time.sleep)


def test_the_step_hands_over_only_when_its_pod_holds_no_gpu(
    tmp_path: Path, small_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spanmill.errors import ConfigError
    from spanmill.pipeline.steps import train_step

    monkeypatch.delenv("SPANMILL_TRAINJOB_STAGING_URL", raising=False)
    out = tmp_path / "adapter"
    with pytest.raises(ConfigError, match="set gpus to 0"):
        train_step(small_dataset, out, trainer="trainjob", gpus=1)
    with pytest.raises(ConfigError, match="pod or trainjob"):
        train_step(small_dataset, out, trainer="job")
    # Without the chart's settings the step says which one it lacks, before any API call.
    with pytest.raises(TrainError, match="SPANMILL_TRAINJOB_STAGING_URL"):
        train_step(small_dataset, out, trainer="trainjob", gpus=0)
    # An adapter the vLLM engine could not load is refused before hours of training.
    monkeypatch.setenv("SPANMILL_SERVING_FLAVOUR", "vllm")
    monkeypatch.setenv("SPANMILL_SERVING_VLLM_MAX_LORA_RANK", "32")
    with pytest.raises(ConfigError, match="lora_r 64 is above the vLLM engine's max_lora_rank 32"):
        train_step(small_dataset, out, trainer="trainjob", gpus=0, lora_r=64)
    assert not out.exists()
