"""Settings: safe defaults for the embedded stack, and errors that name the variable."""

from __future__ import annotations

import pytest

from spanmill.config import (
    CollectorSettings,
    GatewaySettings,
    KafkaSettings,
    RolloutSettings,
    StackSettings,
    load_settings,
)
from spanmill.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("SPANMILL_") and name != "SPANMILL_HOME":
            monkeypatch.delenv(name)


def test_defaults_point_at_the_embedded_stack() -> None:
    stack = load_settings(StackSettings)
    collector = load_settings(CollectorSettings)
    assert collector.kafka.bootstrap_servers == f"127.0.0.1:{stack.kafka_port}"
    assert collector.kafka.spans_topic == "spanmill.spans.v1"
    assert collector.kafka.dlq_topic == "spanmill.spans.v1.dlq"
    assert load_settings(RolloutSettings).mlflow.tracking_uri.endswith(f":{stack.mlflow_port}")
    assert load_settings(GatewaySettings).api_key is None


def test_shared_connection_settings_come_from_their_own_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPANMILL_KAFKA_BOOTSTRAP_SERVERS", "k1:9092,k2:9093")
    monkeypatch.setenv("SPANMILL_COLLECTOR_GROUP_ID", "g1")
    collector = load_settings(CollectorSettings)
    gateway = load_settings(GatewaySettings)
    assert collector.group_id == "g1"
    assert collector.kafka.client_options()["bootstrap_servers"] == ["k1:9092", "k2:9093"]
    assert gateway.kafka.bootstrap_servers == "k1:9092,k2:9093"


@pytest.mark.parametrize(
    ("cls", "variable", "value"),
    [
        (StackSettings, "SPANMILL_STACK_KAFKA_PORT", "70000"),
        (StackSettings, "SPANMILL_STACK_MLFLOW_PORT", "abc"),
        (CollectorSettings, "SPANMILL_COLLECTOR_BATCH_MAX_SPANS", "0"),
        (CollectorSettings, "SPANMILL_KAFKA_BOOTSTRAP_SERVERS", "no-port-here"),
        (GatewaySettings, "SPANMILL_KAFKA_SECURITY_PROTOCOL", "SASL_TEA"),
        (RolloutSettings, "SPANMILL_ROLLOUT_BACKEND", "nomad"),
    ],
)
def test_bad_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, cls: type, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        load_settings(cls)
    assert variable in str(info.value)
    assert value in str(info.value)


def test_secrets_are_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANMILL_KAFKA_SASL_PASSWORD", "hunter2-not-shown")
    settings = load_settings(KafkaSettings, sasl_mechanism="PLAIN", sasl_username="svc")
    assert "hunter2" not in repr(settings)
    assert settings.client_options()["sasl_plain_password"] == "hunter2-not-shown"


def test_a_moved_setting_is_refused_naming_the_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANMILL_ROLLOUT_DTYPE", "float32")
    monkeypatch.setenv("SPANMILL_EVAL_FLAVOUR", "python")
    with pytest.raises(ConfigError) as refused:
        load_settings(RolloutSettings)
    message = str(refused.value)
    assert "SPANMILL_ROLLOUT_DTYPE is now SPANMILL_SERVING_DTYPE" in message
    assert "SPANMILL_EVAL_FLAVOUR is now SPANMILL_SERVING_FLAVOUR" in message
    monkeypatch.delenv("SPANMILL_ROLLOUT_DTYPE")
    monkeypatch.delenv("SPANMILL_EVAL_FLAVOUR")
    monkeypatch.setenv("SPANMILL_SERVING_DTYPE", "float32")
    assert load_settings(RolloutSettings).serving.dtype == "float32"
