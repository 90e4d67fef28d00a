"""Agent tasks: problems, prompts, tools and verifiers, and a runner for them.

Tasks are plugins: an installed distribution lists its Task classes in the
``spanmill.tasks`` entry-point group, and :func:`get_task` finds them by name (the
calculator, in ``examples/spanmill_examples``, is one). The runner
(:mod:`spanmill.tasks.runner`) needs the OpenAI client and is imported on its own.
"""

from spanmill.tasks.base import (
    ENTRY_POINT_GROUP,
    TASKS,
    Score,
    Task,
    TaskError,
    TaskInstance,
    ToolError,
    Verdict,
    find_task,
    get_task,
    register,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "TASKS",
    "Score",
    "Task",
    "TaskError",
    "TaskInstance",
    "ToolError",
    "Verdict",
    "find_task",
    "get_task",
    "register",
]
