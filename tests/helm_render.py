"""Rendering the spanmill chart with the real helm binary, and lookups over the result."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "spanmill"
VALUE_SETS = sorted(p.stem for p in (CHART / "ci").glob("*.yaml"))
KUBE_VERSION = "1.30.0"
RELEASE = "spanmill"
NAMESPACE = "spanmill"


@dataclass
class HelmResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@dataclass
class Rendered:
    """The documents of one ``helm template``, with lookups the tests share."""

    name: str
    documents: list[dict[str, Any]]

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.documents if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.kinds(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.name}: expected one {kind}/{name}, found {len(found)}"
        return found[0]

    def find(self, kind: str, name: str) -> dict[str, Any] | None:
        found = [d for d in self.kinds(kind) if d["metadata"]["name"] == name]
        return found[0] if found else None

    def pod_specs(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(workload name, pod spec) of every Deployment, StatefulSet, DaemonSet, Job and
        CronJob, and of every replicated job of a Kubeflow Trainer TrainingRuntime."""
        for document in self.documents:
            name = f"{document['kind']}/{document['metadata']['name']}"
            if document["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
                yield name, document["spec"]["template"]["spec"]
            elif document["kind"] == "CronJob":
                yield name, document["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            elif document["kind"] == "TrainingRuntime":
                for job in document["spec"]["template"]["spec"]["replicatedJobs"]:
                    yield name, job["template"]["spec"]["template"]["spec"]

    def containers(self) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
        """(workload/container, container, pod spec) of every container, init ones included."""
        for name, spec in self.pod_specs():
            for container in spec.get("initContainers", []) + spec["containers"]:
                yield f"{name}/{container['name']}", container, spec

    def container(self, deployment: str, name: str | None = None) -> dict[str, Any]:
        """The container ``name`` of a Deployment's pod; by default its own, the first (a
        container beside it, such as a serving Triton's readiness, comes after)."""
        containers = self.get("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
        found: list[dict[str, Any]] = [c for c in containers if name in (None, c["name"])]
        assert found, f"{deployment} has no container {name}"
        return found[0]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Name -> env entry of a container."""
    return {entry["name"]: entry for entry in container.get("env", [])}


def run_helm(helm: Path, *args: str) -> HelmResult:
    result = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=120, check=False
    )
    return HelmResult(result.returncode, result.stdout, result.stderr)


def template(helm: Path, values: Sequence[Path] = (), extra: Sequence[str] = ()) -> HelmResult:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", KUBE_VERSION]
    for path in values:
        args += ["-f", str(path)]
    return run_helm(helm, *args, *extra)


def lint(helm: Path, values: Sequence[Path] = ()) -> HelmResult:
    args = ["lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART)]
    for path in values:
        args += ["-f", str(path)]
    return run_helm(helm, *args)


def parse(name: str, text: str) -> Rendered:
    documents = [d for d in yaml.safe_load_all(text) if d]
    return Rendered(name, documents)


def merged_values(name: str) -> dict[str, Any]:
    """values.yaml with a ci/ value set laid over it, as helm merges them (maps deep)."""

    def merge(base: Any, over: Any) -> Any:
        if isinstance(base, dict) and isinstance(over, dict):
            out = dict(base)
            for key, value in over.items():
                out[key] = merge(base.get(key), value) if key in base else value
            return out
        return over

    base = yaml.safe_load((CHART / "values.yaml").read_text())
    over = yaml.safe_load((CHART / "ci" / f"{name}.yaml").read_text()) or {}
    return dict(merge(base, over))


@functools.cache
def manifest_validator() -> ModuleType:
    """infra/charts/validate_manifests.py, the strict schema check `make charts` runs."""
    path = ROOT / "infra" / "charts" / "validate_manifests.py"
    spec = importlib.util.spec_from_file_location("validate_manifests", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _helm_candidates() -> list[Path]:
    candidates = []
    home = os.environ.get("SPANMILL_HOME", "").strip()
    if home:
        candidates.append(Path(home).expanduser() / "bin" / "helm")
    candidates.append(ROOT / ".cache" / "spanmill" / "bin" / "helm")
    return candidates


def helm_binary() -> Path:
    """helm from $SPANMILL_HOME/bin or .cache/spanmill/bin (make install); fetched if absent."""
    for candidate in _helm_candidates():
        if os.access(candidate, os.X_OK):
            return candidate
    target = _helm_candidates()[0]
    subprocess.run(
        [str(ROOT / "infra" / "local" / "fetch-helm.sh"), str(target.parent)],
        env={**os.environ, "PYTHON": sys.executable},
        check=True,
        timeout=600,
    )
    assert os.access(target, os.X_OK), f"fetch-helm.sh did not produce {target}"
    return target
