"""How a pipeline parameter relates to the settings it ends in, declared once.

Each step's settings model (``DatasetSpec``, ``TrainSettings``, ``EvalSettings``) is
the declaration of its parameters and their defaults. The step functions
(:mod:`spanmill.pipeline.steps`), the KFP components (``components/``) and the
``flywheel`` pipeline spell them again, because KFP reads a component's signature and
its source: ``tests/pipeline/test_parameter_drift.py`` holds all of them to the
declaration, by name, type and default, under two rules:

- KFP has no "unset": a value left unset is ``""`` for text and ``0`` for a number
  (the step then leaves the settings' own default, or the environment's), and a list
  is comma-separated text (:func:`unset`).
- Where the flywheel deliberately runs with another default than a step's own, it
  is listed in :data:`FLYWHEEL_CHOICES` with its reason; the components carry it too.
"""

from __future__ import annotations

from typing import Any, Final

# (component, parameter) -> (the flywheel's default, why it departs from the step's own).
FLYWHEEL_CHOICES: Final[dict[tuple[str, str], tuple[Any, str]]] = {
    ("build_dataset", "min_reward"): (
        1.0, "a flywheel run learns from the calls that earned the full reward"),
    ("build_dataset", "drop_examples"): (
        True, "few-shot examples are distilled away: the tuned model needs none"),
    ("train_lora", "max_steps"): (90, "a fixed training budget per run, whatever the data's size"),
    ("evaluate", "margin"): (
        0.05, "an unattended run promotes only a clear improvement (a person at the CLI "
        "judges the report)"),
}  # fmt: skip

# Flywheel parameter -> the component parameter it is passed as, where the names differ.
FLYWHEEL_RENAMES: Final[dict[str, tuple[str, str]]] = {
    "dataset_mode": ("build_dataset", "mode"),
    "gpu_type": ("train_lora", "gpu_resource"),
    "rl_steps": ("train_rl", "max_steps"),
    "rl_group_size": ("train_rl", "group_size"),
    "rl_groups_per_step": ("train_rl", "groups_per_step"),
    "rl_temperature": ("train_rl", "temperature"),
    "rl_learning_rate": ("train_rl", "learning_rate"),
    "rl_beta": ("train_rl", "beta"),
    "eval_instances": ("evaluate", "instances"),
}


def unset(default: Any, kind: type) -> Any:
    """A settings default as a KFP parameter of ``kind`` writes it."""
    if default is None:
        return "" if kind is str else 0
    if isinstance(default, list | tuple):
        return ",".join(str(item) for item in default)
    return default
