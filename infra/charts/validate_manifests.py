"""Validate rendered Helm output against the Kubernetes API schemas, offline and strict.

``python infra/charts/validate_manifests.py --kube-version 1.30.0 FILE...`` checks every
document of every file with kubernetes-validate in strict mode (unknown fields are
errors). Custom resources have no schema there: those in :data:`CRD_SCHEMAS` are
checked as strictly against their CRD's schema, vendored under crds/ (crds/README.md);
the kinds in :data:`CUSTOM_KINDS` are skipped by name and reported, and any other kind
without a schema is an error, so a typo in apiVersion or kind cannot slip through as
"no schema".
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

# Custom resources the spanmill chart renders, whose CRDs kubernetes-validate lacks.
CUSTOM_KINDS: frozenset[tuple[str, str]] = frozenset(
    {
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
    }
)


CRDS = Path(__file__).resolve().parent / "crds"
# Custom resources checked against their CRD's schema, vendored by vendor_crd_schema.py.
CRD_SCHEMAS: dict[tuple[str, str], str] = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.v1alpha1.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): (
        "trainer.kubeflow.org_trainingruntimes.v1alpha1.json"
    ),
    ("kafka.strimzi.io/v1beta2", "Kafka"): "kafka.strimzi.io_kafkas.v1beta2.json",
    ("kafka.strimzi.io/v1beta2", "KafkaNodePool"): "kafka.strimzi.io_kafkanodepools.v1beta2.json",
    ("kafka.strimzi.io/v1beta2", "KafkaTopic"): "kafka.strimzi.io_kafkatopics.v1beta2.json",
    ("kafka.strimzi.io/v1beta2", "KafkaUser"): "kafka.strimzi.io_kafkausers.v1beta2.json",
}
# The API server's checks of every object's metadata that a CRD schema leaves out.
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
OBJECT_META: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": _DNS_SUBDOMAIN},
        "namespace": {"type": "string", "maxLength": 63, "pattern": _DNS_SUBDOMAIN},
        "labels": _STRINGS,
        "annotations": _STRINGS,
    },
}


def _closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to other keys."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    """A strict validator of ``kind`` from its vendored CRD schema."""
    vendored = json.loads((CRDS / CRD_SCHEMAS[(api_version, kind)]).read_text())
    schema = copy.deepcopy(vendored["schema"])
    schema["properties"]["metadata"] = OBJECT_META
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    schema = _closed(schema)
    validator_class = jsonschema.validators.validator_for(schema, jsonschema.Draft7Validator)
    return validator_class(schema)  # type: ignore[no-any-return]


def crd_errors(document: dict[str, Any]) -> list[str]:
    """Where ``document`` breaks its CRD's schema, one line each; [] when it conforms."""
    validator = crd_validator(str(document.get("apiVersion")), str(document.get("kind")))
    found = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.path)))
    return [f"{'.'.join(str(p) for p in e.path) or '(top)'}: {e.message}" for e in found]


@dataclass
class Report:
    validated: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def documents(path: Path) -> Iterator[dict[str, Any]]:
    for document in yaml.safe_load_all(path.read_text()):
        if document:
            yield document


def validate_document(
    document: dict[str, Any], kube_version: str, report: Report, where: str
) -> None:
    kind = str(document.get("kind", ""))
    api_version = str(document.get("apiVersion", ""))
    name = (document.get("metadata") or {}).get("name", "?")
    label = f"{where}: {kind}/{name} ({api_version})"
    if (api_version, kind) in CRD_SCHEMAS:
        errors = crd_errors(document)
        report.errors.extend(f"{label}: {error}" for error in errors)
        if not errors:
            report.validated[kind] += 1
        return
    if (api_version, kind) in CUSTOM_KINDS:
        if not name or name == "?" or "spec" not in document:
            report.errors.append(f"{label}: a custom resource needs metadata.name and spec")
        report.skipped[kind] += 1
        return
    try:
        kubernetes_validate.validate(document, kube_version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        report.errors.append(
            f"{label}: no Kubernetes {kube_version} schema for this kind; fix apiVersion/kind, "
            f"or add it to CUSTOM_KINDS in {Path(__file__).name} if it is a custom resource"
        )
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path) or "(top)"
        report.errors.append(f"{label}: {path}: {exc.message}")
    else:
        report.validated[kind] += 1


def validate_files(paths: Iterable[Path], kube_version: str) -> Report:
    report = Report()
    for path in paths:
        for document in documents(path):
            validate_document(document, kube_version, report, path.name)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kube-version", default="1.30.0")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    report = validate_files(args.files, args.kube_version)
    validated = ", ".join(f"{n} {k}" for k, n in sorted(report.validated.items()))
    print(f"kubernetes-validate --strict {args.kube_version} and vendored CRDs: {validated}")
    if report.skipped:
        skipped = ", ".join(f"{n} {k}" for k, n in sorted(report.skipped.items()))
        print(f"skipped custom resources without a schema: {skipped}")
    for error in report.errors:
        print(f"error: {error}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
