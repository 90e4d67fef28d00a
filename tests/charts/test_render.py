"""The key facts of the rendered chart, checked for every ci/ value set."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helm_render import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    VALUE_SETS,
    Rendered,
    env_of,
    manifest_validator,
    merged_values,
    parse,
    template,
)

from spanmill.config import RolloutSettings
from spanmill.gateway.configmap import ROUTES_KEY
from spanmill.gateway.routing import RoutingTable
from spanmill.serving.readiness import READY_PATH

FULLNAME = "spanmill"
ROUTES = f"{FULLNAME}-routing"
TRAINJOBS_ROLE = f"{FULLNAME}-pipeline-trainjobs"
TRITON_PODS_ROLE = f"{FULLNAME}-pipeline-triton-pods"
# An env var with one of these in its name carries a credential: only secretKeyRef.
SECRET_WORDS = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|ACCESS_KEY|CREDENTIAL|STORE_URI", re.I)
# user:password@ inside a URL, anywhere in a rendered value.
URL_CREDENTIALS = re.compile(r"://[^/@\s:]+:[^/@\s]+@")


def test_every_manifest_passes_strict_kubernetes_validation(rendered: Rendered) -> None:
    validator = manifest_validator()
    report = validator.Report()
    for document in rendered.documents:
        validator.validate_document(document, KUBE_VERSION, report, rendered.name)
    assert report.errors == []
    assert sum(report.validated.values()) + sum(report.skipped.values()) == len(rendered.documents)
    # Only the custom resources named in the validator go unvalidated.
    assert set(report.skipped) <= {"ServiceMonitor"}


def test_the_validator_rejects_unknown_fields_and_kinds() -> None:
    validator = manifest_validator()
    report = validator.Report()
    bad_field = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x"},
        "dataa": {},
    }
    unknown_kind = {"apiVersion": "apps/v1", "kind": "Deploymnet", "metadata": {"name": "x"}}
    for document in (bad_field, unknown_kind):
        validator.validate_document(document, KUBE_VERSION, report, "case")
    assert len(report.errors) == 2
    assert "dataa" in report.errors[0]
    assert "no Kubernetes" in report.errors[1]


def test_no_secret_is_rendered_only_referenced(rendered: Rendered) -> None:
    assert rendered.kinds("Secret") == []
    for where, container, _ in rendered.containers():
        for name, entry in env_of(container).items():
            if SECRET_WORDS.search(name):
                assert "value" not in entry, f"{where}: {name} is a literal value"
                assert "secretKeyRef" in entry["valueFrom"], f"{where}: {name} not from a Secret"
        for source in container.get("envFrom", []):
            assert "configMapRef" not in source, f"{where}: env from a ConfigMap"
    for config_map in rendered.kinds("ConfigMap"):
        for key in config_map.get("data", {}):
            assert not SECRET_WORDS.search(key), f"ConfigMap {config_map['metadata']['name']}"
    assert not URL_CREDENTIALS.search(json.dumps(rendered.documents))


def test_credentials_come_from_the_named_secrets(render_set: Any) -> None:
    sasl = render_set("external-kafka-sasl")
    env = env_of(sasl.container(f"{FULLNAME}-collector"))
    ref = env["SPANMILL_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "spanmill-kafka-credentials", "key": "password"}
    assert env["SPANMILL_KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
    # AWS S3 through the pods' own identity: no key variables at all.
    assert "AWS_ACCESS_KEY_ID" not in env
    gateway = env_of(sasl.container(f"{FULLNAME}-gateway"))
    key = gateway["SPANMILL_GATEWAY_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert key["name"] == "spanmill-gateway-api-key"
    everything = render_set("all-features")
    # Client keys come as a file from their Secret, mounted as a folder (so that a revoked
    # key's line leaves the file), and the admin credential apart.
    gateway_pod = everything.get("Deployment", f"{FULLNAME}-gateway")["spec"]["template"]["spec"]
    gateway = env_of(everything.container(f"{FULLNAME}-gateway"))
    assert (
        gateway["SPANMILL_GATEWAY_CLIENT_KEYS_FILE"]["value"] == "/etc/spanmill/gateway-keys/keys"
    )
    mount = next(m for m in gateway_pod["containers"][0]["volumeMounts"]
                 if m["name"] == "gateway-keys")  # fmt: skip
    assert mount == {"name": "gateway-keys", "mountPath": "/etc/spanmill/gateway-keys",
                     "readOnly": True} and "subPath" not in mount  # fmt: skip
    volume = next(v for v in gateway_pod["volumes"] if v["name"] == "gateway-keys")
    assert volume["secret"]["secretName"] == "spanmill-gateway-client-keys"
    collector = env_of(everything.container(f"{FULLNAME}-collector"))
    assert collector["SPANMILL_COLLECTOR_RECEIVER_KEYS_FILE"]["value"] == (
        "/etc/spanmill/receiver-keys/keys"
    )
    collector_pod = everything.get("Deployment", f"{FULLNAME}-collector")["spec"]["template"]
    assert {"name": "receiver-keys", "secret": {"secretName": "spanmill-collector-receiver-keys"}
            } in collector_pod["spec"]["volumes"]  # fmt: skip
    assert gateway["SPANMILL_GATEWAY_KEY_REQUESTS_PER_S"]["value"] == "20"
    assert gateway["SPANMILL_GATEWAY_KEY_MAX_CONCURRENT"]["value"] == "8"
    plain = env_of(render_set("gpu-cluster").container(f"{FULLNAME}-gateway"))
    assert "SPANMILL_GATEWAY_KEY_REQUESTS_PER_S" not in plain  # 0: no limit
    admin = gateway["SPANMILL_GATEWAY_ADMIN_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert admin == {"name": "spanmill-gateway-admin-key", "key": "admin-key"}
    mlflow = env_of(everything.container(f"{FULLNAME}-mlflow"))
    uri = mlflow["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"]
    assert uri == {"name": "spanmill-mlflow-db", "key": "uri"}


def test_every_container_is_non_root_read_only_and_without_capabilities(
    rendered: Rendered,
) -> None:
    containers = list(rendered.containers())
    assert containers
    for where, container, pod in containers:
        pod_security = pod["securityContext"]
        assert pod_security["runAsNonRoot"] is True, where
        assert pod_security["runAsUser"] > 0, where
        assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}, where
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, where
        assert security["allowPrivilegeEscalation"] is False, where
        assert security["capabilities"] == {"drop": ["ALL"]}, where
        assert security.get("privileged") is not True, where
        assert security.get("runAsUser", 1) != 0, where
        # With a read-only root, whatever a process writes needs a volume.
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}, where
        assert pod.get("hostNetwork") is not True and pod.get("hostPID") is not True, where


def _gpu_resources(container: dict[str, Any]) -> dict[str, Any]:
    resources = container.get("resources", {})
    return {
        f"{section}.{name}": amount
        for section in ("requests", "limits")
        for name, amount in resources.get(section, {}).items()
        if "gpu" in name
    }


def test_gpus_are_requested_by_triton_alone(rendered: Rendered) -> None:
    """By the serving Triton, and by the evaluation's where there is one."""
    values = merged_values(rendered.name)
    count = values["triton"]["gpu"]["count"]
    tritons = {f"Deployment/{FULLNAME}-{name}/triton" for name in ("triton", "triton-evaluation")}
    for where, container, _ in rendered.containers():
        gpus = _gpu_resources(container)
        if where in tritons and count:
            assert gpus == {"requests.nvidia.com/gpu": count, "limits.nvidia.com/gpu": count}
        else:
            assert gpus == {}, f"{where} asks for GPUs"


