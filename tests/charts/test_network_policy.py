"""Closed by default: every pod of the release is denied all traffic but what it needs,
and each component's egress allows exactly the addresses its settings name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from helm_render import NAMESPACE, Rendered

# An address in a setting: a URL (s3:// only with a port: without, it names a bucket) or
# a host:port pair.
_URL = re.compile(r"\b(https?|s3)://([a-z0-9.-]+)(?::(\d+))?")
_HOST_PORT = re.compile(r"(?<![\w./-])([a-z0-9-]+(?:\.[a-z0-9-]+)+):(\d{2,5})\b")


def addresses(container: dict[str, Any]) -> set[tuple[str, int]]:
    """(host, port) of every address the container's environment and arguments name."""
    texts = [str(e.get("value", "")) for e in container.get("env", [])]
    texts += [str(a) for a in container.get("command", []) + container.get("args", [])]
    found: set[tuple[str, int]] = set()
    for text in texts:
        for scheme, host, port in _URL.findall(text):
            if port:
                found.add((host, int(port)))
            elif scheme != "s3":
                found.add((host, 443 if scheme == "https" else 80))
        found.update((host, int(port)) for host, port in _HOST_PORT.findall(text))
    return found


@dataclass(frozen=True)
class Pod:
    workload: str
    labels: dict[str, str]
    spec: dict[str, Any]


def pods(rendered: Rendered) -> Iterator[Pod]:
    for document in rendered.documents:
        if document["kind"] in ("Deployment", "Job", "CronJob"):
            spec = document["spec"]
            template = (spec["jobTemplate"]["spec"] if "jobTemplate" in spec else spec)["template"]
            yield Pod(f"{document['kind']}/{document['metadata']['name']}",
                      template["metadata"]["labels"], template["spec"])  # fmt: skip


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        value = labels.get(expression["key"])
        if expression["operator"] == "NotIn" and value in expression["values"]:
            return False
        if expression["operator"] == "In" and value not in expression["values"]:
            return False
    return True


class Network:
    """What the rendered NetworkPolicies let the release's pods reach."""

    def __init__(self, rendered: Rendered) -> None:
        self.rendered = rendered
        self.policies = rendered.kinds("NetworkPolicy")
        self.pods = list(pods(rendered))
        self.services = {s["metadata"]["name"]: s for s in rendered.kinds("Service")}
        self.namespace = NAMESPACE

    def policies_of(self, pod: Pod) -> list[dict[str, Any]]:
        return [p for p in self.policies if selects(p["spec"]["podSelector"], pod.labels)]

    def egress_rules(self, pod: Pod) -> list[dict[str, Any]]:
        return [
            rule
            for policy in self.policies_of(pod)
            if "Egress" in policy["spec"]["policyTypes"]
            for rule in policy["spec"].get("egress", [])
        ]

    def _port_ok(self, rule: dict[str, Any], wanted: set[object]) -> bool:
        ports = rule.get("ports")
        return not ports or any(p["port"] in wanted for p in ports)

    def may_reach(self, pod: Pod, host: str, port: int) -> bool:
        """Whether an egress rule of ``pod`` lets it open ``host:port``."""
        if host in ("127.0.0.1", "localhost", "::1"):
            return True  # a container beside it in the pod: no policy governs loopback
        service = self._own_service(host)
        if service is not None:
            targets = [p for p in self.pods if selects({"matchLabels": service["spec"]["selector"]},
                                                       p.labels)]  # fmt: skip
            (entry,) = [p for p in service["spec"]["ports"] if p["port"] == port]
            wanted = self._target_ports(targets, entry["targetPort"])
            return any(
                self._port_ok(rule, wanted)
                and (not rule.get("to") or any(
                    "podSelector" in peer and "namespaceSelector" not in peer
                    and selects(peer["podSelector"], target.labels)
                    for peer in rule["to"] for target in targets))
                for rule in self.egress_rules(pod)
            )  # fmt: skip
        strimzi = host.endswith(f"-kafka-bootstrap.{self.namespace}.svc")
        for rule in self.egress_rules(pod):
            if not self._port_ok(rule, {port}):
                continue
            peers = rule.get("to", [])
            if strimzi and self.rendered.kinds("Kafka"):
                if any("strimzi.io/cluster" in p.get("podSelector", {}).get("matchLabels", {})
                       for p in peers):  # fmt: skip
                    return True
            elif peers and all(_public_only(p) for p in peers):
                if not host.endswith(".svc"):
                    return True  # an address outside the cluster
            elif not any("podSelector" in p and "namespaceSelector" not in p for p in peers):
                return True  # any address, or peers outside the release's namespace
        return False

    def _own_service(self, host: str) -> dict[str, Any] | None:
        name, _, rest = host.partition(".")
        if rest and rest == f"{self.namespace}.svc":
            return self.services.get(name)
        return None

    @staticmethod
    def _target_ports(targets: list[Pod], target_port: object) -> set[object]:
        """The target port by name and by number on the pods behind a Service."""
        wanted = {target_port}
        for target in targets:
            for container in target.spec["containers"]:
                for port in container.get("ports", []):
                    if target_port in (port["name"], port["containerPort"]):
                        wanted |= {port["name"], port["containerPort"]}
        return wanted


