"""The images, checked statically (no Docker engine here): pinned bases, several stages,
a non-root user, and only the extra each service needs, torch kept out of the services.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helm_render import ROOT, Rendered
from packaging.requirements import Requirement
from packaging.version import Version

SERVICES = ("collector", "gateway", "rollout")
ALL_IMAGES = (*SERVICES, "pipeline", "mlflow")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# An exact release tag (3.11.11-slim-bookworm, 24.10-vllm-python-py3) or a digest.
PINNED = re.compile(r"(@sha256:[0-9a-f]{64}$)|(:\d+\.\d+(\.\d+)?-[\w.-]+$)|(:\d+\.\d+\.\d+$)")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str]
    stages: list[Stage]

    def args_default(self, text: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: self.global_args.get(m[1], m[0]), text)

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def runs(self) -> list[str]:
        return [arg for stage in self.stages for op, arg in stage.instructions if op == "RUN"]


def parse_dockerfile(path: Path) -> Dockerfile:
    """Instructions with continuations joined and comments dropped."""
    logical: list[str] = []
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, arg = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            words = arg.split()
            base = next(w for w in words if not w.startswith("--"))
            name = words[words.index("AS") + 1] if "AS" in words else None
            stages.append(Stage(base, name))
        elif op == "ARG" and not stages:
            key, _, default = arg.partition("=")
            global_args[key] = default
        else:
            assert stages, f"{path}: {op} before FROM"
            stages[-1].instructions.append((op, arg))
    return Dockerfile(path, global_args, stages)


def dockerfile(name: str) -> Dockerfile:
    return parse_dockerfile(ROOT / "services" / name / "Dockerfile")


def extra_requirements(extra: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """Names of every distribution an extra pulls from pyproject, following spanmill[...]."""
    names: set[str] = set()
    for line in PYPROJECT["project"]["optional-dependencies"][extra]:
        requirement = Requirement(line)
        if requirement.name == "spanmill":
            for inner in requirement.extras - seen:
                names |= extra_requirements(inner, seen | {extra})
        else:
            names.add(requirement.name.lower())
    return names | {Requirement(r).name.lower() for r in PYPROJECT["project"]["dependencies"]}


@pytest.mark.parametrize("name", ALL_IMAGES)
def test_bases_are_pinned_and_stages_are_several(name: str) -> None:
    image = dockerfile(name)
    assert len(image.stages) >= 2, f"{name}: not multi-stage"
    stage_names = {s.name for s in image.stages if s.name}
    external = [image.args_default(s.base) for s in image.stages if s.base not in stage_names]
    assert external, name
    for base in external:
        assert "$" not in base, f"{name}: {base} has no default"
        assert PINNED.search(base), f"{name}: base image {base} is not an exact tag or digest"
    # The final stage copies what the build stage made, not the build tools.
    copies = [arg for op, arg in image.final.instructions if op == "COPY"]
    assert any(arg.startswith("--from=build") for arg in copies), name


@pytest.mark.parametrize("name", ALL_IMAGES)
def test_images_run_as_a_non_root_user(name: str) -> None:
    image = dockerfile(name)
    users = [arg for op, arg in image.final.instructions if op == "USER"]
    assert users, f"{name}: no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) > 0, f"{name}: USER {users[-1]} (numeric, non-zero)"
    # The chart's pods run as the same UID.
    assert int(user) == 10001
    env = " ".join(arg for op, arg in image.final.instructions if op == "ENV")
    assert "HOME=/tmp" in env, f"{name}: HOME must be writable under a read-only root"


def _pip_installs(image: Dockerfile) -> list[str]:
    return [r for r in image.runs() if "pip install" in r]


@pytest.mark.parametrize("name", SERVICES)
def test_service_images_install_only_their_extra_and_no_torch(name: str) -> None:
    image = dockerfile(name)
    installs = _pip_installs(image)
    assert len(installs) == 1, f"{name}: one pip install of the package"
    extras = re.findall(r"\.\[([\w,-]+)\]", installs[0])
    assert extras == [name], f"{name}: installs .[{','.join(extras)}]"
    text = "\n".join(arg for stage in image.stages for _, arg in stage.instructions)
    assert "torch" not in text.lower(), f"{name}: torch in the image"
    assert "torch" not in extra_requirements(name), f"{name}: the extra pulls torch"


def test_the_collector_and_gateway_extras_stay_light() -> None:
    for extra in ("collector", "gateway"):
        heavy = extra_requirements(extra) & {"torch", "transformers", "peft", "trl", "mlflow"}
        assert heavy == set(), f"spanmill[{extra}] pulls {heavy}"


@pytest.mark.parametrize("name", SERVICES)
def test_service_images_start_what_the_chart_runs(name: str, render_set: Any) -> None:
    image = dockerfile(name)
    final = dict(image.final.instructions)
    defaults: Rendered = render_set("defaults")
    container = defaults.container(f"spanmill-{name}")
    assert json.loads(final["ENTRYPOINT"]) == container["command"]
    assert json.loads(final["CMD"]) == container["args"]
    assert container["image"].startswith(f"ghcr.io/spanmill/{name}:")


def test_pipeline_image_has_torch_pinned_cpu_by_default_and_the_training_stack() -> None:
    image = dockerfile("pipeline")
    assert image.global_args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    installs = _pip_installs(image)
    torch = [r for r in installs if "torch==" in r]
    assert len(torch) == 1 and "torch==2.13.0" in torch[0] and "--index-url" in torch[0]
    assert installs.index(torch[0]) < len(installs) - 1, "torch goes in before the package"
    extras = set(image.args_default("${EXTRAS}").split(","))
    assert {"train", "pipelines"} <= extras
    needed = set().union(*(extra_requirements(e) for e in extras))
    assert {"torch", "transformers", "peft", "trl", "kfp"} <= needed
    # The GPU build is documented: a CUDA base and the CUDA wheel index as build args.
    text = image.path.read_text()
    assert "--build-arg BASE_IMAGE=nvcr.io/nvidia/cuda:" in text
    assert "--build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu" in text


def test_pipeline_image_carries_the_pipeline_the_upload_job_reads(chart_values: Any) -> None:
    image = dockerfile("pipeline")
    copies = [arg.split() for op, arg in image.final.instructions if op == "COPY"]
    assert ["pipelines/flywheel.yaml", chart_values["pipelineUpload"]["file"]] in copies


def test_pipeline_image_installs_the_task_plugins_its_entry_points_name() -> None:
    # The evaluate step finds an agent's task by entry point; the package must be there.
    image = dockerfile("pipeline")
    sources = [
        Path(arg.split()[0])
        for stage in image.stages
        for op, arg in stage.instructions
        if op == "COPY" and not arg.startswith("--from")
    ]
    where = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]
    for value in PYPROJECT["project"]["entry-points"]["spanmill.tasks"].values():
        package = value.split(":")[0].split(".")[0]
        (folder,) = [Path(w) / package for w in where if (ROOT / w / package).is_dir()]
        assert any(folder == s or s in folder.parents for s in sources), f"no COPY of {folder}"


def test_mlflow_image_matches_the_mlflow_spanmill_uses() -> None:
    install = _pip_installs(dockerfile("mlflow"))[0]
    pinned = re.search(r'"mlflow==([\d.]+)"', install)
    assert pinned, "mlflow is pinned exactly"
    wanted = next(
        Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["rollout"]
        if r.startswith("mlflow")
    )  # fmt: skip
    assert Version(pinned[1]) in wanted.specifier
    assert "boto3" in install and "psycopg2-binary" in install


def test_build_context_leaves_out_the_venv_and_caches() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".cache"} <= ignored
    for name in ALL_IMAGES:
        for stage in dockerfile(name).stages:
            for op, arg in stage.instructions:
                if op == "COPY" and not arg.startswith("--from"):
                    source = arg.split()[0]
                    assert source.split("/")[0] not in ignored, f"{name}: COPY {source}"