def test_triton_on_gpu_nodes_when_it_has_gpus(render_set: Any) -> None:
    for name in ("gpu-cluster", "all-features"):
        pod = render_set(name).get("Deployment", f"{FULLNAME}-triton")["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"spanmill.io/pool": "gpu"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
        assert pod["containers"][0]["image"].endswith("-vllm-python-py3")
    for component in ("collector", "gateway", "rollout"):
        deployment = render_set("gpu-cluster").get("Deployment", f"{FULLNAME}-{component}")
        pod = deployment["spec"]["template"]["spec"]
        assert "nodeSelector" not in pod and "tolerations" not in pod, component


def test_triton_readiness_and_model_repository(render_set: Any) -> None:
    for value_set in ("defaults", "gpu-cluster"):  # the python flavour, then the vllm one
        rendered = render_set(value_set)
        triton = rendered.container(f"{FULLNAME}-triton")
        # Triton's own readiness in its container, and beside it a container of the
        # controller's image that says whether it holds every routed version
        # (spanmill.serving.readiness), judged on the routing ConfigMap mounted as a folder
        # the kubelet keeps current: both flavours alike (the vLLM image has no spanmill).
        assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        readiness = rendered.container(f"{FULLNAME}-triton", "readiness")
        assert readiness["image"].rsplit(":", 1)[0].endswith("/rollout")
        command = readiness["command"] + readiness["args"]
        assert command[:3] == ["spanmill", "triton", "ready"] and "--serve" in command
        port = int(command[command.index("--serve") + 1])
        (declared,) = readiness["ports"]
        assert declared["containerPort"] == port
        assert readiness["readinessProbe"]["httpGet"] == {"path": READY_PATH,
                                                           "port": declared["name"]}  # fmt: skip
        probe = subprocess.run(
            [sys.executable, "-m", *command, "--help"], capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert probe.returncode == 0 and "--routing-file" in probe.stdout, probe.stderr
        routing_file = Path(command[command.index("--routing-file") + 1])
        assert command[command.index("--url") + 1] == "127.0.0.1:8000"
        mount = next(m for m in readiness["volumeMounts"] if m["name"] == "routing")
        assert routing_file.parent == Path(mount["mountPath"]) and "subPath" not in mount
        assert routing_file.name == ROUTES_KEY
        pod = rendered.get("Deployment", f"{FULLNAME}-triton")["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "routing")
        assert volume["configMap"] == {"name": ROUTES, "optional": True}
    defaults = render_set("defaults")
    triton = defaults.container(f"{FULLNAME}-triton")
    # A custom S3 endpoint goes between s3:// and the bucket, as tritonserver expects.
    assert "--model-repository=s3://minio.minio.svc:9000/spanmill/models" in triton["args"]
    gateway = env_of(defaults.container(f"{FULLNAME}-gateway"))
    assert gateway["SPANMILL_TRITON_MODEL_REPOSITORY"]["value"] == "s3://spanmill/models"
    assert gateway["SPANMILL_TRITON_HTTP_URL"]["value"] == f"{FULLNAME}-triton.{NAMESPACE}.svc:8000"
    # On a shared volume: Triton reads it, the controller writes it.
    everything = render_set("all-features")
    triton = everything.get("Deployment", f"{FULLNAME}-triton")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in triton["containers"][0]["volumeMounts"]}
    assert mounts["models"] == {"name": "models", "mountPath": "/models", "readOnly": True}
    rollout = everything.get("Deployment", f"{FULLNAME}-rollout")["spec"]["template"]["spec"]
    rollout_mounts = {m["name"]: m for m in rollout["containers"][0]["volumeMounts"]}
    assert rollout_mounts["models"]["mountPath"] == "/models"
    assert not rollout_mounts["models"].get("readOnly")
    claim = everything.get("PersistentVolumeClaim", f"{FULLNAME}-models")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize(
    ("endpoint", "repository"),
    [
        ("http://minio.minio.svc:9000", "s3://minio.minio.svc:9000/spanmill/models"),
        # tritonserver's s3:// form needs the port: without it, the host was read as the
        # bucket and the repository looked for on AWS.
        ("http://minio.minio.svc", "s3://minio.minio.svc:80/spanmill/models"),
        ("https://s3.example.com", "s3://https://s3.example.com:443/spanmill/models"),
        ("https://s3.example.com:8443/", "s3://https://s3.example.com:8443/spanmill/models"),
    ],
)
def test_tritons_s3_repository_always_names_the_endpoints_port(
    helm: Path, endpoint: str, repository: str
) -> None:
    result = template(helm, extra=["--set", f"objectStore.endpoint={endpoint}",
                                   "--set", "triton.scratchSize=150Gi"])  # fmt: skip
    assert result.returncode == 0, result.output
    rendered = parse("endpoint", result.stdout)
    triton = rendered.container(f"{FULLNAME}-triton")
    assert f"--model-repository={repository}" in triton["args"]
    # Where tritonserver downloads the versions it loads: as large as asked.
    pod = rendered.get("Deployment", f"{FULLNAME}-triton")["spec"]["template"]["spec"]
    tmp = next(v for v in pod["volumes"] if v["name"] == "tmp")
    assert tmp["emptyDir"]["sizeLimit"] == "150Gi"


def test_gateway_reads_the_routing_configmap(rendered: Rendered) -> None:
    """Watched through the API (the default), or mounted as a file the gateway re-reads."""
    watch = merged_values(rendered.name)["gateway"]["routing"]["watch"]
    pod = rendered.get("Deployment", f"{FULLNAME}-gateway")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = env_of(container)
    config_map = rendered.get("ConfigMap", ROUTES)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    if watch:
        assert env["SPANMILL_GATEWAY_ROUTING_CONFIGMAP"]["value"] == f"{NAMESPACE}/{ROUTES}"
        assert "SPANMILL_GATEWAY_ROUTING_FILE" not in env
        assert "routing" not in volumes
        key = ROUTES_KEY
    else:
        assert "SPANMILL_GATEWAY_ROUTING_CONFIGMAP" not in env
        assert volumes["routing"]["configMap"]["name"] == ROUTES
        mount = next(m for m in container["volumeMounts"] if m["name"] == "routing")
        # A subPath mount would never see the controller's updates.
        assert "subPath" not in mount and mount["readOnly"] is True
        routing_file = Path(env["SPANMILL_GATEWAY_ROUTING_FILE"]["value"])
        assert routing_file.parent == Path(mount["mountPath"])
        key = routing_file.name
    values = merged_values(rendered.name)
    initial = RoutingTable.model_validate(values["gateway"]["routing"]["initial"])
    if values["rollout"]["enabled"]:
        # The controller writes the table: rendered without a cluster, as a GitOps tool
        # renders it on every sync, the ConfigMap holds none to reset live traffic with.
        assert "data" not in config_map
        controller = env_of(rendered.container(f"{FULLNAME}-rollout"))
        written = controller["SPANMILL_ROLLOUT_INITIAL_ROUTES"]["value"]
        with pytest.MonkeyPatch.context() as env:  # read as the controller reads it
            env.setenv("SPANMILL_ROLLOUT_INITIAL_ROUTES", written)
            assert RolloutSettings().initial_routes == initial
        # A version routed away is unloaded once every gateway has the new routes: a
        # mounted ConfigMap reaches them after the kubelet's update, a minute or two.
        drain = float(controller["SPANMILL_ROLLOUT_DRAIN_S"]["value"])
        wanted = values["rollout"]["policy"]["drainSeconds"]
        assert drain == (wanted if watch else max(120, wanted)) and drain >= 30
    else:  # no controller: the chart's table is the table
        assert RoutingTable.parse(config_map["data"][key], "routing ConfigMap") == initial
    # Upgrades must not reset the controller's routes: helm keeps the ConfigMap.
    assert config_map["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_without_the_controller_the_charts_table_is_the_table(helm: Path) -> None:
    initial = {"revision": 3, "routes": {"calc": {"triton_model": "calc",
               "backends": [{"version": "2", "weight": 1}]}}}  # fmt: skip
    routes = f"gateway.routing.initial={json.dumps(initial)}"
    result = template(helm, extra=["--set", "rollout.enabled=false", "--set-json", routes])
    assert result.returncode == 0, result.output
    rendered = parse("no-controller", result.stdout)
    config_map = rendered.get("ConfigMap", ROUTES)
    assert RoutingTable.parse(config_map["data"][ROUTES_KEY], "ConfigMap") == (
        RoutingTable.model_validate(initial)
    )
    deployments = {d["metadata"]["name"] for d in rendered.kinds("Deployment")}
    assert f"{FULLNAME}-rollout" not in deployments


def test_both_routing_modes_are_rendered(render_set: Any) -> None:
    modes = {merged_values(name)["gateway"]["routing"]["watch"] for name in VALUE_SETS}
    assert modes == {True, False}


def _rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: sorted(v) for k, v in rule.items()} for rule in role["rules"]]


def test_rbac_is_exactly_what_the_controller_and_gateway_use(rendered: Rendered) -> None:
    assert rendered.kinds("ClusterRole") == [] and rendered.kinds("ClusterRoleBinding") == []
    watch = merged_values(rendered.name)["gateway"]["routing"]["watch"]
    roles = {r["metadata"]["name"]: r for r in rendered.kinds("Role")}
    expected = {f"{FULLNAME}-rollout"} | ({f"{FULLNAME}-gateway"} if watch else set())
    # The pipeline's own ServiceAccount on TrainJobs: tests/charts/test_trainer.py.
    values = merged_values(rendered.name)
    if values["trainer"]["enabled"]:
        expected |= {TRAINJOBS_ROLE}
    pipeline = values["pipelineSettings"]
    if pipeline["enabled"] and values["triton"]["enabled"]:
        expected |= {TRITON_PODS_ROLE}
        # spanmill.rollout.fleet in the pipeline's evaluation: list the
        # Triton pods, for the pipeline's ServiceAccount from the runs' namespace.
        assert _rules(roles[TRITON_PODS_ROLE]) == [
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
             "verbs": ["list"]}
        ]  # fmt: skip
        (binding,) = [b for b in rendered.kinds("RoleBinding")
                      if b["metadata"]["name"] == TRITON_PODS_ROLE]  # fmt: skip
        assert binding["subjects"] == [{
            "kind": "ServiceAccount", "name": pipeline["serviceAccount"],
            "namespace": pipeline["namespace"] or NAMESPACE,
        }]  # fmt: skip
    assert set(roles) == expected
    # spanmill.rollout.k8s_backend: read and merge-patch the routing ConfigMap; create
    # an Event per decision, or read and patch it to count a repeat.
    assert _rules(roles[f"{FULLNAME}-rollout"]) == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [ROUTES],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "patch"]},
        # spanmill.rollout.fleet: the Triton pods, from the headless Service's EndpointSlices.
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["list", "watch"],
        },
        # spanmill.rollout.leader: read and replace its one Lease, by name, nothing more.
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [f"{FULLNAME}-rollout"],
            "verbs": ["get", "update"],
        },
    ]
    if watch:
        # spanmill.gateway.configmap: read, then list and watch by metadata.name.
        assert _rules(roles[f"{FULLNAME}-gateway"]) == [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [ROUTES],
                "verbs": ["get", "list", "watch"],
            }
        ]
    for binding in rendered.kinds("RoleBinding"):
        name = binding["metadata"]["name"]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": name,
        }
        if name in (TRAINJOBS_ROLE, TRITON_PODS_ROLE):
            continue
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}
        ]
    # Only the pods with a Role get an API token.
    for where, pod in rendered.pod_specs():
        component = where.split("/", 1)[1]
        has_role = component in roles
        assert pod["automountServiceAccountToken"] is has_role, where
        if where.startswith("Deployment/"):
            assert pod["serviceAccountName"] == component, where