# The address ranges of a cluster's own pods, Services and nodes.
_PRIVATE = {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}


def _public_only(peer: dict[str, Any]) -> bool:
    """A peer of public addresses alone: an ipBlock that excepts the private ranges."""
    block = peer.get("ipBlock")
    return block is not None and set(block.get("except", [])) >= _PRIVATE


def test_every_pod_is_closed_by_default_and_reaches_what_its_settings_name(
    rendered: Rendered,
) -> None:
    network = Network(rendered)
    if not network.policies:
        pytest.skip("networkPolicy.enabled is false in this value set")
    assert network.pods
    for pod in network.pods:
        policies = network.policies_of(pod)
        kinds = {kind for p in policies for kind in p["spec"]["policyTypes"]}
        assert kinds == {"Ingress", "Egress"}, f"{pod.workload} is not closed by default"
        assert any(p["metadata"]["name"].endswith("-default-deny") for p in policies)
        # Every pod resolves names; and reaches each address its settings name.
        assert network.may_reach(pod, "kube-dns.kube-system.svc", 53) or any(
            {"port": 53, "protocol": "UDP"} in rule.get("ports", [])
            for rule in network.egress_rules(pod)
        ), pod.workload
        for container in pod.spec["containers"]:
            for host, port in sorted(addresses(container)):
                assert network.may_reach(pod, host, port), (
                    f"{pod.workload} names {host}:{port} but may not reach it"
                )


def _pod(network: Network, component: str) -> Pod:
    (pod,) = [p for p in network.pods if p.labels["app.kubernetes.io/component"] == component]
    return pod


def test_components_reach_nothing_they_do_not_need(render_set: Any) -> None:
    network = Network(render_set("defaults"))
    triton, mlflow = "spanmill-triton.spanmill.svc", "spanmill-mlflow.spanmill.svc"
    collector, gateway = _pod(network, "collector"), _pod(network, "gateway")
    triton_pod, rollout = _pod(network, "triton"), _pod(network, "rollout")
    # What each needs ...
    assert network.may_reach(gateway, triton, 8000)
    assert network.may_reach(rollout, mlflow, 5000)
    assert network.may_reach(rollout, triton, 8000)
    assert network.may_reach(rollout, "kubernetes.default.svc", 443)
    # ... and nothing else: the collector has no business with Triton or MLflow, Triton
    # none with Kafka or the Kubernetes API, the gateway none with MLflow.
    assert not network.may_reach(collector, triton, 8000)
    assert not network.may_reach(collector, mlflow, 5000)
    assert not network.may_reach(gateway, mlflow, 5000)
    assert not network.may_reach(triton_pod, "spanmill-kafka-bootstrap.kafka.svc", 9092)
    assert not network.may_reach(triton_pod, "kubernetes.default.svc", 443)
    assert not network.may_reach(collector, "kubernetes.default.svc", 443)
    # The store upkeep job: the object store alone.
    upkeep = _pod(network, "store-upkeep")
    assert not network.may_reach(upkeep, "spanmill-kafka-bootstrap.kafka.svc", 9092)
    assert not network.may_reach(upkeep, mlflow, 5000)
    assert not network.may_reach(upkeep, triton, 8000)
    assert not network.may_reach(upkeep, "kubernetes.default.svc", 443)
    # The model hub, for a base model named by its id: Triton loads its weights, the
    # gateway its tokenizer; the upkeep job and the collector have no use for it.
    hub = "huggingface.co"
    assert network.may_reach(triton_pod, hub, 443) and network.may_reach(gateway, hub, 443)
    assert not network.may_reach(upkeep, hub, 443)
    assert not network.may_reach(collector, hub, 443)


