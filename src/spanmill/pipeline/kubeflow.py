"""Talking to a Kubeflow Pipelines endpoint: upload a new version, schedule runs.

Each upload adds a pipeline version (named from the package's content hash and
the time) under one pipeline, so the Kubeflow UI keeps the history and a person
picks which version a run uses.

Kubeflow Pipelines in multi-user mode wants every request signed: a fixed bearer
token (SPANMILL_KFP_TOKEN), or, inside the cluster, a projected service-account
token with the audience ``pipelines.kubeflow.org`` that the kubelet keeps fresh in a
file; that file is read again for every request, so a rotated token is used at once.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spanmill.errors import SpanmillError

TOKEN_ENV = "SPANMILL_KFP_TOKEN"
# Where Kubeflow mounts a pod's projected service-account token for its Pipelines API
# (and where the chart's upload Job mounts it), and the audience it must carry.
SA_TOKEN_PATH = Path("/var/run/secrets/kubeflow/pipelines/token")
SA_TOKEN_AUDIENCE = "pipelines.kubeflow.org"


class KubeflowError(SpanmillError):
    """The Kubeflow Pipelines endpoint refused or could not be reached."""


@dataclass(frozen=True)
class Uploaded:
    pipeline_id: str
    version_id: str
    version_name: str
    new_pipeline: bool


def client(endpoint: str, token: str | None = None, token_file: Path | None = None) -> Any:
    """A kfp.Client for ``endpoint``, sending ``Authorization: Bearer`` with ``token``
    (default SPANMILL_KFP_TOKEN) or with the token in ``token_file``, read again for
    every request; with neither, no credentials."""
    import kfp
    from kfp.client import ServiceAccountTokenVolumeCredentials

    fixed = token or os.environ.get(TOKEN_ENV) or None
    credentials = None
    if token_file is not None:
        if fixed:
            raise KubeflowError(
                f"both a token ({TOKEN_ENV}) and a token file ({token_file}) were given; "
                "use one of them"
            )
        read_token(token_file)  # fail now, naming the file, rather than at the first call
        credentials = ServiceAccountTokenVolumeCredentials(path=str(token_file))
    try:
        return kfp.Client(host=endpoint, existing_token=fixed, credentials=credentials)
    except Exception as exc:
        raise KubeflowError(f"cannot reach Kubeflow Pipelines at {endpoint}: {exc}") from None


def read_token(path: Path) -> str:
    """The token in ``path``; a clear error when it is missing or empty."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise KubeflowError(
            f"cannot read the service-account token {path} ({exc.strerror}): mount a projected "
            f"serviceAccountToken with audience {SA_TOKEN_AUDIENCE} there "
            "(the chart does with pipelineUpload.multiUser)"
        ) from None
    if not token:
        raise KubeflowError(f"the service-account token file {path} is empty")
    return token


def _version_name(package: Path, name: str) -> str:
    digest = hashlib.sha256(package.read_bytes()).hexdigest()[:10]
    return f"{name}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{digest}"


def for_cluster(
    package: str,
    *,
    image: str | None = None,
    train_image: str | None = None,
    model_claim: str | None = None,
    model_path: str = "/models",
) -> str:
    """The compiled pipeline ``package`` (KFP's YAML) made for one cluster; None keeps what
    was compiled. A package is compiled once, in the image, for the images of whoever
    built it; a cluster pulls from its own registry and keeps its own volumes.

    ``image`` and ``train_image``: the steps' images, the training steps' (an image whose
    repository ends in ``/train``, as services/train/Dockerfile is tagged) and every
    other's. ``model_claim``: the PersistentVolumeClaim of a model repository on a
    volume, mounted at ``model_path`` in the evaluation steps, which stage their
    candidates in the repository Triton reads.
    """
    import yaml

    if image is None and train_image is None and model_claim is None:
        return package
    documents = list(yaml.safe_load_all(package))
    spec = next((d for d in documents if "deploymentSpec" in d), None)
    if spec is None or not spec["deploymentSpec"].get("executors"):
        raise KubeflowError("the package holds no pipeline steps (deploymentSpec.executors)")
    executors = spec["deploymentSpec"]["executors"]
    for executor in executors.values():
        container = executor.get("container")
        if container is None:
            continue
        compiled = container["image"].split("@", 1)[0].rsplit(":", 1)[0]
        wanted = train_image if compiled.rsplit("/", 1)[-1] == "train" else image
        if wanted is not None:
            container["image"] = wanted
    if model_claim is not None:
        platform = next((d for d in documents if "platforms" in d), None)
        if platform is None:
            platform = {"platforms": {"kubernetes": {"deploymentSpec": {"executors": {}}}}}
            documents.append(platform)
        platforms = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        mount = {"constant": model_claim, "mountPath": model_path,
                 "pvcNameParameter": {"runtimeValue": {"constant": model_claim}}}  # fmt: skip
        for name in executors:
            if name.startswith("exec-evaluate"):
                platforms.setdefault(name, {}).setdefault("pvcMount", []).append(mount)
    return yaml.safe_dump_all(documents, sort_keys=False)