def test_collectors_never_outnumber_partitions(rendered: Rendered) -> None:
    values = merged_values(rendered.name)
    partitions = values["kafka"]["topics"]["partitions"]
    if not values["collector"]["autoscaling"]["enabled"]:
        assert rendered.find("HorizontalPodAutoscaler", f"{FULLNAME}-collector") is None
        deployment = rendered.get("Deployment", f"{FULLNAME}-collector")
        assert 1 <= deployment["spec"]["replicas"] <= partitions
        return
    hpa = rendered.get("HorizontalPodAutoscaler", f"{FULLNAME}-collector")
    assert hpa["spec"]["maxReplicas"] <= partitions
    metrics = hpa["spec"]["metrics"]
    if values["collector"]["autoscaling"]["metric"] == "lag":
        assert metrics[0]["pods"]["metric"]["name"] == "spanmill_collector_lag"
    else:
        assert metrics[0]["resource"]["name"] == "cpu"


def test_a_collector_parked_at_no_replicas_starts_as_one_of_one(helm: Path) -> None:
    """Scaled up by hand from 0, a pod must not refuse its own settings (instances >= 1)."""
    extra = ["--set", "collector.autoscaling.enabled=false", "--set", "collector.replicas=0"]
    result = template(helm, extra=extra)
    assert result.returncode == 0, result.output
    parked = parse("parked-collector", result.stdout)
    assert parked.get("Deployment", f"{FULLNAME}-collector")["spec"]["replicas"] == 0
    env = env_of(parked.container(f"{FULLNAME}-collector"))
    assert env["SPANMILL_COLLECTOR_INSTANCES"]["value"] == "1"


