"""Vendor the schema of one custom resource from its CRD, for validate_manifests.py.

``python infra/charts/vendor_crd_schema.py CRD.yaml --version v1alpha1 --source "..."``
writes ``crds/<group>_<plural>.<version>.json``: the version's openAPIV3Schema with
every description removed (they make up most of a CRD and validate nothing), keys
sorted, and the CRD's group, kind and version, and where it came from, beside it.
crds/README.md lists what is vendored and from which release.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).resolve().parent / "crds"


def without_descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {
            key: without_descriptions(value)
            for key, value in schema.items()
            if not (key == "description" and isinstance(value, str))
        }
    if isinstance(schema, list):
        return [without_descriptions(value) for value in schema]
    return schema


def vendor(crd_path: Path, version: str, source: str) -> Path:
    crd = yaml.safe_load(crd_path.read_text())
    if crd.get("kind") != "CustomResourceDefinition":
        raise SystemExit(f"{crd_path} is not a CustomResourceDefinition")
    spec = crd["spec"]
    versions = {v["name"]: v for v in spec["versions"]}
    if version not in versions:
        raise SystemExit(f"{crd_path} has versions {sorted(versions)}, not {version}")
    document = {
        "group": spec["group"],
        "kind": spec["names"]["kind"],
        "version": version,
        "source": source,
        "schema": without_descriptions(versions[version]["schema"]["openAPIV3Schema"]),
    }
    out = CRDS / f"{spec['group']}_{spec['names']['plural']}.{version}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crd", type=Path, help="The CRD manifest (YAML).")
    parser.add_argument("--version", required=True, help="The served version to vendor.")
    parser.add_argument("--source", required=True, help="Project, release and file it came from.")
    args = parser.parse_args(argv)
    print(vendor(args.crd, args.version, args.source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
