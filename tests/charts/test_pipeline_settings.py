"""The pipeline's settings from the cluster: the ConfigMap the chart writes holds exactly
the keys the compiled pipeline mounts, every step's environment built from it loads
every settings model a step reads, and versions are written the way the controller
writes them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from helm_render import CHART, Rendered, env_of, merged_values, parse, template

from spanmill.config import (
    CollectorSettings,
    MLflowSettings,
    ServingSettings,
    TritonSettings,
    load_settings,
)
from spanmill.evaluate.settings import EvalSettings, GatePolicy
from spanmill.pipeline import cluster
from spanmill.pipeline.build import DEFAULT_PACKAGE
from spanmill.train import TrainSettings

SECRETS = {
    "spanmill-mlflow": {"username": "pipeline", "password": "not-a-real-password"},
    "spanmill-s3": {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "not-a-real-key"},
}


def executors() -> dict[str, dict[str, Any]]:
    _, platform = yaml.safe_load_all(DEFAULT_PACKAGE.read_text())
    found: dict[str, dict[str, Any]] = platform["platforms"]["kubernetes"]["deploymentSpec"][
        "executors"
    ]
    return found


def configmap_of(rendered: Rendered) -> dict[str, str]:
    data: dict[str, str] = rendered.get("ConfigMap", cluster.CONFIGMAP)["data"]
    return data


def test_the_configmap_holds_what_the_pipeline_mounts(rendered: Rendered) -> None:
    data = configmap_of(rendered)
    assert set(data) == set(cluster.SETTINGS)
    assert all(isinstance(value, str) for value in data.values())


def test_every_step_loads_its_settings_from_the_cluster(rendered: Rendered) -> None:
    configmaps = {cluster.CONFIGMAP: configmap_of(rendered)}
    for name, platform in executors().items():
        env = cluster.step_environment(platform, configmaps, SECRETS)
        with pytest.MonkeyPatch.context() as patch:
            for key in list(env):
                patch.setenv(key, env[key])
            store = load_settings(CollectorSettings)
            assert store.store_url.startswith("s3://"), name
            assert store.storage_options["client_kwargs"]["region_name"], name
            assert "127.0.0.1" not in load_settings(MLflowSettings).tracking_uri, name
            triton = load_settings(TritonSettings)
            assert "127.0.0.1" not in triton.http_url, name
            serving = load_settings(ServingSettings)
            # No pod sees another's files: base weights go into every version.
            assert serving.copy_base, name
            assert "://" in load_settings(TrainSettings).base_model or "/" in (
                load_settings(TrainSettings).base_model
            )
            # The chart's gate, not a laptop's defaults: what passes is rolled out.
            gate = load_settings(EvalSettings).gate
            values = merged_values(rendered.name)["pipelineSettings"]["gate"]
            assert gate.min_items == values["minItems"] > GatePolicy().min_items, name
            assert gate.require_significant is values["requireSignificant"] is True, name
        assert env["MLFLOW_TRACKING_PASSWORD"] == "not-a-real-password"


def test_steps_write_versions_as_the_controller_does(rendered: Rendered) -> None:
    data = configmap_of(rendered)
    controller = env_of(rendered.container("spanmill-rollout"))
    shared = [k for k in cluster.SETTINGS if k.startswith(("SPANMILL_SERVING_", "SPANMILL_TRITON"))]
    assert shared
    for key in shared:
        assert controller[key]["value"] == data[key], key


def test_a_missing_configmap_or_key_is_named() -> None:
    platform = executors()["exec-build-dataset"]
    with pytest.raises(cluster.ClusterSettingsError, match="ConfigMap spanmill-pipeline"):
        cluster.step_environment(platform, {}, SECRETS)
    partial = {cluster.CONFIGMAP: {"SPANMILL_COLLECTOR_STORE_URL": "s3://b/spans"}}
    with pytest.raises(cluster.ClusterSettingsError, match="has no key"):
        cluster.step_environment(platform, partial, SECRETS)
    # The Secrets are optional: pods may reach the object store by their own identity.
    full = {cluster.CONFIGMAP: dict.fromkeys(cluster.SETTINGS, "")}
    assert "AWS_ACCESS_KEY_ID" not in cluster.step_environment(platform, full, {})


def test_the_configmap_lives_where_runs_execute(helm: Any, tmp_path: Any) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("pipelineSettings:\n  namespace: team-a\n")
    result = template(helm, [CHART / "ci" / "defaults.yaml", values])
    assert result.returncode == 0, result.output
    configmap = parse("team-a", result.stdout).get("ConfigMap", cluster.CONFIGMAP)
    assert configmap["metadata"]["namespace"] == "team-a"
    values.write_text("pipelineSettings:\n  enabled: false\n")
    result = template(helm, [CHART / "ci" / "defaults.yaml", values])
    assert parse("off", result.stdout).find("ConfigMap", cluster.CONFIGMAP) is None


def test_the_defaults_agree_on_where_runs_execute(chart_values: dict[str, Any]) -> None:
    """The ConfigMap, the ServiceAccount bound to list Triton's pods and the network policy
    that lets runs reach MLflow and Triton all name the same namespace."""
    namespace = chart_values["pipelineSettings"]["namespace"]
    assert namespace == "kubeflow"
    assert chart_values["pipelineSettings"]["serviceAccount"] == "pipeline-runner"
    peers = chart_values["networkPolicy"]["pipelineRuns"]
    selected = [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in peers]
    assert selected == [namespace]


def test_rl_runs_reach_external_brokers_that_ask_sasl_and_trust_their_own_ca(
    render_set: Any,
) -> None:
    """Managed Kafka with SASL over TLS and a private CA: the steps got no mechanism, no
    user and no CA, so GRPO's rollout reader could not sign in (kafka-python refuses a
    mechanism of None) nor trust the brokers."""
    from spanmill.config import KafkaSettings

    rendered = render_set("external-kafka-sasl")
    configmaps = {cluster.CONFIGMAP: configmap_of(rendered)}
    secrets = {**SECRETS, cluster.KAFKA_SECRET: {"password": "not-a-real-password"}}
    platform = executors()["exec-train-rl"]
    env = cluster.step_environment(platform, configmaps, secrets)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        options = load_settings(KafkaSettings).client_options()
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "spanmill-pipeline"
    assert options["sasl_plain_password"] == "not-a-real-password"
    # The CA file is where the compiled step mounts the Secret that holds it.
    (volume,) = [v for v in platform["secretAsVolume"]
                 if v["secretName"] == cluster.KAFKA_CA_SECRET]  # fmt: skip
    assert volume["optional"] is True
    assert options["ssl_cafile"] == f"{volume['mountPath']}/{cluster.KAFKA_CA_KEY}"
    # Plain brokers: no CA, no SASL; the empty keys are nothing.
    plain = {cluster.CONFIGMAP: configmap_of(render_set("defaults"))}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in cluster.step_environment(platform, plain, SECRETS).items():
            patch.setenv(key, value)
        options = load_settings(KafkaSettings).client_options()
    assert "ssl_cafile" not in options and "sasl_mechanism" not in options


def test_external_sasl_without_a_pipeline_user_is_refused_at_install(helm: Any) -> None:
    result = template(
        helm,
        [CHART / "ci" / "external-kafka-sasl.yaml"],
        ["--set", "pipelineSettings.kafkaUsername="],
    )
    assert result.returncode != 0 and "pipelineSettings.kafkaUsername is required" in result.output
