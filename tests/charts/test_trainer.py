"""The chart's side of training on several nodes (trainer.enabled): the TrainingRuntime,
the pipeline's permission on TrainJobs and the settings the training step reads, each
as the Kubeflow Trainer and the step will take them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from helm_render import KUBE_VERSION, Rendered, manifest_validator

from pipelines.flywheel import TIMEOUT_S
from spanmill.config import load_settings
from spanmill.pipeline import cluster
from spanmill.train import TrainSettings
from spanmill.train.settings import TrainJobSettings
from spanmill.train.trainjob import render_trainjob

PIPELINE_NAMESPACE = "kubeflow"  # ci/trainer.yaml's pipelineSettings.namespace


def _runtime(rendered: Rendered) -> dict[str, Any]:
    return rendered.get("TrainingRuntime", "spanmill-train")


def test_no_trainer_resources_unless_enabled(render_set: Any) -> None:
    rendered = render_set("defaults")
    assert rendered.kinds("TrainingRuntime") == []
    assert rendered.find("ConfigMap", cluster.TRAINJOB_CONFIGMAP) is None


def test_the_runtime_runs_the_training_image_under_the_torch_policy(render_set: Any) -> None:
    rendered = render_set("trainer")
    runtime = _runtime(rendered)
    assert runtime["metadata"]["namespace"] == PIPELINE_NAMESPACE
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    # What the Trainer looks for: the "node" job of the trainer step, its "node" container.
    assert job["name"] == "node"
    assert job["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == (
        "trainer"
    )
    pod = job["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "node"
    assert pod["nodeSelector"] == {"spanmill.io/pool": "gpu"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/tmp", "/dev/shm"} <= mounts
    settings = rendered.get("ConfigMap", cluster.TRAINJOB_CONFIGMAP)["data"]
    assert container["image"] == settings["SPANMILL_TRAINJOB_IMAGE"]
    # The training step's own image (components.TRAIN_IMAGE): one image runs every rank.
    assert container["image"] == "ghcr.io/spanmill/train:0.1.0"


def test_the_pipelines_account_may_create_read_and_delete_trainjobs_only(
    render_set: Any,
) -> None:
    rendered = render_set("trainer")
    role = rendered.get("Role", "spanmill-pipeline-trainjobs")
    assert role["metadata"]["namespace"] == PIPELINE_NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": ["trainer.kubeflow.org"],
            "resources": ["trainjobs"],
            "verbs": ["create", "get", "delete"],
        }
    ]
    binding = rendered.get("RoleBinding", "spanmill-pipeline-trainjobs")
    assert binding["metadata"]["namespace"] == PIPELINE_NAMESPACE
    assert binding["roleRef"]["name"] == "spanmill-pipeline-trainjobs"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": PIPELINE_NAMESPACE}
    ]


def test_the_step_loads_its_settings_and_its_trainjob_fits_the_runtime(
    render_set: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = render_set("trainer")
    configmap = rendered.get("ConfigMap", cluster.TRAINJOB_CONFIGMAP)
    assert configmap["metadata"]["namespace"] == PIPELINE_NAMESPACE
    data = configmap["data"]
    # Exactly what the compiled pipeline mounts into the training step.
    assert set(data) == set(cluster.TRAINJOB_SETTINGS)
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    job = load_settings(TrainJobSettings)
    assert job.staging_url == "s3://spanmill/trainjobs"
    assert (job.cpu_per_node, job.memory_per_node) == ("8", "64Gi")
    # The step gives up, and says so, before its pod's own deadline ends it unexplained.
    assert (job.deadline_s, job.wait_s) == (86400, 90000)
    assert job.wait_s <= TIMEOUT_S["train"] and TrainJobSettings().wait_s <= TIMEOUT_S["train"]

    runtime = _runtime(rendered)
    trainjob = render_trainjob(
        name="spanmill-train-0123456789", namespace=PIPELINE_NAMESPACE,
        dataset_url=f"{job.staging_url}/x/dataset", output_url=f"{job.staging_url}/x/output",
        nodes=2, gpus_per_node=8, gpu_resource="nvidia.com/gpu",
        settings=TrainSettings(base_model="HuggingFaceTB/SmolLM2-135M-Instruct"), job=job,
        config_maps={cluster.CONFIGMAP: cluster.SETTINGS}, secrets=cluster.SECRETS,
    )  # fmt: skip
    # The runtime it names is the chart's, in the TrainJob's own namespace.
    ref = trainjob["spec"]["runtimeRef"]
    assert (ref["kind"], ref["name"]) == (runtime["kind"], runtime["metadata"]["name"])
    assert trainjob["metadata"]["namespace"] == runtime["metadata"]["namespace"]
    assert trainjob["spec"]["trainer"]["image"] == data["SPANMILL_TRAINJOB_IMAGE"]
    report = manifest_validator().Report()
    manifest_validator().validate_document(trainjob, KUBE_VERSION, report, "step")
    assert report.errors == [] and report.validated == {"TrainJob": 1}


def test_trainer_resources_are_validated_against_the_vendored_crds(render_set: Any) -> None:
    validator = manifest_validator()
    runtime = _runtime(render_set("trainer"))
    report = validator.Report()
    validator.validate_document(runtime, KUBE_VERSION, report, "trainer")
    assert report.errors == [] and report.validated == {"TrainingRuntime": 1}
    assert report.skipped == {}

    bad = copy.deepcopy(runtime)
    bad["spec"]["mlPolicy"]["torchh"] = {}
    job = bad["spec"]["template"]["spec"]["replicatedJobs"][0]
    job["template"]["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    del bad["metadata"]["name"]
    report = validator.Report()
    validator.validate_document(bad, KUBE_VERSION, report, "bad")
    assert len(report.errors) == 3, report.errors
    joined = "\n".join(report.errors)
    assert "'torchh' was unexpected" in joined and "'imagePullPolcy' was unexpected" in joined
    assert "'name' is a required property" in joined


def test_the_wait_may_not_pass_the_steps_deadline() -> None:
    """The schema's bound is the training step's deadline in the compiled pipeline."""
    import json
    from pathlib import Path

    schema = json.loads(
        (Path(__file__).resolve().parents[2] / "charts/spanmill/values.schema.json").read_text()
    )
    wait = schema["properties"]["trainer"]["properties"]["waitSeconds"]
    assert wait["maximum"] == TIMEOUT_S["train"]