def test_services_probes_and_policies_point_at_declared_ports(rendered: Rendered) -> None:
    ports: dict[str, set[str]] = {}
    labels: dict[str, dict[str, str]] = {}
    for deployment in rendered.kinds("Deployment"):
        template = deployment["spec"]["template"]
        names = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        ports[deployment["metadata"]["name"]] = names
        labels[deployment["metadata"]["name"]] = template["metadata"]["labels"]
        for container in template["spec"]["containers"]:
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                if "httpGet" in container.get(probe, {}):
                    assert container[probe]["httpGet"]["port"] in names

    def selected(selector: dict[str, str]) -> list[str]:
        return [n for n, lab in labels.items() if selector.items() <= lab.items()]

    for service in rendered.kinds("Service"):
        (target,) = selected(service["spec"]["selector"])
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports[target], service["metadata"]["name"]
    for policy in rendered.kinds("NetworkPolicy"):
        # One component each (a Job's has no port), but the release's default deny.
        targets = selected(policy["spec"]["podSelector"]["matchLabels"])
        assert len(targets) <= 1 or "ingress" not in policy["spec"], policy["metadata"]["name"]
        for rule in policy["spec"].get("ingress", []):
            for port in rule["ports"]:
                assert port["port"] in ports[targets[0]], policy["metadata"]["name"]
    services = {s["metadata"]["name"]: s for s in rendered.kinds("Service")}
    for monitor in rendered.kinds("ServiceMonitor"):
        service = services[monitor["metadata"]["name"]]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= (
            service["metadata"]["labels"].items()
        )
        service_ports = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in service_ports
    for pdb in rendered.kinds("PodDisruptionBudget"):
        assert len(selected(pdb["spec"]["selector"]["matchLabels"])) == 1


def test_triton_accepts_only_the_gateway_controller_and_pipeline_runs(render_set: Any) -> None:
    policy = render_set("defaults").get("NetworkPolicy", f"{FULLNAME}-triton")
    inference = policy["spec"]["ingress"][0]
    components = {
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for peer in inference["from"]
        if "podSelector" in peer
    }
    assert components == {"gateway", "rollout"}
    namespaces = [p["namespaceSelector"] for p in inference["from"] if "namespaceSelector" in p]
    assert namespaces == [{"matchLabels": {"kubernetes.io/metadata.name": "kubeflow"}}]


@pytest.mark.parametrize("value_set", ["defaults", "triton-replicas"])
def test_the_controller_loads_every_triton_pod(render_set: Any, value_set: str) -> None:
    """Through a headless Service that lists pods before they are ready
    (spanmill.rollout.fleet), beside the gateway's Service of ready pods only."""
    rendered = render_set(value_set)
    replicas = merged_values(value_set)["triton"]["replicas"]
    assert rendered.get("Deployment", f"{FULLNAME}-triton")["spec"]["replicas"] == replicas
    pods = rendered.get("Service", f"{FULLNAME}-triton-pods")["spec"]
    assert pods["clusterIP"] == "None" and pods["publishNotReadyAddresses"] is True
    service = rendered.get("Service", f"{FULLNAME}-triton")["spec"]
    assert pods["selector"] == service["selector"]
    assert "clusterIP" not in service and "publishNotReadyAddresses" not in service
    (http,) = [p for p in pods["ports"] if p["name"] == "http"]
    assert http["targetPort"] == "http"
    env = env_of(rendered.container(f"{FULLNAME}-rollout"))
    assert env["SPANMILL_TRITON_DISCOVERY"]["value"] == "endpointslices"
    assert env["SPANMILL_TRITON_PODS_SERVICE"]["value"] == f"{FULLNAME}-triton-pods"
    assert env["SPANMILL_TRITON_NAMESPACE"]["value"] == NAMESPACE
    # The port the controller reads from each slice is the one this Service names.
    from spanmill.config import TritonSettings

    assert TritonSettings.model_fields["port_name"].default == http["name"]