def test_the_default_deny_spares_strimzis_pods(render_set: Any) -> None:
    rendered = render_set("all-features")
    (deny,) = [p for p in rendered.kinds("NetworkPolicy")
               if p["metadata"]["name"].endswith("-default-deny")]  # fmt: skip
    assert deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in deny["spec"] and "egress" not in deny["spec"]
    kafka = rendered.get("Kafka", "spanmill")["metadata"]["labels"]
    assert not selects(deny["spec"]["podSelector"], kafka)
    # The components reach the chart's brokers on their listeners, by Strimzi's labels.
    network = Network(rendered)
    assert network.may_reach(_pod(network, "collector"), "spanmill-kafka-bootstrap.spanmill.svc",
                             9093)  # fmt: skip
    assert not network.may_reach(_pod(network, "rollout"), "spanmill-kafka-bootstrap.spanmill.svc",
                                 9093)  # fmt: skip


def test_the_upload_job_reaches_kubeflow_wherever_the_runs_are(helm: Any) -> None:
    """Multi-user Kubeflow runs pipelines in a profile's namespace (networkPolicy.pipelineRuns
    names it), while its Pipelines API stays in Kubeflow's own: the upload Job's egress
    followed the runs, so the post-install hook could not reach the API and failed."""
    from helm_render import CHART, parse, template

    result = template(
        helm,
        [CHART / "ci" / "kubeflow-multi-user.yaml"],
        ["--set", "networkPolicy.pipelineRuns[0].namespaceSelector.matchLabels.team=a"],
    )
    assert result.returncode == 0, result.output
    rendered = parse("profile-runs", result.stdout)
    (policy,) = [p for p in rendered.kinds("NetworkPolicy")
                 if p["metadata"]["name"].endswith("-pipeline-upload")]  # fmt: skip
    api = [rule for rule in policy["spec"]["egress"] if {"port": 8888, "protocol": "TCP"}
           in rule.get("ports", [])]  # fmt: skip
    assert api and api[0]["to"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kubeflow"}}}
    ]


def test_trainjob_nodes_in_the_release_namespace_have_a_policy_of_their_own(helm: Any) -> None:
    """With pipelineSettings.namespace empty (the release's), the TrainJob's nodes fall
    under the release's default-deny: without a policy of their own, no DNS, no object
    store, no MLflow, no rendezvous between the nodes."""
    from helm_render import CHART, parse, template

    def rendered(namespace: str) -> Rendered:
        result = template(helm, [CHART / "ci" / "trainer.yaml"],
                          ["--set", f"pipelineSettings.namespace={namespace}"])  # fmt: skip
        assert result.returncode == 0, result.output
        return parse(f"trainer-{namespace}", result.stdout)

    here = rendered("")
    runtime = here.get("TrainingRuntime", "spanmill-train")
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    labels = node["template"]["metadata"]["labels"]
    network = Network(here)
    selecting = [p for p in network.policies if selects(p["spec"]["podSelector"], labels)]
    names = {p["metadata"]["name"] for p in selecting}
    assert names == {"spanmill-default-deny", "spanmill-train"}
    (own,) = [p for p in selecting if p["metadata"]["name"] == "spanmill-train"]
    node_peers = [r for r in own["spec"]["egress"] if "ports" not in r]
    assert node_peers and selects(node_peers[0]["to"][0]["podSelector"], labels)
    assert selects(own["spec"]["ingress"][0]["from"][0]["podSelector"], labels)
    assert any({"port": 53, "protocol": "UDP"} in r.get("ports", []) for r in own["spec"]["egress"])
    mlflow = here.get("NetworkPolicy", "spanmill-mlflow")["spec"]["ingress"][0]["from"]
    assert any(selects(peer.get("podSelector", {"matchLabels": {"x": "y"}}), labels)
               for peer in mlflow if "namespaceSelector" not in peer)  # fmt: skip
    # Runs elsewhere: the release's policies do not reach them, and add none there.
    assert rendered("kubeflow").find("NetworkPolicy", "spanmill-train") is None