def upload(
    endpoint: str,
    package: Path,
    name: str = "flywheel",
    token: str | None = None,
    token_file: Path | None = None,
    **cluster: Any,
) -> Uploaded:
    """Upload ``package`` as a new version of pipeline ``name`` (created on first upload),
    made for the cluster as ``cluster`` asks (:func:`for_cluster`: images, a volume)."""
    if not package.is_file():
        raise KubeflowError(f"no compiled pipeline at {package}; run `spanmill pipeline compile`")
    compiled = package.read_text(encoding="utf-8")
    rewritten = for_cluster(compiled, **cluster)
    if rewritten is not compiled:  # made for this cluster: that is what goes up
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / package.name
            copy.write_text(rewritten, encoding="utf-8")
            return upload(endpoint, copy, name, token, token_file)
    kfp_client = client(endpoint, token, token_file)
    version_name = _version_name(package, name)
    try:
        pipeline_id = kfp_client.get_pipeline_id(name)
        if pipeline_id is None:
            pipeline = kfp_client.upload_pipeline(str(package), pipeline_name=name)
            pipeline_id = pipeline.pipeline_id
            new = True
        else:
            new = False
        version = kfp_client.upload_pipeline_version(
            str(package), pipeline_version_name=version_name, pipeline_id=pipeline_id
        )
    except KubeflowError:
        raise
    except Exception as exc:
        raise KubeflowError(f"uploading {package} to {endpoint} failed: {exc}") from None
    return Uploaded(pipeline_id, version.pipeline_version_id, version_name, new)


def schedule(
    endpoint: str,
    *,
    pipeline_id: str,
    version_id: str | None,
    cron: str,
    job_name: str = "flywheel-nightly",
    experiment: str = "spanmill",
    params: dict[str, Any] | None = None,
    token: str | None = None,
    token_file: Path | None = None,
) -> str:
    """Create a recurring run (6-field cron, e.g. '0 0 2 * * *') and return its id.

    Without ``version_id``, of the pipeline's latest version (KFP wants both ids). A
    recurring run of the same name in the experiment is replaced: scheduling again after
    an upload moves the nightly run onto the new version, where two would overlap.
    """
    if len(cron.split()) != 6:
        raise KubeflowError(
            f"cron {cron!r} must have 6 fields (seconds first), e.g. '0 0 2 * * *' for 02:00"
        )
    kfp_client = client(endpoint, token, token_file)
    try:
        experiment_id = kfp_client.create_experiment(experiment).experiment_id
        if version_id is None:
            version_id = _latest_version(kfp_client, pipeline_id)
        named = json.dumps({"predicates": [
            {"operation": "EQUALS", "key": "display_name", "stringValue": job_name}]})  # fmt: skip
        listed = kfp_client.list_recurring_runs(
            experiment_id=experiment_id, filter=named, page_size=100
        )
        for previous in listed.recurring_runs or []:
            kfp_client.delete_recurring_run(previous.recurring_run_id)
        run = kfp_client.create_recurring_run(
            experiment_id=experiment_id,
            job_name=job_name,
            cron_expression=cron,
            pipeline_id=pipeline_id,
            version_id=version_id,
            params=params or {},
            max_concurrency=1,
            no_catchup=True,
        )
    except Exception as exc:
        raise KubeflowError(f"scheduling on {endpoint} failed: {exc}") from None
    return str(run.recurring_run_id)


def _latest_version(kfp_client: Any, pipeline_id: str) -> str:
    listed = kfp_client.list_pipeline_versions(pipeline_id, page_size=1, sort_by="created_at desc")
    versions = listed.pipeline_versions or []
    if not versions:
        raise KubeflowError(f"pipeline {pipeline_id} has no version to schedule: upload one")
    return str(versions[0].pipeline_version_id)