def test_gateway_signals_read_every_gateway_pod(helm: Path) -> None:
    """With rollout.signals=gateway the controller reads each gateway pod's /metrics, found
    from the gateway Service's EndpointSlices (spanmill.rollout.fleet.ServicePods), not
    the Service's one address, which answers from one replica at a time: any number of
    replicas, the autoscaler's too, and without Triton in the release."""
    extra = ["--set", "rollout.signals=gateway", "--set", "gateway.autoscaling.enabled=true",
             "--set", "triton.enabled=false",
             "--set", "triton.external.httpUrl=triton.example.internal:8000",
             "--set", "triton.external.grpcUrl=triton.example.internal:8001"]  # fmt: skip
    result = template(helm, extra=extra)
    assert result.returncode == 0, result.output
    rendered = parse("gateway-signals", result.stdout)
    env = env_of(rendered.container(f"{FULLNAME}-rollout"))
    assert env["SPANMILL_ROLLOUT_SIGNALS"]["value"] == "gateway"
    assert env["SPANMILL_ROLLOUT_GATEWAY_SERVICE"]["value"] == f"{FULLNAME}-gateway"
    assert env["SPANMILL_ROLLOUT_NAMESPACE"]["value"] == NAMESPACE
    assert "SPANMILL_ROLLOUT_GATEWAY_URLS" not in env
    (port,) = rendered.get("Service", f"{FULLNAME}-gateway")["spec"]["ports"]
    assert port["name"] == RolloutSettings.model_fields["gateway_port_name"].default
    role = {r["metadata"]["name"]: r for r in rendered.kinds("Role")}[f"{FULLNAME}-rollout"]
    assert {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
            "verbs": ["list", "watch"]} in _rules(role)  # fmt: skip
    validator = manifest_validator()
    report = validator.Report()
    for document in rendered.documents:
        validator.validate_document(document, KUBE_VERSION, report, rendered.name)
    assert report.errors == []


