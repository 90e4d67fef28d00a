"""The cluster bootstrap in infra/: valid manifests, and the names the chart's defaults expect."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CHART, KUBE_VERSION, ROOT, manifest_validator

INFRA = ROOT / "infra"
MANIFESTS = sorted(p for p in INFRA.rglob("*.yaml") if p.name != "kustomization.yaml")


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _all_documents() -> list[dict[str, Any]]:
    return [d for path in MANIFESTS for d in _documents(path)]


def _find(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _all_documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} in infra/"
    return found[0]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(INFRA)))
def test_infra_manifests_pass_strict_validation(path: Path) -> None:
    validator = manifest_validator()
    report = validator.Report()
    for document in _documents(path):
        validator.validate_document(document, KUBE_VERSION, report, path.name)
    assert report.errors == []


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(INFRA)))
def test_infra_pods_are_pinned_and_hardened(path: Path) -> None:
    for document in _documents(path):
        if document["kind"] not in ("Deployment", "Job"):
            continue
        pod = document["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            image = container["image"]
            tag = image.rpartition(":")[2]
            assert ":" in image and tag != "latest", f"{image} is not pinned"
            assert re.search(r"\d", tag), f"{image} is not an exact release"
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["capabilities"] == {"drop": ["ALL"]}


def test_the_charts_defaults_name_what_infra_creates(chart_values: dict[str, Any]) -> None:
    kafka = _find("Kafka", "spanmill")
    namespace = kafka["metadata"]["namespace"]
    bootstrap = f"{kafka['metadata']['name']}-kafka-bootstrap.{namespace}.svc:9092"
    assert chart_values["kafka"]["bootstrapServers"] == bootstrap
    assert kafka["spec"]["kafka"]["version"] == chart_values["kafka"]["strimzi"]["version"]
    topics = {t["spec"]["topicName"]: t for t in _all_documents() if t["kind"] == "KafkaTopic"}
    spans = chart_values["kafka"]["topics"]["spans"]
    named = chart_values["kafka"]["topics"]
    assert set(topics) == {spans, named["deadLetter"], named["rollouts"]}
    assert topics[spans]["spec"]["partitions"] == chart_values["kafka"]["topics"]["partitions"]

    minio = _find("Service", "minio")
    port = next(p["port"] for p in minio["spec"]["ports"] if p["name"] == "s3")
    endpoint = f"http://{minio['metadata']['name']}.{minio['metadata']['namespace']}.svc:{port}"
    assert chart_values["objectStore"]["endpoint"] == endpoint
    bucket_job = _find("Job", "minio-create-bucket")
    script = bucket_job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert f"mc mb --ignore-existing spanmill/{chart_values['objectStore']['bucket']}" in script

    assert chart_values["pipelineUpload"]["endpoint"] == "http://ml-pipeline.kubeflow.svc:8888"
    for part in ("cluster-scoped", "pipelines"):
        path = INFRA / "kubeflow" / part / "kustomization.yaml"
        kustomization = yaml.safe_load(path.read_text())
        (resource,) = kustomization["resources"]
        assert re.search(r"\?ref=\d+\.\d+\.\d+$", resource), f"{part}: not pinned"


def test_the_gpu_pool_is_the_one_the_gpu_values_select() -> None:
    check = _find("Job", "gpu-check")["spec"]["template"]["spec"]
    gpu_values = yaml.safe_load((CHART / "ci" / "gpu-cluster.yaml").read_text())["triton"]
    assert check["nodeSelector"] == gpu_values["nodeSelector"]
    assert check["tolerations"] == gpu_values["tolerations"]
    readme = (INFRA / "README.md").read_text()
    (label,) = check["nodeSelector"].items()
    assert f"{label[0]}={label[1]}" in readme
    assert "nvidia.com/gpu=present:NoSchedule" in readme
