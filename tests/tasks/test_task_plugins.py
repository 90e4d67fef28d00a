"""Tasks are plugins: found by name through the ``spanmill.tasks`` entry points, and
the core never imports one (the calculator is an example outside it)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, ClassVar

import pytest

import spanmill
from spanmill import plugins as registries
from spanmill.tasks import base
from spanmill.tasks.base import (
    ENTRY_POINT_GROUP,
    Message,
    PromptStyle,
    Split,
    Task,
    TaskError,
    TaskInstance,
    TaskRegistry,
    Verdict,
    find_task,
    get_task,
)


class EchoTask(Task):
    """The smallest task there is, for the registry to find."""

    name: ClassVar[str] = "echo-plugin"
    agent_name: ClassVar[str] = "echo"

    def instances(self, split: Split, n: int, seed: int = 0) -> list[TaskInstance]:
        return [TaskInstance(self.name, f"echo/{i}", "say 1", "1") for i in range(n)]

    def system_prompt(self, style: PromptStyle) -> str:
        return "Repeat the number."

    def few_shot_turns(self, instance: TaskInstance) -> list[Message]:
        return []

    def tools(self) -> list[dict[str, Any]]:
        return []

    def run_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def verify(self, instance: TaskInstance, transcript: Sequence[Mapping[str, Any]]) -> Verdict:
        raise NotImplementedError


class Misnamed(EchoTask):
    name: ClassVar[str] = "another-name"


NOT_A_TASK = object()


def registry(monkeypatch: pytest.MonkeyPatch, **plugins: str) -> TaskRegistry:
    """A registry that sees ``plugins`` (name = "module:attr") as the installed ones."""
    found = [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in plugins.items()]
    monkeypatch.setattr(
        registries, "entry_points", lambda group: found if group == ENTRY_POINT_GROUP else []
    )
    fresh = TaskRegistry()
    monkeypatch.setattr(base, "TASKS", fresh)
    return fresh


def test_the_installed_calculator_is_found_through_its_entry_point() -> None:
    from importlib.metadata import entry_points

    (calculator,) = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == "calculator"]
    assert calculator.value == "spanmill_examples.calculator:CalculatorTask"
    assert "calculator" in base.TASKS
    task = get_task("calculator")
    assert (task.name, type(task).__module__) == ("calculator", "spanmill_examples.calculator")


def test_entry_points_are_listed_once_and_loaded_when_first_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    found = [EntryPoint("echo-plugin", f"{__name__}:EchoTask", ENTRY_POINT_GROUP)]

    def listing(group: str) -> list[EntryPoint]:
        calls.append(group)
        return found

    monkeypatch.setattr(registries, "entry_points", listing)
    tasks = TaskRegistry()
    assert calls == []
    assert list(tasks) == ["echo-plugin"] and len(tasks) == 1
    assert tasks["echo-plugin"] is EchoTask
    assert tasks["echo-plugin"] is EchoTask
    assert calls == [ENTRY_POINT_GROUP]


def test_an_unknown_task_names_the_installed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    registry(monkeypatch, **{"echo-plugin": f"{__name__}:EchoTask"})
    with pytest.raises(TaskError, match=r"unknown task 'sql'; installed tasks: echo-plugin\."):
        get_task("sql")
    assert isinstance(get_task("echo-plugin"), EchoTask)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "spanmill_no_such_module:Task",
            "ModuleNotFoundError.*Installed tasks: broken, echo-plugin",
        ),
        (f"{__name__}:NoSuchClass", "failed to load: AttributeError"),
        (f"{__name__}:NOT_A_TASK", "not a Task subclass"),
        (f"{__name__}:Misnamed", "whose name is 'another-name'"),
    ],
)
def test_a_broken_plugin_fails_its_own_lookups_with_its_name(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    tasks = registry(monkeypatch, broken=value, **{"echo-plugin": f"{__name__}:EchoTask"})
    with pytest.raises(TaskError, match=message) as caught:
        get_task("broken")
    assert "task 'broken'" in str(caught.value) and value in str(caught.value)
    assert isinstance(get_task("echo-plugin"), EchoTask)
    assert sorted(tasks) == ["broken", "echo-plugin"]


def test_a_name_two_distributions_claim_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    found = [
        EntryPoint("echo-plugin", f"{__name__}:EchoTask", ENTRY_POINT_GROUP),
        EntryPoint("echo-plugin", "elsewhere:EchoTask", ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(registries, "entry_points", lambda group: found)
    with pytest.raises(TaskError, match=r"'echo-plugin' is claimed by .* and .*elsewhere"):
        TaskRegistry()["echo-plugin"]


def test_tasks_defined_in_process_register_beside_the_plugins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tasks = registry(monkeypatch, calculator="spanmill_examples.calculator:CalculatorTask")
    assert base.register(EchoTask) is EchoTask
    assert list(tasks) == ["calculator", "echo-plugin"]
    assert isinstance(get_task("echo-plugin"), EchoTask)

    class Other(EchoTask):
        pass

    with pytest.raises(ValueError, match="taken by EchoTask"):
        base.register(Other)

    class Calculator(EchoTask):
        name: ClassVar[str] = "calculator"

    with pytest.raises(ValueError, match="taken by the installed plugin spanmill_examples"):
        base.register(Calculator)


def test_optional_task_methods_have_generic_defaults() -> None:
    task = EchoTask()
    with pytest.raises(TaskError, match="task 'echo-plugin' has no reference solutions"):
        task.reference_transcript(task.instances("train", 1)[0])
    assert task.same_answer("12.50", "12.5") is True
    assert task.same_answer(" 1,250 ", "1250") is True
    assert task.same_answer("The answer is 12.5", "12.5") is False
    assert task.same_answer("Paris", "paris") is None


# Modules only a server's own interpreter provides (Triton's Python backend); the core
# modules that need them are read for imports instead.
RUNTIME_ONLY = ("triton_python_backend_utils",)


def test_the_core_imports_no_example_task() -> None:
    """Every module of the core, imported in a fresh interpreter, leaves the examples out."""
    root = Path(spanmill.__file__).parent
    modules = sorted(
        ".".join(("spanmill", *path.relative_to(root).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        for path in root.rglob("*.py")
    )
    assert "spanmill.tasks.base" in modules and len(modules) > 50
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        f"        if exc.name not in {RUNTIME_ONLY!r}:\n"
        "            raise\n"
        "        print(name)\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] == 'spanmill_examples')\n"
        "assert not leaked, f'the core imported {leaked}'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    skipped = done.stdout.split()
    assert len(skipped) <= 2, f"only Triton's models need a server's interpreter: {skipped}"
    for name in skipped:
        source = root.joinpath(*name.split(".")[1:]).with_suffix(".py").read_text()
        assert "spanmill_examples" not in source, name


def test_the_task_of_an_agent_is_found_by_the_agent_name(monkeypatch: pytest.MonkeyPatch) -> None:
    registry(monkeypatch, **{"echo-plugin": f"{__name__}:EchoTask"})
    assert isinstance(find_task("echo"), EchoTask)
    assert find_task("support-agent") is None


def test_a_broken_plugin_hides_an_agent_s_task_only_when_no_other_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry(
        monkeypatch,
        broken="spanmill_no_such_module:Task",
        **{"echo-plugin": f"{__name__}:EchoTask"},
    )
    assert isinstance(find_task("echo"), EchoTask)
    with pytest.raises(
        TaskError, match="cannot tell whether agent 'support-agent' has a task: task 'broken'"
    ):
        find_task("support-agent")


def test_two_tasks_of_one_agent_are_ambiguous(monkeypatch: pytest.MonkeyPatch) -> None:
    class EchoAgain(EchoTask):
        name: ClassVar[str] = "echo-again"

    registry(monkeypatch, **{"echo-plugin": f"{__name__}:EchoTask"})
    base.register(EchoAgain)
    with pytest.raises(TaskError, match="tasks echo-again, echo-plugin all have the agent 'echo'"):
        find_task("echo")
