"""The compiled flywheel: fresh, loadable, carrying the cluster settings; upload and schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import components
from kfp_fake import kfp_app

from components import IMAGE, TRAIN_IMAGE
from spanmill.pipeline import cluster
from spanmill.pipeline.build import DEFAULT_PACKAGE, compile_pipeline
from spanmill.pipeline.kubeflow import KubeflowError, schedule, upload


def test_committed_yaml_is_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPANMILL_PIPELINE_IMAGE", raising=False)
    monkeypatch.delenv("SPANMILL_PIPELINE_TRAIN_IMAGE", raising=False)
    fresh = compile_pipeline(tmp_path / "flywheel.yaml").read_text()
    assert DEFAULT_PACKAGE.read_text() == fresh, (
        "pipelines/flywheel.yaml is stale: run `spanmill pipeline compile` and commit it"
    )


def _tasks(spec: dict[str, Any]) -> dict[str, Any]:
    """Every task of the pipeline, branches included, by name."""
    dags = [spec["root"]["dag"]] + [c["dag"] for c in spec["components"].values() if "dag" in c]
    return {name: task for dag in dags for name, task in dag["tasks"].items()}


def test_compiled_yaml_loads_and_carries_cluster_settings() -> None:
    loaded = components.load_component_from_file(str(DEFAULT_PACKAGE))
    assert loaded.name == "flywheel"
    assert {"agent", "since", "base_model", "lora_r", "margin", "max_steps"} <= set(
        loaded.component_spec.inputs or {}
    )
    spec, platform = yaml.safe_load_all(DEFAULT_PACKAGE.read_text())
    executors = spec["deploymentSpec"]["executors"]
    # Supervised training (train-lora: sft or dpo, and before GRPO with sft+grpo) and GRPO
    # (train-rl) each appear in two branches of train_method.
    trainers = ["exec-train-lora", "exec-train-lora-2", "exec-train-rl", "exec-train-rl-2"]
    for name in trainers[:2]:
        accelerator = executors[name]["container"]["resources"]["accelerator"]
        # One training process per GPU: the pod asks for the run's `gpus`, 1 unless set.
        assert accelerator["resourceCount"] == "{{$.inputs.parameters['pipelinechannel--gpus']}}"
    for name in trainers[2:]:  # GRPO generates and trains in one process on one GPU
        assert executors[name]["container"]["resources"]["accelerator"]["resourceCount"] == "1"
    root_inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert root_inputs["gpus"]["defaultValue"] == 1
    assert root_inputs["trainer"]["defaultValue"] == "pod"
    assert root_inputs["train_method"]["defaultValue"] == "sft"
    tasks = _tasks(spec)
    train_task = tasks["train-lora"]["inputs"]["parameters"]
    for name in ("gpus", "trainer", "trainjob_nodes", "trainjob_gpus_per_node"):
        assert train_task[name]["componentInputParameter"] == f"pipelinechannel--{name}"
    # GRPO after SFT starts from the SFT adapter; GRPO alone from the base model.
    after_sft = tasks["train-rl-2"]["inputs"]["artifacts"]["init_model"]["taskOutputArtifact"]
    assert after_sft == {"outputArtifactKey": "model", "producerTask": "train-lora"}
    assert "artifacts" not in tasks["train-rl"]["inputs"]
    # Each branch evaluates, and registers if the gate passes, the model it trained.
    for evaluation, registration, trained in (
        ("evaluate", "register-model", "train-rl"),
        ("evaluate-2", "register-model-2", "train-rl-2"),
        ("evaluate-3", "register-model-3", "train-lora-2"),
    ):
        model = tasks[evaluation]["inputs"]["artifacts"]["model"]["taskOutputArtifact"]
        assert model["producerTask"] == trained, evaluation
        # Inside the gate's condition, the same artifact comes in as the branch's input.
        model = tasks[registration]["inputs"]["artifacts"]["model"]["componentInputArtifact"]
        assert model == f"pipelinechannel--{trained}-model", registration
    # The training steps run the CUDA image, every other step the CPU pipeline image.
    images = {name: e["container"]["image"] for name, e in executors.items()}
    assert {images.pop(name) for name in trainers} == {TRAIN_IMAGE}
    assert set(images.values()) == {IMAGE}
    gpu_users = [
        n for n, e in executors.items() if "accelerator" in e["container"].get("resources", {})
    ]
    assert sorted(gpu_users) == trainers
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in trainers:
        assert k8s[name]["nodeSelector"]["labels"] == {"spanmill.io/pool": "gpu"}
        assert k8s[name]["tolerations"][0]["key"] == "nvidia.com/gpu"
    steps = ["exec-check-run", "exec-build-dataset", *trainers] + [
        f"exec-{step}{suffix}"
        for step in ("evaluate", "register-model")
        for suffix in ("", "-2", "-3")
    ]
    assert sorted(steps) == sorted(executors)
    for name in steps:
        secrets = {s["secretName"] for s in k8s[name]["secretAsEnv"]}
        judged_secret = {"spanmill-judge"} if name.startswith("exec-evaluate") else set()
        assert secrets == {*cluster.SECRETS, *judged_secret}, name
        envs = {m["envVar"] for s in k8s[name]["secretAsEnv"] for m in s["keyToEnv"]}
        assert {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"} <= envs
        # Every connection setting from the chart's ConfigMap, required: a run whose
        # namespace lacks it fails to start, naming it, instead of reaching 127.0.0.1.
        settings, *handover = k8s[name]["configMapAsEnv"]
        # Supervised training alone also reads the Kubeflow Trainer hand-over's settings.
        assert len(handover) == name.startswith("exec-train-lora"), name
        assert settings["configMapName"] == cluster.CONFIGMAP and not settings.get("optional")
        mapped = {m["configMapKey"]: m["envVar"] for m in settings["keyToEnv"]}
        assert mapped == {key: key for key in cluster.SETTINGS}, name
    (handover,) = k8s["exec-train-lora"]["configMapAsEnv"][1:]
    assert handover["configMapName"] == cluster.TRAINJOB_CONFIGMAP and handover["optional"]
    mapped = {m["configMapKey"]: m["envVar"] for m in handover["keyToEnv"]}
    assert mapped == {key: key for key in cluster.TRAINJOB_SETTINGS}
    # The judge's key reaches the evaluate step only, from its own Secret.
    judge_env = {m["envVar"] for s in k8s["exec-evaluate"]["secretAsEnv"] for m in s["keyToEnv"]}
    assert "SPANMILL_EVAL_JUDGE_API_KEY" in judge_env
    # The evaluation is the run's visualisation: a Markdown and an HTML report, and metrics.
    outputs = spec["components"]["comp-evaluate"]["outputDefinitions"]["artifacts"]
    kinds = {name: o["artifactType"]["schemaTitle"] for name, o in outputs.items()}
    assert kinds["report"] == "system.Markdown" and kinds["report_html"] == "system.HTML"
    assert kinds["metrics"] == "system.Metrics"
    assert {"evaluators", "judge_url", "judge_model", "gate_metric", "flavour"} <= set(
        spec["components"]["comp-evaluate"]["inputDefinitions"]["parameters"]
    )
    # Late feedback: how far past the calls' window rewards are read, and which reward.
    assert {"feedback_horizon_hours", "reward"} <= set(
        spec["components"]["comp-build-dataset"]["inputDefinitions"]["parameters"]
    )
    # Only a passing challenger is registered.
    gates = [t for t in _tasks(spec).values() if "evaluate" in json.dumps(t.get("triggerPolicy"))]
    assert len(gates) == 3  # one gate per branch of train_method


def test_upload_creates_then_versions_and_schedule(  # type: ignore[no-untyped-def]
    serve_app, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPANMILL_KFP_TOKEN", "test-token-value")
    app = kfp_app()
    with serve_app(app, health_path="/apis/v2beta1/healthz") as url:
        first = upload(url, DEFAULT_PACKAGE)
        second = upload(url, DEFAULT_PACKAGE)
        assert first.new_pipeline and not second.new_pipeline
        assert first.pipeline_id == second.pipeline_id
        assert first.version_name.startswith("flywheel-") and first.version_id != second.version_id
        stored = app.state.pipelines[first.pipeline_id]
        assert [yaml.safe_load_all(v).__next__()["pipelineInfo"]["name"]
                for v in stored["versions"]] == ["flywheel"] * 3  # fmt: skip
        run_id = schedule(url, pipeline_id=first.pipeline_id, version_id=second.version_id,
                          cron="0 0 2 * * *", params={"max_steps": 30})  # fmt: skip
        recurring = app.state.recurring[0]
        assert recurring["recurring_run_id"] == run_id
        assert recurring["trigger"]["cron_schedule"]["cron"] == "0 0 2 * * *"
        assert recurring["pipeline_version_reference"]["pipeline_version_id"] == second.version_id
        assert recurring["runtime_config"]["parameters"] == {"max_steps": 30}
        assert "Bearer test-token-value" in app.state.auth
        # Without a version id (KFP wants one: the command as documented failed), the
        # latest; scheduled again after an upload, the nightly run moves onto the new
        # version, where two recurring runs of one name overlapped.
        third = upload(url, DEFAULT_PACKAGE)
        again = schedule(url, pipeline_id=first.pipeline_id, version_id=None,
                         cron="0 0 3 * * *")  # fmt: skip
        (recurring,) = app.state.recurring
        assert recurring["recurring_run_id"] == again != run_id
        assert recurring["pipeline_version_reference"]["pipeline_version_id"] == third.version_id
        assert recurring["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * *"
        with pytest.raises(KubeflowError, match="6 fields"):
            schedule(url, pipeline_id="p", version_id=None, cron="0 2 * * *")
    with pytest.raises(KubeflowError, match="no compiled pipeline"):
        upload(url, tmp_path / "missing.yaml")


def test_upload_runs_the_steps_in_the_clusters_own_images(  # type: ignore[no-untyped-def]
    serve_app,
) -> None:
    """The package is compiled once, in the pipeline image, for the images' default
    names; a cluster pulls from its own registry (the chart's upload Job gives them)."""
    import components

    compiled = {
        e["container"]["image"]
        for e in yaml.safe_load_all(DEFAULT_PACKAGE.read_text())
        .__next__()["deploymentSpec"]["executors"]
        .values()
    }
    assert compiled == {components.IMAGE, components.TRAIN_IMAGE}
    app = kfp_app()
    with serve_app(app, health_path="/apis/v2beta1/healthz") as url:
        uploaded = upload(url, DEFAULT_PACKAGE, image="registry.example/ml/pipeline:7",
                          train_image="registry.example/ml/train:7",
                          model_claim="spanmill-models", model_path="/models")  # fmt: skip
    documents = list(yaml.safe_load_all(app.state.pipelines[uploaded.pipeline_id]["versions"][0]))
    executors = documents[0]["deploymentSpec"]["executors"]
    images = {name: e["container"]["image"] for name, e in executors.items()}
    assert set(images.values()) == {"registry.example/ml/pipeline:7", "registry.example/ml/train:7"}
    assert images["exec-train-lora"] == "registry.example/ml/train:7"
    assert images["exec-build-dataset"] == "registry.example/ml/pipeline:7"
    # The evaluation steps stage their candidates in the repository on the volume: they
    # mount its claim, as kfp-kubernetes' mount_pvc compiles it; no other step does.
    platform = documents[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    mounted = {name for name, spec in platform.items() if spec.get("pvcMount")}
    assert mounted == {name for name in executors if name.startswith("exec-evaluate")}
    assert len(mounted) == 3  # one evaluation a branch of train_method
    for name in mounted:
        assert platform[name]["pvcMount"] == [{
            "constant": "spanmill-models", "mountPath": "/models",
            "pvcNameParameter": {"runtimeValue": {"constant": "spanmill-models"}},
        }]  # fmt: skip
    # Everything else as compiled: the platform spec (Secrets, ConfigMaps) too.
    original = list(yaml.safe_load_all(DEFAULT_PACKAGE.read_text()))
    for name in mounted:
        del platform[name]["pvcMount"]
    assert documents[1] == original[1]
    assert {k: v for k, v in documents[0].items() if k != "deploymentSpec"} == {
        k: v for k, v in original[0].items() if k != "deploymentSpec"
    }


def test_upload_signs_with_the_service_account_token_only_when_asked(  # type: ignore[no-untyped-def]
    serve_app, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from spanmill.cli.main import app as cli
    from spanmill.pipeline.kubeflow import client

    monkeypatch.delenv("SPANMILL_KFP_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("projected-token-1\n")
    app = kfp_app()
    with serve_app(app, health_path="/apis/v2beta1/healthz") as url:
        upload(url, DEFAULT_PACKAGE)
        assert app.state.auth and set(app.state.auth) == {None}, "no option, no header"
        app.state.auth.clear()
        upload(url, DEFAULT_PACKAGE, token_file=token)
        assert app.state.auth and set(app.state.auth) == {"Bearer projected-token-1"}
        # The kubelet replaces the token before it expires: the next request reads it.
        app.state.auth.clear()
        kfp_client = client(url, token_file=token)
        kfp_client.get_pipeline_id("flywheel")
        token.write_text("projected-token-2")
        kfp_client.get_pipeline_id("flywheel")
        assert app.state.auth[-1] == "Bearer projected-token-2"
        assert "Bearer projected-token-1" in app.state.auth
        # The chart's Job: `spanmill pipeline upload --sa-token` (the file given here).
        app.state.auth.clear()
        args = ["pipeline", "upload", "--endpoint", url, "--sa-token", "--token-file", str(token)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert app.state.auth and set(app.state.auth) == {"Bearer projected-token-2"}
        # No token where it should be: a clear error before any request.
        app.state.auth.clear()
        with pytest.raises(KubeflowError, match="cannot read the service-account token"):
            upload(url, DEFAULT_PACKAGE, token_file=tmp_path / "missing")
        token.write_text("")
        with pytest.raises(KubeflowError, match="is empty"):
            upload(url, DEFAULT_PACKAGE, token_file=token)
        token.write_text("projected-token-3")
        monkeypatch.setenv("SPANMILL_KFP_TOKEN", "fixed-token")
        with pytest.raises(KubeflowError, match="use one of them"):
            upload(url, DEFAULT_PACKAGE, token_file=token)
        assert app.state.auth == []


def test_every_step_has_a_deadline_no_step_is_reused_and_registration_retries() -> None:
    """No step had a deadline: one hung step held the recurring run (one at a time) and
    every nightly trigger after it was skipped. Training was the one step KFP could reuse
    from an earlier run, by a key blind to the cluster's settings. A registration that
    failed on an MLflow blip threw the night's training away, though built to be retried."""
    spec, platform = yaml.safe_load_all(DEFAULT_PACKAGE.read_text())
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == set(spec["deploymentSpec"]["executors"])
    deadlines = {name: int(e["activeDeadlineSeconds"]) for name, e in executors.items()}
    assert all(0 < seconds <= 26 * 3600 for seconds in deadlines.values()), deadlines
    tasks = _tasks(spec)
    assert tasks and all(
        task.get("cachingOptions", {}).get("enableCache") is not True for task in tasks.values()
    )
    for name, task in tasks.items():
        if name.startswith("register-model"):
            assert task["retryPolicy"]["maxRetryCount"] == 3, name
        if name.startswith("evaluate"):
            # Retried once, named by its run and task across its tries: a retry removes
            # what its killed try left staged in Triton (spanmill.evaluate.served).
            assert task["retryPolicy"]["maxRetryCount"] == 1, name
            given = task["inputs"]["parameters"]
            assert given["pipeline_run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
            assert given["task_name"]["runtimeValue"]["constant"] == "{{$.pipeline_task_name}}"


def test_every_training_task_is_named_by_its_run_and_task() -> None:
    """A retried run may give the training step other paths: its TrainJob is named from
    the run's id and the task's name, which KFP fills in (spanmill.train.trainjob.job_name)."""
    spec, _ = yaml.safe_load_all(DEFAULT_PACKAGE.read_text())
    trainings = {n: t for n, t in _tasks(spec).items() if n.startswith("train-")}
    assert {n.rsplit("-", 1)[0] if n[-1].isdigit() else n for n in trainings} == {
        "train-lora", "train-rl"}  # fmt: skip
    assert trainings
    for name, task in trainings.items():
        given = task["inputs"]["parameters"]
        assert given["pipeline_run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
        assert given["task_name"]["runtimeValue"]["constant"] == "{{$.pipeline_task_name}}", name
