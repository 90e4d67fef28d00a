"""The images, checked statically (no Docker engine here): every Dockerfile under
services/ has pinned bases, several stages and a non-root user, and installs exactly
the spanmill extras that its entry points import, read from the code
(tests/charts/entry_imports.py): each third-party module an entry point can reach
comes with the image, and no extra is there that none needs. torch stays out of every
image but training, the pipeline's steps and Triton.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from entry_imports import ImportGraph
from helm_render import ROOT, Rendered
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

SERVICES = ("collector", "gateway", "rollout")
ALL_IMAGES = tuple(sorted(p.parent.name for p in (ROOT / "services").glob("*/Dockerfile")))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# An exact release tag (3.11.11-slim-bookworm, 25.01-vllm-python-py3) or a digest.
PINNED = re.compile(r"(@sha256:[0-9a-f]{64}$)|(:\d+\.\d+(\.\d+)?-[\w.-]+$)|(:\d+\.\d+\.\d+$)")
# Images with torch: training, the pipeline's steps (the evaluation's transformers
# tracking needs spanmill[train]) and Triton's Python backend.
TORCH_IMAGES = {"train", "pipeline", "triton"}


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

    def env(self) -> str:
        return " ".join(arg for op, arg in self.final.instructions if op == "ENV")

    def copy_sources(self) -> list[str]:
        """What the build context gives every COPY (flags such as --chmod left out)."""
        sources = []
        for stage in self.stages:
            for op, arg in stage.instructions:
                words = arg.split()
                if op == "COPY" and not any(w.startswith("--from") for w in words):
                    sources += [w for w in words if not w.startswith("--")][:-1]
        return sources


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
    return {r.name.lower() for r in _spanmill_requirements({extra}, seen)}


def _spanmill_requirements(extras: set[str], seen: frozenset[str] = frozenset()) -> set[Any]:
    """The requirements ``spanmill[extras]`` declares, spanmill[...] followed, core included."""
    found = {Requirement(r) for r in PYPROJECT["project"]["dependencies"]}
    for extra in extras:
        for line in PYPROJECT["project"]["optional-dependencies"][extra]:
            requirement = Requirement(line)
            if requirement.name == "spanmill":
                found |= _spanmill_requirements(requirement.extras - seen, seen | {extra})
            else:
                found.add(requirement)
    return found


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
    assert "HOME=/tmp" in image.env(), f"{name}: HOME must be writable under a read-only root"


def _pip_installs(image: Dockerfile) -> list[str]:
    return [r for r in image.runs() if "pip install" in r]


def _installed_extras(image: Dockerfile) -> set[str]:
    """The extras of the image's one install of the package (``.[a,b]``)."""
    found = [
        image.args_default(m[1])
        for install in _pip_installs(image)
        for m in re.finditer(r"\.\[([\w,${}-]+)\]", install)
    ]
    assert len(found) == 1, f"{image.path}: one pip install of the package, found {found}"
    return set(found[0].split(","))


# -- what each image's entry points import ------------------------------------------

GRAPH = ImportGraph(
    [ROOT / "src", ROOT, ROOT / "examples"], {"spanmill", "components", "spanmill_examples"}
)
# Every `spanmill <command>` loads the CLI first.
CLI = "spanmill.cli.main"
# What runs in each image besides the flywheel's components (which follow from their
# base_image, below): the commands the chart and the Dockerfiles start, the processes a
# step starts, the plugins found by entry point.
ENTRY_POINTS: dict[str, list[str]] = {
    # The collector, and the chart's store upkeep CronJob (`spanmill store compact`).
    "collector": [CLI, "spanmill.cli.collector:collector", "spanmill.cli.store:compact"],
    "gateway": [CLI, "spanmill.cli.gateway:gateway"],
    # The controller, and the chart's MLflow users Job (`spanmill models users`).
    "rollout": [CLI, "spanmill.cli.rollout:rollout", "spanmill.cli.models:users"],
    # The chart's pipeline-upload Job; evaluate finds tasks and evaluators by entry point.
    "pipeline": [
        CLI,
        "spanmill.cli.pipeline:upload",
        *PYPROJECT["project"]["entry-points"]["spanmill.tasks"].values(),
        *PYPROJECT["project"]["entry-points"]["spanmill.evaluators"].values(),
    ],
    # What the training step starts: torchrun's workers (spanmill.train.launch) and,
    # with the Kubeflow Trainer, the TrainJob's nodes (spanmill.train.trainjob).
    "train": ["spanmill.train.worker", "spanmill.train.trainjob"],
    # The model.py of every version: Triton's Python backend makes a TritonPythonModel.
    "triton": ["spanmill.serving.triton_model:TritonPythonModel"],
}
# Modules the base image brings, not a Python distribution.
FROM_BASE = {"triton": {"triton_python_backend_utils"}}


