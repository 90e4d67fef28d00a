"""Bad values fail at install, by the real helm, with a message that names the value."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CHART, lint, template

SCHEMA = json.loads((CHART / "values.schema.json").read_text())

# (values file, what the error must say). Each names the offending value.
BAD_VALUES = {
    "wrong-type": ("gateway:\n  replicas: two\n", "gateway.replicas: Invalid type"),
    "wrong-nested-type": (
        "triton:\n  gpu:\n    count: 1.5\n",
        "triton.gpu.count: Invalid type. Expected: integer",
    ),
    "unknown-key": (
        "collector:\n  replicass: 2\n",
        "collector: Additional property replicass is not allowed",
    ),
    "unknown-top-level-key": ("colector: {}\n", "Additional property colector is not allowed"),
    # null removes a default, as `helm install --set kafka.bootstrapServers=null` does.
    "missing-required": (
        "kafka:\n  bootstrapServers: null\n",
        "kafka: bootstrapServers is required",
    ),
    "empty-required-brokers": ('kafka:\n  bootstrapServers: ""\n', "kafka.bootstrapServers"),
    "missing-mlflow-uri": ("mlflow:\n  server:\n    enabled: false\n", "mlflow.trackingUri"),
    "malformed-brokers": (
        "kafka:\n  bootstrapServers: kafka.example\n",
        "kafka.bootstrapServers: Does not match pattern",
    ),
    "password-as-a-value": (
        "kafka:\n  sasl:\n    password: hunter2\n",
        "kafka.sasl: Additional property password is not allowed",
    ),
    "sasl-without-mechanism": ("kafka:\n  securityProtocol: SASL_SSL\n", "kafka.sasl.mechanism"),
    "sasl-without-secret": (
        "kafka:\n  sasl:\n    mechanism: PLAIN\n",
        "kafka.sasl.existingSecret",
    ),
    "unknown-flavour": ("triton:\n  flavour: tensorrt\n", "triton.flavour: triton.flavour must be"),
    "vllm-without-gpu": ("triton:\n  flavour: vllm\n", "triton.gpu.count: Must be greater"),
    "vllm-on-s3": (
        "triton:\n  flavour: vllm\n  gpu:\n    count: 1\n",
        "triton.modelRepository.type: triton.modelRepository.type does not match",
    ),
    "vllm-without-evaluation": (
        "triton:\n  flavour: vllm\n  gpu:\n    count: 1\n  modelRepository:\n    type: pvc\n",
        "triton.flavour vllm needs triton.evaluation.enabled",
    ),
    "vllm-engine-over-half-a-gpu": (
        "triton:\n  vllm:\n    gpuMemoryUtilization: 0.9\n",
        "triton.vllm.gpuMemoryUtilization: Must be less than or equal to 0.5",
    ),
    "vllm-rank-vllm-refuses": (
        "triton:\n  vllm:\n    maxLoraRank: 100\n",
        "triton.vllm.maxLoraRank must be one of the following: 8, 16",
    ),
    "floating-image-tag": ("image:\n  tag: latest\n", "image.tag: Must not validate"),
    "floating-triton-tag": ("triton:\n  image:\n    tag: latest\n", "triton.image.tag"),
    "triton-repository-without-tag": (
        "triton:\n  image:\n    repository: registry.example.internal/triton\n",
        "triton.image.tag: String length must be greater than or equal to 1",
    ),
    "more-collectors-than-partitions": (
        "collector:\n  autoscaling:\n    maxReplicas: 12\n",
        "collector.autoscaling.maxReplicas (12) exceeds kafka.topics.partitions (6)",
    ),
    "renew-deadline-past-the-lease": (
        "rollout:\n  leaderElection:\n    renewDeadlineSeconds: 15\n",
        "rollout.leaderElection.renewDeadlineSeconds (15) must be below "
        "rollout.leaderElection.leaseDurationSeconds (15)",
    ),
    "mlflow-auth-without-admin": (
        'mlflow:\n  server:\n    auth:\n      existingSecret: ""\n',
        "mlflow.server.auth.existingSecret",
    ),
    "mlflow-auth-without-controller-user": (
        'mlflow:\n  auth:\n    controllerSecret: ""\n',
        "mlflow.server.auth.enabled refuses anonymous requests: the rollout controller needs",
    ),
    "mlflow-ingress-without-host": (
        "mlflow:\n  server:\n    ingress:\n      enabled: true\n",
        "mlflow.server.ingress.host",
    ),
    "mlflow-ingress-without-auth": (
        "mlflow:\n  server:\n    auth:\n      enabled: false\n"
        "    ingress:\n      enabled: true\n      host: mlflow.example.internal\n",
        "mlflow.server.ingress.enabled exposes MLflow outside the cluster",
    ),
    "mlflow-ingress-blocked-by-network-policy": (
        "mlflow:\n  server:\n    ingress:\n      enabled: true\n"
        "      host: mlflow.example.internal\n",
        "mlflow.server.ingress.enabled with networkPolicy.enabled: list the ingress controller's",
    ),
    # The evaluation steps mount the repository's claim: not from another namespace.
    "model-volume-out-of-the-runs-reach": (
        "triton:\n  modelRepository:\n    type: pvc\npipelineSettings:\n  namespace: kubeflow\n",
        "triton.modelRepository.type pvc: the pipeline's evaluation steps mount the "
        "repository's claim to stage their candidates, and pipeline runs in namespace "
        "kubeflow cannot mount a claim of namespace",
    ),
}
# Checks across values that JSON schema cannot express are template errors: they fail
# `helm template` and `helm install`; `helm lint` reports them without failing.
TEMPLATE_CHECKS = {
    "more-collectors-than-partitions",
    "renew-deadline-past-the-lease",
    "mlflow-auth-without-controller-user",
    "mlflow-ingress-without-auth",
    "mlflow-ingress-blocked-by-network-policy",
    "vllm-without-evaluation",
    "model-volume-out-of-the-runs-reach",
}


@pytest.fixture(params=sorted(BAD_VALUES))
def bad_values(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    text, expected = BAD_VALUES[request.param]
    path = tmp_path / f"{request.param}.yaml"
    path.write_text(text)
    return path, expected


def _is_template_check(path: Path) -> bool:
    return path.stem in TEMPLATE_CHECKS


def test_bad_values_fail_helm_template_naming_the_value(
    helm: Path, bad_values: tuple[Path, str]
) -> None:
    path, expected = bad_values
    result = template(helm, [path])
    assert result.returncode != 0, f"helm template accepted {path.name}"
    assert expected in result.output, result.output


def test_bad_values_fail_helm_lint_naming_the_value(
    helm: Path, bad_values: tuple[Path, str]
) -> None:
    path, expected = bad_values
    result = lint(helm, [path])
    assert expected in result.output, result.output
    if _is_template_check(path):
        assert f"Fail: {expected}" in result.output
    else:
        assert result.returncode != 0, f"helm lint accepted {path.name}"


def test_a_fixed_value_renders_again(helm: Path, tmp_path: Path) -> None:
    path = tmp_path / "good.yaml"
    path.write_text("kafka:\n  bootstrapServers: b-1.example:9092,b-2.example:9092\n")
    assert template(helm, [path]).returncode == 0
    assert lint(helm, [path]).returncode == 0


def _objects(schema: dict[str, Any], where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if schema.get("type") == "object":
        if "properties" in schema:
            yield where or "(values)", schema
            for name, sub in schema["properties"].items():
                yield from _objects(sub, f"{where}.{name}".lstrip("."))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            yield from _objects(extra, f"{where}.*")
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        yield from _objects(schema["items"], f"{where}[]")


def test_every_values_object_is_closed_and_fully_required() -> None:
    for where, schema in _objects(SCHEMA):
        assert schema["additionalProperties"] is False, f"{where} accepts unknown keys"
        required = set(schema.get("required", []))
        optional = set(schema["properties"]) - required
        # Only Kubernetes' own resources and the routing table's role (which has a
        # default in RoutingTable) may be left out.
        allowed = {"requests", "limits"} if where.endswith(".resources") else {"role"}
        assert optional <= allowed, f"{where}: {sorted(optional)} not required"


def test_every_value_is_described() -> None:
    for where, schema in _objects(SCHEMA):
        for name, sub in schema["properties"].items():
            if where.startswith("gateway.routing.initial.routes"):
                continue
            assert sub.get("description"), f"{where}.{name} has no description"


SECRET_LIKE = re.compile(r"password|secret|token|credential|apikey|api_key", re.I)


def test_no_value_can_hold_a_secret_only_a_reference() -> None:
    """A key that sounds like a credential is a Secret name or a key in a Secret."""
    for where, schema in _objects(SCHEMA):
        for name, sub in schema["properties"].items():
            if not SECRET_LIKE.search(name):
                continue
            path = f"{where}.{name}"
            if sub.get("type") == "object":
                assert set(sub["properties"]) == {"existingSecret", "key"}, path
            else:
                # existingSecret, caSecret, pullSecrets: names of Secrets; *Key: keys in them.
                assert name.endswith(("Secret", "Secrets", "Key")), path


# Maps that are one value each: Kubernetes objects, labels, the routing table.
LEAF_MAPS = {"resources", "nodeSelector", "affinity", "labels", "initial"}


def _leaves(values: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(values, dict) and values and prefix.rpartition(".")[2] not in LEAF_MAPS:
        for key, value in values.items():
            yield from _leaves(value, f"{prefix}.{key}".lstrip("."))
    else:
        yield prefix


def test_readme_lists_every_value(chart_values: dict[str, Any]) -> None:
    readme = (CHART / "README.md").read_text()
    table = readme.split("\n## Values\n", 1)[1]
    rows = {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", table, re.M)}
    leaves = set(_leaves(chart_values))
    assert leaves - rows == set(), "README.md lacks rows for these values"
    assert rows - leaves == set(), "README.md lists values that do not exist"


def test_ci_value_sets_only_use_known_values() -> None:
    for path in sorted((CHART / "ci").glob("*.yaml")):
        values = yaml.safe_load(path.read_text()) or {}
        assert set(values) <= set(SCHEMA["properties"]), path.name