def test_the_evaluation_stages_its_candidates_on_a_triton_of_its_own_when_asked(
    render_set: Any,
) -> None:
    """triton.evaluation: one more Triton, made as the serving ones are but routed nothing,
    reached by pipeline runs alone, named to the evaluation in the pipeline's settings.
    Without it the key is there (the compiled pipeline mounts it) and empty."""
    rendered = render_set("triton-replicas")
    name = f"{FULLNAME}-triton-evaluation"
    serving, evaluation = rendered.container(f"{FULLNAME}-triton"), rendered.container(name)
    deployment = rendered.get("Deployment", name)["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}
    for field in ("image", "command", "args", "resources", "volumeMounts"):
        assert evaluation[field] == serving[field], field
    assert evaluation["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    selector = rendered.get("Service", name)["spec"]["selector"]
    assert selector["app.kubernetes.io/component"] == "triton-evaluation"
    assert selector != rendered.get("Service", f"{FULLNAME}-triton")["spec"]["selector"]
    (inference,) = [
        rule for rule in rendered.get("NetworkPolicy", name)["spec"]["ingress"]
        if {"port": "http"} in rule["ports"]
    ]  # fmt: skip
    assert inference["from"] == merged_values("triton-replicas")["networkPolicy"]["pipelineRuns"]
    settings = rendered.get("ConfigMap", "spanmill-pipeline")["data"]
    assert settings["SPANMILL_EVAL_CANDIDATES_URL"] == f"{name}.{NAMESPACE}.svc:8000"

    # The vLLM flavour's: the same image with a GPU of its own (its candidates are an
    # engine of their own), reading adapters from the same volume.
    gpu = render_set("gpu-cluster")
    serving, evaluation = gpu.container(f"{FULLNAME}-triton"), gpu.container(name)
    for field in ("image", "args", "resources", "volumeMounts"):
        assert evaluation[field] == serving[field], field
    assert evaluation["resources"]["limits"]["nvidia.com/gpu"] == 1

    defaults = render_set("defaults")
    assert defaults.find("Deployment", name) is None and defaults.find("Service", name) is None
    assert (
        defaults.get("ConfigMap", "spanmill-pipeline")["data"]["SPANMILL_EVAL_CANDIDATES_URL"] == ""
    )


def test_strimzi_resources_when_enabled(render_set: Any) -> None:
    everything = render_set("all-features")
    kafka = everything.get("Kafka", FULLNAME)
    assert kafka["metadata"]["annotations"]["strimzi.io/kraft"] == "enabled"
    topics = {t["spec"]["topicName"]: t for t in everything.kinds("KafkaTopic")}
    assert set(topics) == {"spanmill.spans.v1", "spanmill.spans.v1.dlq", "spanmill.rollouts.v1"}
    assert topics["spanmill.rollouts.v1"]["spec"]["config"]["retention.ms"] == 86400000
    assert topics["spanmill.spans.v1"]["spec"]["partitions"] == 6
    for topic in topics.values():
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == FULLNAME
    env = env_of(everything.container(f"{FULLNAME}-collector"))
    bootstrap = f"{FULLNAME}-kafka-bootstrap.{NAMESPACE}.svc:9093"
    assert env["SPANMILL_KAFKA_BOOTSTRAP_SERVERS"]["value"] == bootstrap
    assert render_set("defaults").kinds("Kafka") == []


def _acls(user: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(resource type, name, operation) for each operation a KafkaUser's ACLs allow."""
    return {
        (acl["resource"]["type"], acl["resource"].get("name", "*"), op)
        for acl in user["spec"]["authorization"]["acls"]
        for op in acl["operations"]
    }


def test_strimzi_asks_every_client_for_scram_and_acls_limit_who_writes_spans(
    render_set: Any,
) -> None:
    from spanmill.pipeline import cluster

    everything = render_set("all-features")
    kafka = everything.get("Kafka", FULLNAME)["spec"]
    assert [listener["authentication"] for listener in kafka["kafka"]["listeners"]] == [
        {"type": "scram-sha-512"}
    ] * 2
    assert kafka["kafka"]["authorization"] == {"type": "simple"}
    assert "userOperator" in kafka["entityOperator"]
    users = {u["metadata"]["name"]: u for u in everything.kinds("KafkaUser")}
    assert set(users) == {f"{FULLNAME}-gateway", f"{FULLNAME}-collector",
                          f"{FULLNAME}-agent-calculator", cluster.KAFKA_SECRET}  # fmt: skip
    for user in users.values():
        assert user["spec"]["authentication"] == {"type": "scram-sha-512"}
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == FULLNAME
    spans, dlq, rollouts = "spanmill.spans.v1", "spanmill.spans.v1.dlq", "spanmill.rollouts.v1"
    writers = {name for name, u in users.items() if ("topic", spans, "Write") in _acls(u)}
    assert writers == {f"{FULLNAME}-gateway", f"{FULLNAME}-collector",
                       f"{FULLNAME}-agent-calculator"}  # fmt: skip
    # Each may do what its work needs and no more.
    assert {a for a in _acls(users[f"{FULLNAME}-agent-calculator"]) if a[0] == "topic"} == {
        ("topic", spans, "Describe"),
        ("topic", spans, "Write"),
    }
    collector = _acls(users[f"{FULLNAME}-collector"])
    assert {("topic", spans, "Read"), ("topic", dlq, "Write"),
            ("group", "spanmill-collector", "Read")} <= collector  # fmt: skip
    assert not [a for a in _acls(users[cluster.KAFKA_SECRET]) if a[1] in (spans, dlq)]
    assert ("topic", rollouts, "Write") in _acls(users[cluster.KAFKA_SECRET])
    # Each component signs in as its own user, with the password Strimzi keeps for it.
    for component in ("gateway", "collector"):
        env = env_of(everything.container(f"{FULLNAME}-{component}"))
        assert env["SPANMILL_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
        assert env["SPANMILL_KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
        assert env["SPANMILL_KAFKA_SASL_USERNAME"]["value"] == f"{FULLNAME}-{component}"
        assert env["SPANMILL_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": f"{FULLNAME}-{component}",
            "key": "password",
        }
    settings = everything.get("ConfigMap", cluster.CONFIGMAP)["data"]
    assert settings["SPANMILL_KAFKA_SASL_USERNAME"] == cluster.KAFKA_SECRET
    assert settings["SPANMILL_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert cluster.SECRETS[cluster.KAFKA_SECRET] == {"password": "SPANMILL_KAFKA_SASL_PASSWORD"}
    # Without Strimzi, nothing of it: the external brokers' own settings stand.
    plain = render_set("defaults").get("ConfigMap", cluster.CONFIGMAP)["data"]
    assert plain["SPANMILL_KAFKA_SASL_MECHANISM"] == plain["SPANMILL_KAFKA_SASL_USERNAME"] == ""


def test_pipeline_upload_job_runs_the_documented_contract(render_set: Any, helm: Path) -> None:
    job = render_set("all-features").get("Job", f"{FULLNAME}-pipeline-upload")
    hooks = job["metadata"]["annotations"]["helm.sh/hook"]
    assert set(hooks.split(",")) == {"post-install", "post-upgrade"}
    # Bounded as a whole: the client would wait for ever on an API that never answers.
    assert (
        job["spec"]["activeDeadlineSeconds"]
        == merged_values("all-features")["pipelineUpload"]["deadlineSeconds"]
    )
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["spanmill"]
    assert container["args"] == [
        "pipeline",
        "upload",
        "--endpoint",
        "http://ml-pipeline.kubeflow.svc:8888",
        "--file",
        "/pipelines/flywheel.yaml",
        # The steps pull from the release's registry, as its own pods do.
        "--image",
        "ghcr.io/spanmill/pipeline:0.1.0",
        "--train-image",
        "ghcr.io/spanmill/train:0.1.0",
        # The model repository on a volume: the evaluation steps mount its claim.
        "--model-claim",
        f"{FULLNAME}-models",
        "--model-path",
        "/models",
    ]
    assert container["image"] == "ghcr.io/spanmill/pipeline:0.1.0"
    result = template(
        helm, [CHART / "ci" / "all-features.yaml"], ["--set", "image.registry=registry.example/ml"]
    )
    assert result.returncode == 0, result.output
    moved = parse("moved", result.stdout)
    args = moved.get("Job", f"{FULLNAME}-pipeline-upload")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert args[args.index("--image") + 1] == "registry.example/ml/pipeline:0.1.0"
    assert args[args.index("--train-image") + 1] == "registry.example/ml/train:0.1.0"
    assert render_set("defaults").find("Job", f"{FULLNAME}-pipeline-upload") is None


def _metric_names() -> set[str]:
    from spanmill.collector.metrics import CollectorMetrics
    from spanmill.gateway.metrics import GatewayMetrics

    names = set()
    for registry in (CollectorMetrics().registry, GatewayMetrics().registry):
        for family in registry.collect():
            for sample in family.samples:
                names.add(sample.name)
            # Families without samples yet (labelled ones) still name their series.
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
            for suffix in suffixes.get(family.type, ("",)):
                names.add(family.name + suffix)
    return names


def test_dashboard_queries_only_metrics_the_services_expose(render_set: Any) -> None:
    config_map = render_set("all-features").get("ConfigMap", f"{FULLNAME}-dashboard")
    dashboard = json.loads(config_map["data"]["spanmill.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "spanmill.json").read_text())
    exposed = _metric_names()
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            queried |= set(re.findall(r"\b(spanmill_[a-z_]+)", target["expr"]))
    assert queried, "the dashboard queries no spanmill metric"
    assert queried <= exposed, f"not exposed by any service: {sorted(queried - exposed)}"
    # Every series of the gateway and the collector has a panel, bar per-batch detail.
    families = {
        n.removesuffix("_total").removesuffix("_bucket")
        for n in queried
        if n.startswith("spanmill_gateway")
    }
    assert {"spanmill_gateway_requests", "spanmill_gateway_request_seconds"} <= families


@pytest.mark.parametrize("component", ["collector", "gateway", "triton"])
def test_disruption_budgets_cover_the_serving_path(render_set: Any, component: str) -> None:
    pdb = render_set("defaults").get("PodDisruptionBudget", f"{FULLNAME}-{component}")
    assert pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("value_set", ["defaults", "leader-election"])
def test_controller_replicas_elect_a_leader_on_the_charts_lease(
    render_set: Any, value_set: str
) -> None:
    rendered = render_set(value_set)
    values = merged_values(value_set)["rollout"]
    name = f"{FULLNAME}-rollout"
    deployment = rendered.get("Deployment", name)
    assert deployment["spec"]["replicas"] == values["replicas"] > 1
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    # The chart makes the Lease, so the Role can name it (the RBAC test); with an empty
    # spec an upgrade never resets the holder the replicas wrote.
    lease = rendered.get("Lease", name)
    assert lease["apiVersion"] == "coordination.k8s.io/v1" and lease["spec"] == {}
    env = env_of(rendered.container(name))
    identity = env["SPANMILL_ROLLOUT_LEADER_IDENTITY"]["valueFrom"]
    assert identity == {"fieldRef": {"fieldPath": "metadata.name"}}
    election = values["leaderElection"]
    expected = {
        "SPANMILL_ROLLOUT_LEADER_ELECTION": "true",
        "SPANMILL_ROLLOUT_LEASE_NAME": name,
        "SPANMILL_ROLLOUT_LEASE_DURATION_S": str(election["leaseDurationSeconds"]),
        "SPANMILL_ROLLOUT_RENEW_DEADLINE_S": str(election["renewDeadlineSeconds"]),
        "SPANMILL_ROLLOUT_RETRY_PERIOD_S": str(election["retryPeriodSeconds"]),
    }
    assert {key: env[key].get("value") for key in expected} == expected
    # A node drain takes one replica at a time; the leader hands over as it goes.
    pdb = rendered.get("PodDisruptionBudget", name)
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert pdb["spec"]["maxUnavailable"] == 1
    # A stuck pass fails the liveness probe, and the kubelet restarts the leader; a
    # stopping one is given time to end its deployments.
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == values["terminationGracePeriodSeconds"] > 30
    assert env["SPANMILL_ROLLOUT_STALL_AFTER_S"]["value"] == str(values["stallAfterSeconds"])
    assert rendered.container(name)["livenessProbe"]["httpGet"]["path"] == "/healthz"


def _secret_ref(entry: dict[str, Any]) -> tuple[str, str]:
    ref = entry["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


@pytest.mark.parametrize("value_set", ["defaults", "mlflow-ingress-auth"])
def test_mlflow_signs_everyone_in_with_credentials_from_secrets(
    render_set: Any, value_set: str
) -> None:
    rendered = render_set(value_set)
    values = merged_values(value_set)["mlflow"]
    auth = values["server"]["auth"]
    mlflow = rendered.container(f"{FULLNAME}-mlflow")
    # The image's wrapper writes the auth config under /tmp, then runs the server.
    assert mlflow["command"] == ["mlflow-with-auth"]
    assert mlflow["args"][:2] == ["server", "--app-name=basic-auth"]
    env = env_of(mlflow)
    admin = auth["existingSecret"]
    assert _secret_ref(env["MLFLOW_AUTH_ADMIN_USERNAME"]) == (admin, auth["usernameKey"])
    assert _secret_ref(env["MLFLOW_AUTH_ADMIN_PASSWORD"]) == (admin, auth["passwordKey"])
    assert env["MLFLOW_AUTH_DEFAULT_PERMISSION"]["value"] == auth["defaultPermission"]
    # The users' database beside the backend store: the same database, or beside the
    # SQLite file on its volume.
    database = values["server"]["backendStore"]["existingSecret"]
    if database:
        assert _secret_ref(env["MLFLOW_AUTH_DATABASE_URI"]) == (database, "uri")
    else:
        assert env["MLFLOW_AUTH_DATABASE_URI"]["value"] == "sqlite:////data/mlflow-auth.db"
        assert "/data" in {m["mountPath"] for m in mlflow["volumeMounts"]}
    # No credential in any argument or ConfigMap: only Secret references.
    for where, container, _ in rendered.containers():
        for arg in container.get("args", []):
            assert not re.search(r"password|MLFLOW_AUTH|\$\(", arg, re.I), f"{where}: {arg}"
    for config_map in rendered.kinds("ConfigMap"):
        text = json.dumps(config_map.get("data", {}))
        assert not re.search(r"admin_password|database_uri|MLFLOW_AUTH", text), config_map

    # The controller signs in as its own user.
    controller = env_of(rendered.container(f"{FULLNAME}-rollout"))
    secret = values["auth"]["controllerSecret"]
    assert _secret_ref(controller["MLFLOW_TRACKING_USERNAME"]) == (secret, "username")
    assert _secret_ref(controller["MLFLOW_TRACKING_PASSWORD"]) == (secret, "password")

    # The hook Job makes the controller's and the pipeline's users, as the admin.
    job = rendered.get("Job", f"{FULLNAME}-mlflow-users")
    assert set(job["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {
        "post-install",
        "post-upgrade",
    }
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"].startswith("ghcr.io/spanmill/rollout:")
    args = container["args"]
    assert args[:2] == ["models", "users"]
    uri = args[args.index("--tracking-uri") + 1]
    assert (
        uri
        == env_of(rendered.container(f"{FULLNAME}-rollout"))["SPANMILL_MLFLOW_TRACKING_URI"][
            "value"
        ]
    )
    job_env = env_of(container)
    assert _secret_ref(job_env["MLFLOW_TRACKING_USERNAME"]) == (admin, auth["usernameKey"])
    assert _secret_ref(job_env["MLFLOW_TRACKING_PASSWORD"]) == (admin, auth["passwordKey"])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for role in ("controller", "pipeline"):
        folder = args[args.index(f"--{role}") + 1]
        mounted = volumes[mounts[folder]]["secret"]
        assert mounted["secretName"] == values["auth"][f"{role}Secret"]
        assert {i["key"] for i in mounted["items"]} == {"username", "password"}
    # The Job's pods may reach MLflow.
    policy = rendered.get("NetworkPolicy", f"{FULLNAME}-mlflow")
    peers = policy["spec"]["ingress"][0]["from"]
    components = {p["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
                  for p in peers if "podSelector" in p}  # fmt: skip
    assert {"rollout", "mlflow-users"} <= components


def test_mlflow_ingress_with_tls_reaches_the_service(render_set: Any) -> None:
    rendered = render_set("mlflow-ingress-auth")
    values = merged_values("mlflow-ingress-auth")
    ingress_values = values["mlflow"]["server"]["ingress"]
    ingress = rendered.get("Ingress", f"{FULLNAME}-mlflow")
    spec = ingress["spec"]
    assert spec["ingressClassName"] == ingress_values["className"]
    assert ingress["metadata"]["annotations"] == ingress_values["annotations"]
    host = ingress_values["host"]
    assert spec["tls"] == [{"hosts": [host], "secretName": ingress_values["tls"]["existingSecret"]}]
    (rule,) = spec["rules"]
    assert rule["host"] == host
    backend = rule["http"]["paths"][0]["backend"]["service"]
    service = rendered.get("Service", backend["name"])
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    # MLflow answers requests for the Ingress's host.
    args = rendered.container(f"{FULLNAME}-mlflow")["args"]
    allowed = next(a for a in args if a.startswith("--allowed-hosts="))
    assert host in allowed.split("=", 1)[1].split(",")
    # The ingress controller's pods may reach MLflow.
    policy = rendered.get("NetworkPolicy", f"{FULLNAME}-mlflow")
    for peer in values["networkPolicy"]["mlflowClients"]:
        assert peer in policy["spec"]["ingress"][0]["from"]
    assert render_set("defaults").find("Ingress", f"{FULLNAME}-mlflow") is None


def test_mlflow_without_authentication_runs_plain(helm: Path) -> None:
    result = template(helm, extra=["--set", "mlflow.server.auth.enabled=false"])
    assert result.returncode == 0, result.output
    rendered = parse("no-auth", result.stdout)
    mlflow = rendered.container(f"{FULLNAME}-mlflow")
    assert mlflow["command"] == ["mlflow"] and "--app-name=basic-auth" not in mlflow["args"]
    assert not [name for name in env_of(mlflow) if name.startswith("MLFLOW_AUTH")]
    assert rendered.find("Job", f"{FULLNAME}-mlflow-users") is None


def test_triton_image_follows_the_flavour_unless_named(render_set: Any, helm: Path) -> None:
    # The Python flavour runs spanmill's own image (services/triton/Dockerfile), tagged
    # like every spanmill image; the vLLM flavour NVIDIA's.
    python = render_set("defaults").container(f"{FULLNAME}-triton")
    assert python["image"] == "ghcr.io/spanmill/triton:0.1.0"
    vllm = render_set("gpu-cluster").container(f"{FULLNAME}-triton")
    assert vllm["image"] == "nvcr.io/nvidia/tritonserver:25.01-vllm-python-py3"
    digest = "sha256:" + "ab" * 32
    result = template(
        helm,
        extra=[
            "--set", "triton.image.repository=registry.example.internal/triton",
            "--set", f"triton.image.tag={digest}",
        ],
    )  # fmt: skip
    assert result.returncode == 0, result.output
    named = parse("named", result.stdout).container(f"{FULLNAME}-triton")
    assert named["image"] == f"registry.example.internal/triton@{digest}"


def test_multi_user_upload_signs_with_a_projected_token_of_its_own_account(
    render_set: Any,
) -> None:
    rendered = render_set("kubeflow-multi-user")
    name = f"{FULLNAME}-pipeline-upload"
    pod = rendered.get("Job", name)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name
    assert rendered.get("ServiceAccount", name)["automountServiceAccountToken"] is False
    # No Kubernetes API token: only the one Kubeflow Pipelines accepts.
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    (source,) = volumes["kfp-token"]["projected"]["sources"]
    assert source["serviceAccountToken"] == {
        "audience": "pipelines.kubeflow.org",
        "expirationSeconds": 7200,
        "path": "token",
    }
    # Where the command reads it: spanmill.pipeline.kubeflow.SA_TOKEN_PATH.
    from spanmill.pipeline.kubeflow import SA_TOKEN_AUDIENCE, SA_TOKEN_PATH

    assert source["serviceAccountToken"]["audience"] == SA_TOKEN_AUDIENCE
    mounted = Path(mounts["kfp-token"]["mountPath"]) / source["serviceAccountToken"]["path"]
    assert mounted == SA_TOKEN_PATH and mounts["kfp-token"]["readOnly"] is True
    assert "--sa-token" in container["args"] and "--token-file" not in container["args"]
    # Without multiUser: no token, no account of its own.
    plain = render_set("all-features")
    plain_pod = plain.get("Job", name)["spec"]["template"]["spec"]
    assert "serviceAccountName" not in plain_pod
    assert "kfp-token" not in {v["name"] for v in plain_pod["volumes"]}
    assert plain.find("ServiceAccount", name) is None


def test_the_vllm_engine_spreads_over_the_pods_gpus_and_leaves_room_for_its_reload(
    render_set: Any,
) -> None:
    """The rollout controller and the pipeline's steps write engines the same way: over
    every GPU of a Triton pod, at the share of memory triton.vllm gives."""
    for name, gpus in (("gpu-cluster", "1"), ("all-features", "2")):
        rendered = render_set(name)
        env = {k: v["value"] for k, v in env_of(rendered.container(f"{FULLNAME}-rollout")).items()
               if "value" in v}  # fmt: skip
        pipeline = rendered.get("ConfigMap", "spanmill-pipeline")["data"]
        for settings in (env, pipeline):
            assert settings["SPANMILL_SERVING_VLLM_TENSOR_PARALLEL_SIZE"] == gpus, name
            assert settings["SPANMILL_SERVING_VLLM_GPU_MEMORY_UTILIZATION"] == "0.45", name
            assert settings["SPANMILL_SERVING_VLLM_MAX_MODEL_LEN"] == "4096", name


def test_an_upgrade_on_a_pool_with_no_spare_gpu_replaces_triton_in_place(render_set: Any) -> None:
    """Kubernetes' rolling update starts the new pod first: on a pool sized as
    ci/gpu-cluster.yaml asks (a GPU a serving pod, one for the evaluation), it waited
    for a GPU that never freed, and `helm upgrade --wait` with it."""
    gpu = render_set("gpu-cluster")
    serving = gpu.get("Deployment", f"{FULLNAME}-triton")["spec"]["strategy"]
    assert serving == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0,
                                                                  "maxUnavailable": 1}}  # fmt: skip
    evaluation = gpu.get("Deployment", f"{FULLNAME}-triton-evaluation")["spec"]["strategy"]
    assert evaluation == {"type": "Recreate"}
    assert "strategy" not in render_set("defaults").get("Deployment", f"{FULLNAME}-triton")["spec"]