def _component_images() -> dict[str, list[str]]:
    """Image name -> the components whose @dsl.component(base_image=...) names it.

    components/__init__.py defines each image constant as
    ``os.environ.get(VAR, "spanmill/<image>:<tag>")``.
    """
    init = ast.parse((ROOT / "components" / "__init__.py").read_text())
    constants = {}
    for node in init.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            default = node.value.args[1]
            assert isinstance(default, ast.Constant), ast.unparse(node)
            image = str(default.value).split("/")[-1].split(":")[0]
            constants[ast.unparse(node.targets[0])] = image
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "components").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and ast.unparse(decorator.func) == "dsl.component"
                ):
                    (base,) = [k.value for k in decorator.keywords if k.arg == "base_image"]
                    image = constants[ast.unparse(base)]
                    found.setdefault(image, []).append(f"components.{path.stem}:{node.name}")
    return found


def entry_points(image: str) -> list[str]:
    return [*ENTRY_POINTS.get(image, []), *_component_images().get(image, [])]


@functools.cache
def _distribution_requirements(name: str, extras: frozenset[str]) -> set[tuple[str, frozenset]]:
    """(name, extras) of what an installed distribution requires, with those extras."""
    try:
        lines = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return set()
    found = set()
    for line in lines:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker and not any(marker.evaluate({"extra": e}) for e in {"", *extras}):
            continue
        found.add((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return found


@functools.cache
def installed_by(extras: frozenset[str]) -> frozenset[str]:
    """Every distribution ``pip install .[extras]`` brings, read from this venv's metadata."""
    todo = [
        (canonicalize_name(r.name), frozenset(r.extras))
        for r in _spanmill_requirements(set(extras))
    ]
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        item = todo.pop()
        if item not in seen:
            seen.add(item)
            todo.extend(_distribution_requirements(*item))
    return frozenset(name for name, _ in seen)


DISTRIBUTIONS = {
    top: {canonicalize_name(d) for d in dists}
    for top, dists in importlib.metadata.packages_distributions().items()
}


def _needs(image: str) -> dict[str, str]:
    needed = GRAPH.third_party(entry_points(image))
    return {top: why for top, why in needed.items() if top not in FROM_BASE.get(image, set())}


SPANMILL_IMAGES = tuple(name for name in ALL_IMAGES if name in ENTRY_POINTS)


def test_every_image_that_installs_spanmill_has_its_entry_points_named() -> None:
    installing = {n for n in ALL_IMAGES if re.search(r"\.\[", " ".join(dockerfile(n).runs()))}
    assert installing == set(SPANMILL_IMAGES)
    assert set(_component_images()) <= set(SPANMILL_IMAGES), _component_images()


@pytest.mark.parametrize("name", SPANMILL_IMAGES)
def test_images_install_exactly_the_extras_their_entry_points_import(name: str) -> None:
    extras = frozenset(_installed_extras(dockerfile(name)))
    needed = _needs(name)
    assert needed, f"{name}: its entry points import nothing?"
    provided = installed_by(extras)
    for top, why in sorted(needed.items()):
        dists = DISTRIBUTIONS.get(top)
        assert dists, f"{name}: {why} imports {top}, which no distribution installed here has"
        assert dists & provided, (
            f"{name}: {why} imports {top}; .[{','.join(sorted(extras))}] lacks it"
        )
    # Nothing beyond: without any one of the extras, something needed would be missing.
    for extra in extras:
        rest = installed_by(extras - {extra})
        lost = sorted(top for top in needed if not DISTRIBUTIONS[top] & rest)
        assert lost, f"{name}: spanmill[{extra}] brings nothing its entry points import"


@pytest.mark.parametrize("name", SPANMILL_IMAGES)
def test_torch_only_where_a_model_is_trained_or_run(name: str) -> None:
    image = dockerfile(name)
    extras = _installed_extras(image)
    has_torch = "torch" in installed_by(frozenset(extras))
    if name in TORCH_IMAGES:
        # Pinned, to one version, wherever it is named: the extras and the installs.
        pins = {str(r.specifier) for r in _spanmill_requirements(extras) if r.name == "torch"}
        pins |= set(re.findall(r"torch(==[\d.]+)", " ".join(_pip_installs(image))))
        assert has_torch and pins == {"==2.13.0"}, f"{name}: torch {pins}"
        return
    assert not has_torch, f"{name}: the extras pull torch"
    text = "\n".join(arg for stage in image.stages for _, arg in stage.instructions)
    assert "torch" not in text.lower(), f"{name}: torch in the image"


def test_the_entry_point_walk_sees_lazy_imports_only_where_they_run() -> None:
    # A check of the checker: the controller writes Python-backend versions (which import
    # torch when Triton loads them) but never loads one itself.
    assert "torch" not in _needs("rollout")
    assert {"torch", "transformers", "peft"} <= set(_needs("triton"))
    assert {"torch", "trl", "peft", "kfp"} <= set(_needs("train"))
    assert "kafka" in _needs("collector") and "kafka" not in _needs("pipeline")


def test_the_collector_and_gateway_extras_stay_light() -> None:
    heavy = {"torch", "transformers", "peft", "trl", "mlflow"}
    assert extra_requirements("collector") & heavy == set()
    # The gateway renders vLLM prompts with transformers' tokenizers, never a model.
    assert extra_requirements("gateway") & heavy == {"transformers"}
    assert "torch" not in _needs("gateway")


@pytest.mark.parametrize("name", SERVICES)
def test_service_images_start_what_the_chart_runs(name: str, render_set: Any) -> None:
    image = dockerfile(name)
    final = dict(image.final.instructions)
    defaults: Rendered = render_set("defaults")
    container = defaults.container(f"spanmill-{name}")
    assert json.loads(final["ENTRYPOINT"]) == container["command"]
    assert json.loads(final["CMD"]) == container["args"]
    assert container["image"].startswith(f"ghcr.io/spanmill/{name}:")


def _torch_index(image: Dockerfile) -> str:
    return image.global_args["TORCH_INDEX_URL"]


def test_pipeline_image_has_torch_pinned_from_the_cpu_index() -> None:
    image = dockerfile("pipeline")
    assert _torch_index(image) == "https://download.pytorch.org/whl/cpu"
    installs = _pip_installs(image)
    torch = [r for r in installs if "torch==" in r]
    assert len(torch) == 1 and "torch==2.13.0" in torch[0] and "--index-url" in torch[0]
    assert installs.index(torch[0]) < len(installs) - 1, "torch goes in before the package"


def test_train_image_is_cuda_with_the_matching_torch_build() -> None:
    image = dockerfile("train")
    base = image.args_default(image.stages[0].base)
    cuda = re.fullmatch(r"nvcr\.io/nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-runtime-ubuntu[\d.]+", base)
    assert cuda, f"train: {base} is not a CUDA runtime image with cuDNN"
    # torch's CUDA build matches the base's CUDA release (12.8.x: cu128).
    index = _torch_index(image)
    assert index == f"https://download.pytorch.org/whl/cu{cuda[1]}{cuda[2]}"
    (install,) = [r for r in _pip_installs(image) if "torch==2.13.0" in r]
    assert "${TORCH_INDEX_URL}" in install and '".[train,pipelines,gateway,agent]"' in install
    # Triton's Python backend runs the same torch build.
    assert _torch_index(dockerfile("triton")) == index
    # One way to the CUDA image: no other Dockerfile builds on CUDA or its torch.
    for name in ALL_IMAGES:
        if name != "train":
            text = dockerfile(name).path.read_text()
            assert "nvidia/cuda" not in text and "/whl/cu1" not in text.replace(index, ""), name


def test_triton_image_adds_spanmill_serving_to_nvidias_python_backend() -> None:
    image = dockerfile("triton")
    base = image.args_default(image.stages[0].base)
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d{2}\.\d{2}-[\w-]*py3", base), base
    (install,) = _pip_installs(image)
    target = re.search(r"--target (\S+)", install)
    assert target, "installed beside Triton's own packages"
    # The backend's stub (the image's python3) finds spanmill there.
    assert f"PYTHONPATH={target[1]}" in image.env()
    assert re.search(r"import spanmill\.serving\.generation", install), "a smoke import"


def _kfp_in_pipeline() -> str:
    found = re.search(r"'kfp==([\d.]+)'", (ROOT / "pipelines" / "flywheel.yaml").read_text())
    assert found, "the compiled pipeline installs kfp at each step's start"
    return found[1]


@pytest.mark.parametrize("name", sorted(_component_images()))
def test_images_of_components_hold_the_kfp_the_pipeline_installs(name: str) -> None:
    # Each step runs `pip install kfp==X` first: it must find X installed, the venv
    # being read-only to the step's user. constraints.txt pins it, as compiled.
    locked = re.search(r"^kfp==([\d.]+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert locked and locked[1] == _kfp_in_pipeline()
    image = dockerfile(name)
    (install,) = [r for r in _pip_installs(image) if re.search(r"\.\[", r)]
    assert re.search(r"-c \S*constraints\.txt", install), f"{name}: install without constraints"
    assert "constraints.txt" in image.copy_sources()


def test_pipeline_image_carries_the_pipeline_the_upload_job_reads(chart_values: Any) -> None:
    image = dockerfile("pipeline")
    copies = [arg.split() for op, arg in image.final.instructions if op == "COPY"]
    assert ["pipelines/flywheel.yaml", chart_values["pipelineUpload"]["file"]] in copies


def test_pipeline_image_installs_the_task_plugins_its_entry_points_name() -> None:
    # The evaluate step finds an agent's task by entry point; the package must be there.
    sources = [Path(s) for s in dockerfile("pipeline").copy_sources()]
    where = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]
    for value in PYPROJECT["project"]["entry-points"]["spanmill.tasks"].values():
        package = value.split(":")[0].split(".")[0]
        (folder,) = [Path(w) / package for w in where if (ROOT / w / package).is_dir()]
        assert any(folder == s or s in folder.parents for s in sources), f"no COPY of {folder}"


def test_mlflow_image_matches_the_mlflow_spanmill_uses_and_runs_basic_auth() -> None:
    image = dockerfile("mlflow")
    install = _pip_installs(image)[0]
    pinned = re.search(r'"(mlflow(\[[\w,]+\])?==[\d.]+)"', install)
    assert pinned, "mlflow is pinned exactly"
    requirement = Requirement(pinned[1])
    # The chart runs `mlflow server --app-name basic-auth`, which needs the [auth] extra.
    assert "auth" in requirement.extras
    wanted = next(
        Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["rollout"]
        if r.startswith("mlflow")
    )  # fmt: skip
    (version,) = [Version(s.version) for s in requirement.specifier]
    assert version in wanted.specifier
    assert "boto3" in install and "psycopg2-binary" in install
    # The start script the chart runs with authentication is in the image, on PATH.
    assert "services/mlflow/mlflow-with-auth.sh" in image.copy_sources()
    copy = next(a for op, a in image.stages[0].instructions if op == "COPY")
    assert copy.split()[-1] == "/opt/mlflow/bin/mlflow-with-auth"
    assert "PATH=/opt/mlflow/bin" in image.env()


def test_build_context_leaves_out_the_venv_and_caches() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".cache"} <= ignored
    for name in ALL_IMAGES:
        for source in dockerfile(name).copy_sources():
            assert source.split("/")[0] not in ignored, f"{name}: COPY {source}"
            assert (ROOT / source).exists(), f"{name}: COPY {source}: no such file"
