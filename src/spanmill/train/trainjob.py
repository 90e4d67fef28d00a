"""Training on several nodes: the same run, handed to the Kubeflow Trainer as a TrainJob.

Where one node's GPUs are not enough, the pipeline's training step (run parameter
``trainer=trainjob``) does not train in its own pod; :func:`train_on_trainer`
hands the run to the Kubeflow Trainer (v2, ``trainer.kubeflow.org/v1alpha1``) and
waits for it:

1. The dataset goes to the object store, under ``SPANMILL_TRAINJOB_STAGING_URL``
   ``/<job>/dataset``: the TrainJob's pods cannot see the step's files.
2. :func:`render_trainjob` writes the TrainJob: the training runtime the chart
   installs (``trainer.enabled``: a TrainingRuntime with the torch policy),
   ``numNodes``, the GPUs of each node (``resourcesPerNode``, one process each
   through ``numProcPerNode``), the training image, the command
   ``python -m spanmill.train.trainjob DATASET_URL OUTPUT_URL``, and the
   environment: the run's settings as ``SPANMILL_TRAIN_*`` values, everything else
   by reference to the same ConfigMap and Secrets the step's own pod reads, so no
   credential is ever copied into the TrainJob.
3. The step creates it through the Kubernetes API as its pod's service account
   (the chart's Role lets it create, get and delete TrainJobs, nothing more) and
   reads its status conditions every ``poll_s``: ``Complete`` ends the wait,
   ``Failed`` raises with the Trainer's reason. A TrainJob of the same name that
   already exists, from an earlier try of the same step, is waited on again, or
   replaced when it had failed. The name comes from the pipeline run's id and the
   step's task name (the output folder outside a pipeline): a retry of the run may
   give the step another folder.
4. On each node :func:`run_node` copies the dataset down, prepares the base model
   once, and runs the training worker under torchrun, which takes the node count,
   node rank, processes per node and rendezvous address from the ``PET_*``
   environment the Trainer's torch policy sets. Only node 0 holds global rank 0,
   the only process that writes; it copies the adapter folder back to ``/<job>/output``.
5. The step copies the adapter into its own output folder, deletes the TrainJob
   and the staging folder, and returns rank 0's result, as training in the pod does.

A failed TrainJob and its staging folder are left for inspection. The TrainJob may
run ``deadline_s`` (its ``activeDeadlineSeconds``); the step waits at most ``wait_s``,
queueing included. These come from :class:`~spanmill.train.settings.TrainJobSettings`
(``SPANMILL_TRAINJOB_*``), which on a cluster the chart's ConfigMap
``spanmill-trainjob`` sets (:data:`spanmill.pipeline.cluster.TRAINJOB_SETTINGS`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from spanmill.kube import kube_api_client, request_timeout
from spanmill.train.errors import TrainError
from spanmill.train.launch import (
    child_env,
    prepare_base_model,
    read_result,
    run_processes,
    settings_env,
    torchrun_command,
)
from spanmill.train.mirror import mirror_url, restore
from spanmill.train.remote import get_files, open_url, put_file, remove, run_digest
from spanmill.train.settings import TrainJobSettings, TrainSettings
from spanmill.train.trainer import CHECKPOINTS_DIRNAME, TrainResult

logger = logging.getLogger(__name__)

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
PLURAL = "trainjobs"
KIND = "TrainJob"
# What each TrainJob node runs, with the dataset and output URLs as its arguments.
NODE_COMMAND = ("python", "-m", "spanmill.train.trainjob")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def job_name(output_dir: Path, key: str = "") -> str:
    """The TrainJob's name: the same for every try of one step, short enough for its pods.

    ``key`` names the step across its tries (a pipeline's run id and task name): a retry
    of a Kubeflow run may hand the step another output folder, and a name taken from
    the folder started a second TrainJob beside the first. Without a key, the folder.
    """
    return f"spanmill-train-{run_digest(output_dir, key)[:10]}"


def trainjob_env(
    settings: TrainSettings,
    config_maps: Mapping[str, Sequence[str]],
    secrets: Mapping[str, Mapping[str, str]],
) -> list[dict[str, Any]]:
    """The training container's environment: the run's settings, then references.

    A key the run sets by value is not also taken from a ConfigMap; Secrets are
    optional, as in the step's pod (a cluster may reach S3 by workload identity).
    """
    values = settings_env(settings)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(values.items())]
    named = set(values)
    for config_map, keys in config_maps.items():
        for key in keys:
            if key not in named:
                named.add(key)
                ref = {"configMapKeyRef": {"name": config_map, "key": key}}
                env.append({"name": key, "valueFrom": ref})
    for secret, key_to_env in secrets.items():
        for key, variable in key_to_env.items():
            if variable not in named:
                named.add(variable)
                secret_ref: dict[str, dict[str, Any]] = {
                    "secretKeyRef": {"name": secret, "key": key, "optional": True}
                }
                env.append({"name": variable, "valueFrom": secret_ref})
    return env


def render_trainjob(
    *,
    name: str,
    namespace: str,
    dataset_url: str,
    output_url: str,
    nodes: int,
    gpus_per_node: int,
    gpu_resource: str,
    settings: TrainSettings,
    job: TrainJobSettings,
    config_maps: Mapping[str, Sequence[str]],
    secrets: Mapping[str, Mapping[str, str]],
) -> dict[str, Any]:
    """The TrainJob for this run (pure; :func:`train_on_trainer` submits it)."""
    if nodes < 1:
        raise TrainError(f"a TrainJob needs at least one node, not {nodes}")
    if gpus_per_node < 0:
        raise TrainError(f"GPUs per node must be 0 (CPU nodes) or more, not {gpus_per_node}")
    limits: dict[str, Any] = {"cpu": job.cpu_per_node, "memory": job.memory_per_node}
    if gpus_per_node:
        limits[gpu_resource] = gpus_per_node
    trainer: dict[str, Any] = {
        "command": list(NODE_COMMAND),
        "args": [dataset_url, output_url],
        "env": trainjob_env(settings, config_maps, secrets),
        "numNodes": nodes,
        # One process per GPU; on CPU nodes one, not one per core as the Trainer would.
        "numProcPerNode": max(gpus_per_node, 1),
        "resourcesPerNode": {"limits": limits},
    }
    if job.image:
        trainer["image"] = job.image
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/part-of": "spanmill",
                "app.kubernetes.io/component": "train",
            },
        },
        "spec": {
            "runtimeRef": {"apiGroup": GROUP, "kind": job.runtime_kind, "name": job.runtime},
            "activeDeadlineSeconds": job.deadline_s,
            "trainer": trainer,
        },
    }


def job_state(trainjob: Mapping[str, Any]) -> tuple[str, str]:
    """("Complete" | "Failed" | "Suspended" | "Running", the Trainer's reason and message)."""
    conditions = (trainjob.get("status") or {}).get("conditions") or []
    true = {c.get("type"): c for c in conditions if str(c.get("status")) == "True"}
    for state in ("Failed", "Complete", "Suspended"):
        if state in true:
            condition = true[state]
            return state, f"{condition.get('reason', '')}: {condition.get('message', '')}"
    return "Running", ""


def run_trainjob(
    api_client: Any,
    manifest: Mapping[str, Any],
    *,
    poll_s: float,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Create the TrainJob (or take up the one an earlier try created) and wait for its end."""
    from kubernetes import client
    from urllib3.exceptions import HTTPError

    api = client.CustomObjectsApi(api_client)
    namespace = manifest["metadata"]["namespace"]
    name = manifest["metadata"]["name"]
    where = f"TrainJob {namespace}/{name}"
    _create(api, manifest, where, poll_s=poll_s, sleep=sleep)
    started = time.monotonic()
    reported = ""
    while True:
        try:
            current = api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=request_timeout()
            )
        except client.ApiException as exc:
            if exc.status == 404:
                raise TrainError(f"{where} was deleted while the step waited for it") from None
            if exc.status != 429 and exc.status < 500:
                raise TrainError(f"cannot read {where}: {exc.status} {exc.reason}") from None
            # The API server busy or failing over: the training goes on without it.
            logger.warning("reading %s: %s %s; trying again", where, exc.status, exc.reason)
        except (HTTPError, OSError) as exc:
            # Out of reach for a moment (a timeout, a refused connection): the same.
            logger.warning("reading %s failed (%s); trying again", where, exc)
        else:
            state, detail = job_state(current)
            if state == "Complete":
                logger.info("%s completed", where)
                return
            if state == "Failed":
                raise TrainError(
                    f"{where} failed ({detail}); its pods' logs: kubectl logs -n {namespace} "
                    f"-l jobset.sigs.k8s.io/jobset-name={name} --prefix"
                )
            if state != reported:
                logger.info("%s: %s %s", where, state.lower(), detail)
                reported = state
        if time.monotonic() - started > timeout_s:
            raise TrainError(
                f"{where} has not finished within {timeout_s:.0f} s (SPANMILL_TRAINJOB_WAIT_S); "
                "is the Kubeflow Trainer controller running? The TrainJob is left in place"
            )
        sleep(poll_s)


def _create(
    api: Any,
    manifest: Mapping[str, Any],
    where: str,
    *,
    poll_s: float,
    sleep: Callable[[float], None],
) -> None:
    from kubernetes import client

    namespace = manifest["metadata"]["namespace"]
    name = manifest["metadata"]["name"]
    try:
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, dict(manifest), _request_timeout=request_timeout()
        )
        logger.info("created %s", where)
        return
    except client.ApiException as exc:
        if exc.status == 404:
            raise TrainError(
                f"the cluster does not serve {PLURAL}.{GROUP}/{VERSION}: install the Kubeflow "
                "Trainer v2 (infra/README.md) and the chart with trainer.enabled, or train with "
                "trainer=pod"
            ) from None
        if exc.status == 403:
            raise TrainError(
                f"this pod's service account may not create {where}: install the chart with "
                "trainer.enabled and pipelineSettings.serviceAccount naming the account the "
                "pipeline's steps run as"
            ) from None
        if exc.status != 409:
            raise TrainError(f"cannot create {where}: {exc.status} {exc.reason}") from None
    try:
        existing = api.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, _request_timeout=request_timeout()
        )
        if job_state(existing)[0] != "Failed":
            logger.info("%s exists from an earlier try of this step: waiting for it", where)
            return
        logger.info("%s failed on an earlier try of this step: starting it again", where)
        api.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, _request_timeout=request_timeout()
        )
        while True:  # the old one's pods go first
            try:
                api.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name, _request_timeout=request_timeout()
                )
            except client.ApiException as exc:
                if exc.status == 404:
                    break
                raise
            sleep(poll_s)
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, dict(manifest), _request_timeout=request_timeout()
        )
    except client.ApiException as exc:
        raise TrainError(f"replacing {where} failed: {exc.status} {exc.reason}") from None


def delete_trainjob(api_client: Any, namespace: str, name: str) -> None:
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    try:
        api.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background",
            _request_timeout=request_timeout(),
        )  # fmt: skip
    except client.ApiException as exc:
        if exc.status != 404:
            logger.warning("could not delete TrainJob %s/%s: %s", namespace, name, exc.reason)


def train_on_trainer(
    dataset_dir: Path,
    output_dir: Path,
    settings: TrainSettings,
    *,
    nodes: int,
    gpus_per_node: int,
    gpu_resource: str = "nvidia.com/gpu",
    job: TrainJobSettings,
    config_maps: Mapping[str, Sequence[str]],
    secrets: Mapping[str, Mapping[str, str]],
    api_client: Any = None,
    key: str = "",
) -> TrainResult:
    """Train on ``nodes`` nodes of ``gpus_per_node`` GPUs through a TrainJob; see the module
    doc. ``key``: what names the step across its tries (:func:`job_name`)."""
    if not job.staging_url:
        raise TrainError(
            "trainer=trainjob needs SPANMILL_TRAINJOB_STAGING_URL, the object store folder "
            "that carries the dataset to the TrainJob and the adapter back (the chart's "
            "trainer.enabled sets it)"
        )
    _check_base_model_is_shared(settings.base_model)
    name = job_name(output_dir, key)
    namespace = job.namespace or _own_namespace()
    staging = f"{job.staging_url.rstrip('/')}/{name}"
    manifest = render_trainjob(
        name=name,
        namespace=namespace,
        dataset_url=f"{staging}/dataset",
        output_url=f"{staging}/output",
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu_resource=gpu_resource,
        settings=settings,
        job=job,
        config_maps=config_maps,
        secrets=secrets,
    )
    api_client = api_client if api_client is not None else kube_api_client()
    copy_to(Path(dataset_dir), f"{staging}/dataset")
    run_trainjob(api_client, manifest, poll_s=job.poll_s, timeout_s=job.wait_s)
    copy_from(f"{staging}/output", Path(output_dir))
    result = read_result(Path(output_dir))
    delete_trainjob(api_client, namespace, name)
    remove(staging)
    return result


def run_node(
    dataset_url: str,
    output_url: str,
    settings: TrainSettings,
    environ: Mapping[str, str] | None = None,
) -> None:
    """One TrainJob node: the dataset in, torchrun over the worker, node 0's adapter out."""
    environ = dict(os.environ if environ is None else environ)
    node_rank = int(environ.get("PET_NODE_RANK", "0"))
    with tempfile.TemporaryDirectory(prefix="spanmill-train-") as scratch:
        dataset_dir = Path(scratch) / "dataset"
        output_dir = Path(scratch) / "output"
        copy_from(dataset_url, dataset_dir)
        mirror = mirror_url(settings, output_dir)
        if mirror is not None:  # a node started again resumes from the checkpoints' copy
            restore(mirror, output_dir / CHECKPOINTS_DIRNAME)
        prepare_base_model(settings)
        command = torchrun_command(dataset_dir, output_dir, None)
        logger.info("node %d: %s", node_rank, " ".join(command))
        run_processes(command, child_env(settings, None, environ))
        if node_rank == 0:
            copy_to(output_dir, output_url)


def copy_to(local: Path, url: str) -> None:
    """Copy a folder's files (checkpoints left out) to ``url``, any fsspec URL."""
    fs, root = open_url(url)
    files = [
        p
        for p in sorted(local.rglob("*"))
        if p.is_file() and CHECKPOINTS_DIRNAME not in p.relative_to(local).parts
    ]
    if not files:
        raise TrainError(f"{local} holds no files to copy to {url}")
    try:
        for path in files:
            put_file(fs, path, f"{root}/{path.relative_to(local).as_posix()}")
    except OSError as exc:
        raise TrainError(f"cannot copy {local} to {url}: {exc}") from None


def copy_from(url: str, local: Path) -> None:
    """Copy every file under ``url`` into the folder ``local``."""
    fs, root = open_url(url)
    try:
        found = [str(p) for p in fs.find(root)]
    except OSError as exc:
        raise TrainError(f"cannot list {url}: {exc}") from None
    if not found:
        raise TrainError(f"{url} holds no files; the TrainJob wrote no output there")
    get_files(fs, root, [PurePosixPath(p).relative_to(PurePosixPath(root)) for p in found], local)


def _check_base_model_is_shared(ref: str) -> None:
    if "://" not in ref and Path(ref).expanduser().is_absolute():
        raise TrainError(
            f"base model {ref} is a folder of this pod, which a TrainJob's pods cannot see; "
            "name it by Hugging Face id, catalog name or object store folder (s3://...)"
        )


def _own_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        raise TrainError(
            "not running in a Kubernetes pod, so the TrainJob's namespace is unknown; set "
            "SPANMILL_TRAINJOB_NAMESPACE"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spanmill.train.trainjob")
    parser.add_argument("dataset", help="Dataset folder URL (the step's staging copy).")
    parser.add_argument("output", help="URL node 0 copies the adapter folder to.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from spanmill.config import load_settings
    from spanmill.errors import SpanmillError

    try:
        run_node(args.dataset, args.output, load_settings(TrainSettings))
    except SpanmillError as exc:
        print(f"node {os.environ.get('PET_NODE_RANK', '0')}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
