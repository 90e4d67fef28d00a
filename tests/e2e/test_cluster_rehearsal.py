"""The cluster path, rehearsed on one machine: the chart as installed, the pipeline as uploaded.

The chart is rendered with a value set whose hosts point at this machine's services:
tansu for Kafka, MLflow, tritonserver (outside the release, its model repository a
folder standing in for the shared volume), moto's S3 server as the object store that
holds the span store and the base model, kmock as the Kubernetes API. The collector,
gateway and rollout controller start from exactly the command and environment
rendered for their Deployments (Secrets resolved, the pod's /tmp a folder of its own,
the service account's token a kubeconfig). The committed ``pipelines/flywheel.yaml``
(the file that is uploaded) runs through kfp's local runner with the rendered
ConfigMap and Secrets as the only connection settings, resolved the way the
compiled platform spec asks (``spanmill.pipeline.cluster.step_environment``); its
parameters are the agent and this machine's compute sizing (steps, batch, evaluation
size, threads), none of them a connection.

The loop turns: calculator episodes reach the store through the collector's OTLP
receiver; the pipeline builds the dataset, trains, evaluates against the champion
Triton serves (the base model, registered from the object store), registers and
stages the challenger; the controller runs its canary on the gateway's traffic, read
back from the span store, and promotes it. Training, evaluation and lineage are
checked in MLflow.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
import yaml
from helm_render import Rendered, helm_binary, parse, template
from mlflow import MlflowClient

from spanmill import semconv as sc
from spanmill.gateway.llm_span import build_llm_span, new_span_id
from spanmill.keys import key_line, new_key
from spanmill.pipeline import cluster
from spanmill.pipeline.build import DEFAULT_PACKAGE, run_local
from spanmill.registry import CHALLENGER, CHAMPION, Lineage, ModelRegistry
from spanmill.registry import names as tags
from spanmill.spans import Span, SpanEvent, encode_otlp_protobuf
from spanmill.stack.ports import free_port
from spanmill.store import SpanStore
from spanmill.tasks import get_task

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(2400)]

AGENT = "calculator"
NAMESPACE = "spanmill"
BUCKET = "spanmill"
BASE_MODEL = f"s3://{BUCKET}/base-models/smollm2-135m"
STEPS = 40
# Test credentials of the local S3 endpoint and MLflow user: what the Secrets hold.
SECRETS = {
    "spanmill-s3": {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal"},
    "spanmill-mlflow": {"username": "pipeline", "password": "rehearsal"},
    "spanmill-mlflow-controller": {"username": "controller", "password": "rehearsal"},
}
# The agents' producer key: the receiver keeps its digest in a Secret, the agents the key.
PRODUCER_KEY = new_key()
SECRETS["spanmill-producer-keys"] = {"keys": key_line("calculator-agent", PRODUCER_KEY)}


# -- the world ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's S3 server: the object store's endpoint, with the release's bucket."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="rehearsal",
            aws_secret_access_key="rehearsal",
        ).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def values(s3: str, kafka: Any, mlflow: Any, triton: Any, ports: dict[str, int]) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:6]
    return {
        "kafka": {
            "bootstrapServers": kafka.bootstrap_servers,
            "topics": {"spans": f"rehearsal-{suffix}", "deadLetter": f"rehearsal-{suffix}.dlq"},
        },
        "objectStore": {"endpoint": s3, "region": "us-east-1", "bucket": BUCKET},
        "mlflow": {"trackingUri": mlflow.tracking_uri, "server": {"enabled": False}},
        "triton": {
            "enabled": False,
            "external": {"httpUrl": triton.http_url, "grpcUrl": triton.grpc_url},
            "modelRepository": {
                "type": "pvc",
                "pvc": {"existingClaim": "models", "mountPath": str(triton.model_repository)},
            },
        },
        "collector": {
            "autoscaling": {"enabled": False},
            "replicas": 1,
            "groupId": f"rehearsal-{suffix}",
            "batchMaxSeconds": 1,
            "port": ports["collector"],
            "receiverKeys": {"existingSecret": "spanmill-producer-keys"},
        },
        "gateway": {"autoscaling": {"enabled": False}, "replicas": 1, "port": ports["gateway"]},
        "rollout": {
            "intervalSeconds": 1,
            "agents": [AGENT],
            "dtype": "float32",
            "port": ports["rollout"],
            "policy": {
                "steps": [50, 100],
                "bakeSeconds": 1,
                "minRequests": 3,
                "maxErrorRate": 0.2,
                "graceSeconds": 1,
            },
        },
        "pipelineSettings": {"baseModel": BASE_MODEL},
    }


def render(tmp_path: Path, chosen: dict[str, Any]) -> Rendered:
    path = tmp_path / "rehearsal-values.yaml"
    path.write_text(yaml.safe_dump(chosen))
    result = template(helm_binary(), [path])
    assert result.returncode == 0, result.output
    return parse("rehearsal", result.stdout)


def pod_env(
    container: dict[str, Any], volumes: list[dict[str, Any]], pod: str, scratch: Path
) -> dict[str, str]:
    """The environment the kubelet gives ``container``: values, Secret keys, the downward API.

    The pod's /tmp is an emptyDir of its own: here, ``scratch``; paths on the container's
    other volumes (the model repository's) stay as they are.
    """
    mounts = sorted(container.get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))
    # A Secret volume is a folder of its keys' files: here, under the pod's scratch.
    secret_of = {v["name"]: v["secret"]["secretName"] for v in volumes if "secret" in v}
    for mount in mounts:
        if mount["name"] in secret_of:
            folder = scratch / "secrets" / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            for key, value in SECRETS[secret_of[mount["name"]]].items():
                (folder / key).write_text(value)

    def volume_of(path: str) -> str | None:
        for mount in mounts:
            if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
                return str(mount["name"])
        return None

    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            value = str(entry["value"])
        elif "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            if ref["name"] not in SECRETS and ref.get("optional"):
                continue
            value = SECRETS[ref["name"]][ref["key"]]
        elif "resourceFieldRef" in entry["valueFrom"]:
            value = str(_resource_field(container, entry["valueFrom"]["resourceFieldRef"]))
        else:
            field = entry["valueFrom"]["fieldRef"]["fieldPath"]
            value = {"metadata.name": pod, "metadata.namespace": NAMESPACE}[field]
        volume = volume_of(value)
        if volume == "tmp":
            value = str(scratch) + value[len("/tmp") :]
        elif volume in secret_of:
            mount = next(m["mountPath"] for m in mounts if m["name"] == volume)
            value = str(scratch / "secrets" / volume) + value[len(mount) :]
        env[entry["name"]] = value
    return env


def _millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else round(float(quantity) * 1000)


def _resource_field(container: dict[str, Any], ref: dict[str, Any]) -> int:
    """A CPU request or limit as the kubelet gives it: in divisors, rounded up."""
    kind, name = ref["resource"].split(".")
    assert name == "cpu", f"only CPU is given by resourceFieldRef here, not {name}"
    quantity = container["resources"][kind]["cpu"]
    divisor = _millicores(str(ref.get("divisor", "1")))
    return -(-_millicores(str(quantity)) // divisor)


class Pod:
    """One Deployment's container as a process: its rendered command, args and environment."""

    def __init__(self, rendered: Rendered, deployment: str, tmp_path: Path, kubeconfig: Path,
                 index: int = 0) -> None:  # fmt: skip
        self.name = f"{deployment}-{index}"
        container = rendered.container(deployment)
        volumes = rendered.get("Deployment", deployment)["spec"]["template"]["spec"]["volumes"]
        scratch = tmp_path / self.name
        scratch.mkdir()
        env = pod_env(container, volumes, self.name, scratch)
        # The service account's token stands in as a kubeconfig for kmock.
        env |= {
            "KUBECONFIG": str(kubeconfig),
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        }
        self.port = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
        if index:
            # Each pod has an address of its own on a cluster; here they share one host.
            port, self.port = self.port, free_port()
            env = {k: str(self.port) if v == str(port) else v for k, v in env.items()}
        if deployment == "spanmill-rollout":
            # A pass stuck in one call logs where it is within the waits below (a stall
            # must outlast a version's load, which a retirement may wait for).
            env["SPANMILL_ROLLOUT_LOAD_TIMEOUT_S"] = "240"
            env["SPANMILL_ROLLOUT_STALL_AFTER_S"] = "270"
        self.log = (tmp_path / f"{self.name}.log").open("wb")
        self.process = subprocess.Popen(
            [*container["command"], *container["args"]],
            env=env, cwd=scratch, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_ready(self, path: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"{self.name} exited: {self.tail()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise AssertionError(f"{self.name} not ready: {self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def dump_stacks(self) -> None:
        """Every thread's stack into the log (spanmill.logs.stacks_on_sigusr1)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(0.5)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def apply(kube: Any, rendered: Rendered) -> None:
    """What `helm install` creates that the services read through the API (kmock)."""
    from kubernetes import utils

    client = kube.api_client()
    for document in rendered.documents:
        if document["kind"] in ("ConfigMap", "Lease"):
            document = {**document, "metadata": {**document["metadata"]}}
            document["metadata"].setdefault("namespace", NAMESPACE)
            utils.create_from_dict(client, document, namespace=document["metadata"]["namespace"])


def eventually(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    *pods: Pod,
    context: Callable[[], str] | None = None,
) -> None:
    """Wait for ``check``; on timeout, fail with the pods' logs and ``context()``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            for pod in pods:
                pod.dump_stacks()
            logs = "\n".join(f"--- {p.name}\n{p.tail(8000)}" for p in pods)
            more = f"\n--- {context()}" if context is not None else ""
            raise AssertionError(f"{what} did not happen in {timeout:.0f}s\n{logs}{more}")
        time.sleep(0.5)


# -- production ----------------------------------------------------------------------


def recorded_episodes(n: int) -> list[list[Span]]:
    """Calculator episodes as the gateway and the SDK record them: the few-shot production
    prompt, the reference solution as the model's answers, a primary success reward."""
    task = get_task(AGENT)
    traces: list[list[Span]] = []
    t0 = time.time_ns() - 3600 * 10**9
    for i, instance in enumerate(task.instances("train", n, seed=3)):
        spans: list[Span] = []
        trace_id = uuid.uuid4().hex
        root = new_span_id()
        start = t0 + i * 10**9
        opening = task.messages(instance, "few_shot")[:-1]
        transcript = task.reference_transcript(instance)
        for turn, message in enumerate(transcript):
            if message["role"] != "assistant":
                continue
            spans.append(build_llm_span(
                trace_id=trace_id, parent_span_id=root, span_id=new_span_id(),
                start_ns=start + turn * 1000, end_ns=start + turn * 1000 + 500,
                requested_model=AGENT, triton_model=AGENT, version="1",
                response_id=f"r-{i}-{turn}", request_messages=[*opening, *transcript[:turn]],
                params={"temperature": 0.0}, metadata={sc.SPANMILL_TASK_ID: instance.id},
                choice={"message": message, "finish_reason": "stop", "token_ids": [1, 2],
                        "logprobs": [-0.1, -0.2]},
            ))  # fmt: skip
        reward = SpanEvent(name=sc.GEN_AI_EVALUATION_RESULT_EVENT, time_unix_nano=start + 9000,
                           attributes={sc.GEN_AI_EVALUATION_NAME: "success",
                                       sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
                                       sc.SPANMILL_REWARD_PRIMARY: True})  # fmt: skip
        spans.append(Span(
            trace_id=trace_id, span_id=root, name=f"invoke_agent {AGENT}",
            start_time_unix_nano=start, end_time_unix_nano=start + 10_000,
            attributes={sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
                        sc.GEN_AI_AGENT_NAME: AGENT, sc.SPANMILL_TASK_ID: instance.id},
            events=(reward,),
        ))  # fmt: skip
        traces.append(spans)
    return traces


class Traffic:
    """The agent's clients calling the gateway until stopped; the versions that answered."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.versions: list[str | None] = []
        self.statuses: list[int] = []
        self.unsent: list[str] = []  # requests that got no answer at all, and why
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        body = {"model": AGENT, "max_tokens": 2,
                "messages": [{"role": "user", "content": "What is 2 + 3?"}]}  # fmt: skip
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                try:
                    response = client.post("/v1/chat/completions", json=body)
                except httpx.HTTPError as exc:
                    self.unsent.append(f"{type(exc).__name__}: {exc}")
                else:
                    self.statuses.append(response.status_code)
                    self.versions.append(response.headers.get("x-spanmill-model-version"))
                self._stop.wait(0.05)

    def describe(self) -> str:
        """What the clients saw, for a failure's message."""
        from collections import Counter

        return (
            f"traffic: statuses {dict(Counter(self.statuses))}, versions "
            f"{dict(Counter(self.versions))}, the last five {self.versions[-5:]}; "
            f"{len(self.unsent)} unanswered{f', last {self.unsent[-1]}' if self.unsent else ''}"
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def counted(pod: Pod, prefixes: tuple[str, ...]) -> str:
    """A pod's Prometheus samples whose names start with one of ``prefixes``."""
    try:
        text = httpx.get(f"http://127.0.0.1:{pod.port}/metrics", timeout=5).text
    except httpx.HTTPError as exc:
        return f"{pod.name}: no metrics ({exc})"
    samples = [line for line in text.splitlines() if line.startswith(prefixes)]
    return f"{pod.name}: {'; '.join(samples)}"


def only(root: Path, pattern: str) -> Path:
    found = sorted(root.rglob(pattern))
    assert len(found) == 1, f"{pattern}: {found}"
    return found[0]


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    found: set[str] = set()
    for entry in client.list_artifacts(run_id, path):
        if entry.is_dir:
            found |= artifact_paths(client, run_id, entry.path)
        else:
            found.add(entry.path)
    return found


# -- the rehearsal -------------------------------------------------------------------


def test_the_loop_turns_on_the_cluster_path(  # type: ignore[no-untyped-def]
    tmp_path: Path, s3: str, kafka, mlflow_server, triton, kube, smollm2_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import fsspec
    import tritonclient.http as triton_http
    from kubernetes import client as k8s

    storage = {"endpoint_url": s3, "key": "rehearsal", "secret": "rehearsal",
               "client_kwargs": {"region_name": "us-east-1"}}  # fmt: skip
    # An operator puts the base model on the object store, where every pod reaches it.
    fs = fsspec.filesystem("s3", **storage)
    fs.put(f"{smollm2_dir}/", BASE_MODEL.removeprefix("s3://") + "/", recursive=True)

    ports = {name: free_port() for name in ("collector", "gateway", "rollout")}
    rendered = render(tmp_path, values(s3, kafka, mlflow_server, triton, ports))
    apply(kube, rendered)
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig", NAMESPACE)

    # The champion: the base model, registered from the object store and promoted.
    registry = ModelRegistry(mlflow_server.tracking_uri)
    v1 = registry.register(AGENT, Lineage(kind="base", base_model=BASE_MODEL)).version
    registry.promote(AGENT, v1, reason="the base model serves first")

    pods: list[Pod] = []
    triton_client = triton_http.InferenceServerClient(triton.http_url)
    try:
        readiness = {"spanmill-collector": "/readyz", "spanmill-gateway": "/healthz",
                     "spanmill-rollout": "/healthz"}  # fmt: skip
        for deployment, ready in readiness.items():
            replicas = rendered.get("Deployment", deployment)["spec"]["replicas"]
            for index in range(replicas):
                pods.append(Pod(rendered, deployment, tmp_path, kubeconfig, index))
                pods[-1].wait_ready(ready)
        # Two controllers, as the chart runs them: one holds the Lease and acts.
        collector, gateway, controller, standby = pods
        gateway_url = f"http://127.0.0.1:{gateway.port}"

        # The controller serves the champion: loaded in Triton from the shared repository,
        # base weights included (no pod sees another's files), routed in the ConfigMap.
        core = k8s.CoreV1Api(kube.api_client())

        def routed() -> dict[str, Any]:
            data = core.read_namespaced_config_map("spanmill-routing", NAMESPACE).data or {}
            routes: dict[str, Any] = json.loads(data.get("routes.json", "{}")).get("routes", {})
            return routes

        eventually(lambda: triton_client.is_model_ready(AGENT, str(v1)) and AGENT in routed(),
                   300, "serving the champion", controller, standby)  # fmt: skip
        coordination = k8s.CoordinationV1Api(kube.api_client())
        lease = coordination.read_namespaced_lease("spanmill-rollout", NAMESPACE)
        assert lease.spec.holder_identity in (controller.name, standby.name)
        if lease.spec.holder_identity == standby.name:
            controller, standby = standby, controller
        assert (triton.model_repository / AGENT / str(v1) / "base" / "config.json").is_file()

        # Production: episodes reach the span store on S3 through the collector's receiver.
        traces = recorded_episodes(120)
        with httpx.Client(base_url=f"http://127.0.0.1:{collector.port}", timeout=30) as http:
            for spans in traces:
                response = http.post(
                    "/v1/traces",
                    content=encode_otlp_protobuf(spans),
                    headers={
                        "Content-Type": "application/x-protobuf",
                        "Authorization": f"Bearer {PRODUCER_KEY}",
                    },
                )
                assert response.status_code == 200, response.text
        store_url = f"s3://{BUCKET}/spans"
        store = SpanStore(store_url, storage)
        wanted = sum(len(spans) for spans in traces)
        eventually(lambda: store.table().num_rows >= wanted, 120, "spans in the store", collector)

        # The pipeline, as uploaded, with the cluster's settings as its only connections.
        (configmap,) = [d for d in rendered.kinds("ConfigMap")
                        if d["metadata"]["name"] == cluster.CONFIGMAP]  # fmt: skip
        _, platform = yaml.safe_load_all(DEFAULT_PACKAGE.read_text())
        executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        environments = [
            cluster.step_environment(e, {cluster.CONFIGMAP: configmap["data"]}, SECRETS)
            for e in executors.values()
        ]
        assert all(env == environments[0] for env in environments)
        for key in [k for k in os.environ if k.startswith(("SPANMILL_", "AWS_", "MLFLOW_"))]:
            monkeypatch.delenv(key)
        for key, value in environments[0].items():
            monkeypatch.setenv(key, value)
        # The steps' pods have their own home: the base model is downloaded there.
        monkeypatch.setenv("SPANMILL_HOME", str(tmp_path / "pipeline-pod"))
        root = tmp_path / "pipeline-root"
        run_local(root, agent=AGENT, max_steps=STEPS, batch_size=4, learning_rate=5e-4,
                  precision="auto", num_threads=2, eval_instances=16)  # fmt: skip

        card = json.loads(only(root, "card.json").read_text())
        assert card["counts"]["llm_calls"] == 240 and card["reward"] == "success"
        assert card["store"] == store_url
        train_rows = pq.read_table(only(root, "train.parquet")).to_pylist()
        assert train_rows and max(len(r["prompt"]) for r in train_rows) <= 4
        metrics = json.loads(only(root, "metrics.json").read_text())
        print(f"\ngate: {metrics['decision']}")
        assert metrics["decision"]["promote"] is True
        tasks, replay = metrics["suites"]["tasks"], metrics["suites"]["replay"]
        for name, suite in (("tasks", tasks), ("replay", replay)):
            before, after = suite["champion"], suite["challenger"]
            print(
                f"{name:6} n={after['n']:3}  success {before['success_rate']:.2f} -> "
                f"{after['success_rate']:.2f}  scores {before['scores']} -> {after['scores']}"
            )
        # The model learnt: the champion (the base model) writes prose to the zero-shot
        # prompt, the challenger calls the tool.
        assert tasks["champion"]["success_rate"] <= 0.1
        assert tasks["challenger"]["format_validity"] >= 0.9
        assert tasks["challenger"]["success_rate"] >= tasks["champion"]["success_rate"] + 0.15
        assert tasks["difference"]["low"] > 0

        v2 = registry.aliases(AGENT)[CHALLENGER]
        version = registry.version(AGENT, v2)
        # The base as training was asked for it, the same in every pod.
        assert version.tags[tags.TAG_BASE_MODEL] == BASE_MODEL
        assert version.tags[tags.TAG_GATE] == "promote"
        mlflow = MlflowClient(mlflow_server.tracking_uri)
        run = mlflow.get_run(version.tags[tags.TAG_TRAIN_RUN])
        assert run.data.params["base_model"] == BASE_MODEL
        loss = mlflow.get_metric_history(run.info.run_id, "loss")
        assert sorted(m.step for m in loss) == list(range(1, STEPS + 1))
        assert loss[-1].value < loss[0].value
        assert {"adapter/adapter_model.safetensors", "evaluation/report.md",
                "evaluation/metrics.json"} <= artifact_paths(mlflow, run.info.run_id)  # fmt: skip
        # The challenger was staged for the evaluation only.
        candidates = triton.model_repository / f"{AGENT}.candidate"
        assert not [p for p in candidates.glob("*") if p.name.isdigit()]

        # The controller: canary on the gateway's traffic, read back from the span store,
        # then promotion; the routing table moves and every decision is an Event.
        traffic = Traffic(gateway_url)

        def seen() -> str:
            """What the clients saw, what of it reached the span store, and on the way
            there, the gateway's spans sent and the collector's records taken from Kafka."""
            calls = store.query(
                "SELECT model_version, count(*) AS calls, max(start_time) AS last "
                "FROM llm_calls() GROUP BY ALL ORDER BY model_version"
            ).to_pylist()
            counters = [
                counted(gateway, ("spanmill_gateway_spans_", "spanmill_gateway_span_queue")),
                counted(collector, ("spanmill_collector_records_consumed",
                                    "spanmill_collector_spans_written", "spanmill_collector_lag",
                                    "spanmill_collector_assigned", "spanmill_collector_commits",
                                    "spanmill_collector_dead")),
            ]  # fmt: skip
            return (
                f"{traffic.describe()}\n--- the span store's calls: {calls}\n--- "
                + "\n--- ".join(counters)
            )

        try:
            eventually(lambda: registry.aliases(AGENT).get(CHAMPION) == v2, 300,
                       "promoting the challenger", *pods, context=seen)  # fmt: skip
            eventually(lambda: "2" in traffic.versions[-5:], 60, "v2 answering", gateway,
                       context=seen)  # fmt: skip
        finally:
            traffic.stop()
        assert {"1", "2"} <= set(traffic.versions)
        assert traffic.statuses.count(200) >= 0.9 * len(traffic.statuses)

        def reasons() -> set[str]:
            return {e.reason for e in core.list_namespaced_event(NAMESPACE).items}

        # The alias moves first, then the decision is recorded as an Event, then the pass
        # ends by writing the route: the last canary step's (v1 at 0%) until then.
        eventually(lambda: {"Serving", "CanaryStarted", "StepAdvanced", "Promoted"} <= reasons(),
                   30, "the decisions as Events", controller)  # fmt: skip

        def backends() -> list[tuple[str, float]]:
            return [(b["version"], b["weight"]) for b in routed()[AGENT]["backends"]]

        eventually(lambda: backends() == [(str(v2), 100.0)], 30, "routing v2 alone", controller)

        # Both replicas ran on, each on its own port, one of them leading (a renewal that
        # the loaded machine's API answered too late may have handed the Lease over);
        # asked, the leader says where each of its threads is.
        lease = coordination.read_namespaced_lease("spanmill-rollout", NAMESPACE)
        holder = lease.spec.holder_identity
        assert holder in (controller.name, standby.name), holder
        if holder == standby.name:
            controller, standby = standby, controller
        assert standby.process.poll() is None, standby.tail()
        assert "stands by" in standby.tail(100_000), standby.tail()
        controller.dump_stacks()
        stacks = controller.tail(100_000)
        assert "Thread 0x" in stacks and "rollout/reconciler.py" in stacks, controller.tail()
    finally:
        for pod in reversed(pods):
            pod.stop()
        with contextlib.suppress(Exception):
            triton_client.unload_model(AGENT)
        triton_client.close()


def test_pod_env_follows_the_kubelet(tmp_path: Path) -> None:
    container = {"volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                                  {"name": "models", "mountPath": "/tmp/models"},
                                  {"name": "keys", "mountPath": "/etc/keys"}], "env": [
        {"name": "A", "value": "1"},
        {"name": "KEYS", "value": "/etc/keys/keys"},
        {"name": "REPO", "value": "/tmp/models/x"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "SPANMILL_HOME", "value": "/tmp/spanmill"},
        {"name": "K", "valueFrom": {"secretKeyRef": {"name": "spanmill-s3",
                                                     "key": "AWS_ACCESS_KEY_ID"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu",
                                                            "divisor": "1"}}},
    ], "resources": {"requests": {"cpu": "250m"}}}  # fmt: skip
    volumes = [{"name": "keys", "secret": {"secretName": "spanmill-producer-keys"}}]
    env = pod_env(container, volumes, "p-0", tmp_path)
    keys = tmp_path / "secrets" / "keys" / "keys"
    assert keys.read_text() == SECRETS["spanmill-producer-keys"]["keys"]
    assert env == {"A": "1", "KEYS": str(keys), "REPO": "/tmp/models/x", "HOME": str(tmp_path),
                   "SPANMILL_HOME": f"{tmp_path}/spanmill", "K": "rehearsal",
                   "POD": "p-0", "CPUS": "1"}  # fmt: skip
