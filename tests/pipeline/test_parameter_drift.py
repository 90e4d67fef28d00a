"""Parameters declared once: the settings models, the steps, the components, the flywheel
and the CLI agree on every parameter's name, type and default (spanmill.pipeline.parameters).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

import components.build_dataset
import components.check_run
import components.evaluate
import components.register_model
import components.train_lora
import components.train_rl
import pipelines.flywheel
from spanmill.dataset.spec import DatasetSpec
from spanmill.evaluate.settings import EvalSettings
from spanmill.pipeline import steps
from spanmill.pipeline.parameters import FLYWHEEL_CHOICES, FLYWHEEL_RENAMES, unset
from spanmill.train import TrainSettings

COMPONENTS: dict[str, tuple[Any, Callable[..., Any]]] = {
    "build_dataset": (components.build_dataset.build_dataset, steps.build_dataset_step),
    "check_run": (components.check_run.check_run, steps.check_run_step),
    "train_lora": (components.train_lora.train_lora, steps.train_step),
    "train_rl": (components.train_rl.train_rl, steps.train_rl_step),
    "evaluate": (components.evaluate.evaluate, steps.evaluate_step),
    "register_model": (components.register_model.register_model, steps.register_step),
}
SETTINGS: list[tuple[type[BaseModel], Callable[..., Any]]] = [
    (DatasetSpec, steps.build_dataset_step),
    (TrainSettings, steps.train_step),
    (EvalSettings, steps.evaluate_step),
]
SCALARS = (str, int, float, bool)


def _parameters(function: Any) -> dict[str, tuple[type | None, Any]]:
    """name -> (scalar type, default) of a function's plain parameters (artifacts left out)."""
    function = getattr(function, "python_func", getattr(function, "pipeline_func", function))
    hints = typing.get_type_hints(function)
    found = {}
    for name, parameter in inspect.signature(function).parameters.items():
        kind = hints.get(name)
        options = [t for t in typing.get_args(kind) if t is not type(None)] or [kind]
        scalar = next((t for t in options if t in SCALARS), None)
        if scalar is None:
            continue  # an artifact, a path or a list: not a run parameter
        found[name] = (scalar, parameter.default)
    return found


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_each_component_says_what_its_step_says(name: str) -> None:
    component, step = COMPONENTS[name]
    ours, theirs = _parameters(component), _parameters(step)
    for parameter, (kind, default) in ours.items():
        assert parameter in theirs, f"{name}.{parameter} is not a parameter of {step.__name__}"
        step_kind, step_default = theirs[parameter]
        assert kind is step_kind, f"{name}.{parameter}: {kind} here, {step_kind} in the step"
        if default is inspect.Parameter.empty:
            continue  # required of every run
        chosen = FLYWHEEL_CHOICES.get((name, parameter))
        expected = chosen[0] if chosen else step_default
        assert default == expected, f"{name}.{parameter} = {default!r}, the step says {expected!r}"


@pytest.mark.parametrize(("model", "step"), SETTINGS, ids=lambda v: getattr(v, "__name__", ""))
def test_each_step_defaults_to_its_settings(model: type[BaseModel], step: Any) -> None:
    """A step's default is its settings' default, or KFP's "unset" (which leaves it to the
    settings and the environment)."""
    checked = 0
    for parameter, (kind, default) in _parameters(step).items():
        field = model.model_fields.get(parameter)
        if field is None or default is inspect.Parameter.empty:
            continue
        own = field.get_default(call_default_factory=True)
        declared = unset(own, kind)
        left_to_settings = default in ("", 0) and kind in (str, int)
        assert default in (own, declared) or left_to_settings, (
            f"{step.__name__}({parameter}={default!r}) but {model.__name__} says {declared!r}"
        )
        checked += 1
    assert checked >= 3


def test_the_evaluate_step_defaults_to_the_gate_policy() -> None:
    """The gate's fields are nested in EvalSettings (``gate``): the step's margin, metric
    and significance default to GatePolicy's, or to unset (the environment's)."""
    from spanmill.evaluate.settings import GatePolicy

    parameters = _parameters(steps.evaluate_step)
    for parameter, field in {"margin": "margin", "gate_metric": "metric",
                             "require_significant": "require_significant"}.items():  # fmt: skip
        _, default = parameters[parameter]
        own = GatePolicy.model_fields[field].get_default(call_default_factory=True)
        assert default in (own, None), f"evaluate_step({parameter}={default!r}), gate: {own!r}"


def test_the_rl_step_defaults_to_grpos_recipe() -> None:
    """GRPO's rate and temperature are one recipe (GRPO_RECIPE) for the CLI, the API and
    the pipeline: before, the step said 1e-4 and 0.8 where the CLI trained at 3e-4, 1.0
    and a linear warm-up whose first step's rate was 0."""
    from spanmill.train.settings import GRPO_RECIPE

    parameters = _parameters(steps.train_rl_step)
    for parameter, field in {"learning_rate": "learning_rate",
                             "temperature": "rollout_temperature"}.items():  # fmt: skip
        assert parameters[parameter][1] == GRPO_RECIPE[field], parameter
    unset_run = TrainSettings(method="grpo", track=False)
    assert {name: getattr(unset_run, name) for name in GRPO_RECIPE} == GRPO_RECIPE
    # What a person sets, by argument or environment, stands.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPANMILL_TRAIN_LR_SCHEDULER", "cosine")
        asked = TrainSettings(method="grpo", track=False, learning_rate=5e-4)
    assert (asked.learning_rate, asked.lr_scheduler, asked.warmup_ratio) == (5e-4, "cosine", 0.0)
    assert TrainSettings(track=False).lr_scheduler == "linear"  # SFT's own defaults


def test_the_flywheel_passes_each_parameter_with_its_components_default() -> None:
    flywheel = _parameters(pipelines.flywheel.flywheel)
    names = {name: _parameters(component) for name, (component, _) in COMPONENTS.items()}
    matched = 0
    for parameter, (kind, default) in flywheel.items():
        if parameter in FLYWHEEL_RENAMES:
            component, target = FLYWHEEL_RENAMES[parameter]
            places = [(component, names[component][target])]
        else:
            renamed = set(FLYWHEEL_RENAMES.values())  # fed by another flywheel parameter
            places = [(c, found[parameter]) for c, found in names.items()
                      if parameter in found and (c, parameter) not in renamed]  # fmt: skip
        for component, (their_kind, their_default) in places:
            assert kind is their_kind, f"flywheel {parameter}: {kind}, {component} {their_kind}"
            if their_default is not inspect.Parameter.empty:
                assert default == their_default, (
                    f"flywheel {parameter}={default!r}, {component} defaults to {their_default!r}"
                )
            matched += 1
    assert matched >= len(flywheel) - 3  # agent and flavour-like run-wide values included


def test_the_dataset_cli_defaults_to_the_spec() -> None:
    """``spanmill dataset build``'s options default to DatasetSpec's fields."""
    from spanmill.cli.dataset import build

    spec = DatasetSpec()
    renames = {"weighting": "sft_weighting"}
    checked = 0
    for name, parameter in inspect.signature(build).parameters.items():
        field = renames.get(name, name)
        if field not in DatasetSpec.model_fields:
            continue
        default = getattr(parameter.default, "default", parameter.default)
        declared = getattr(spec, field)
        if isinstance(declared, tuple):
            declared = ",".join(declared)
        assert default == declared, f"--{name} defaults to {default!r}, the spec to {declared!r}"
        checked += 1
    assert checked >= 15
