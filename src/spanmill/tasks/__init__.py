"""Sample agent tasks: problems, prompts, tools and verifiers, and a runner for them.

Importing the package registers every task with :func:`get_task`. The runner
(:mod:`spanmill.tasks.runner`) needs the OpenAI client and is imported on its own.
"""

from spanmill.tasks import calculator
from spanmill.tasks.base import (
    TASKS,
    Score,
    Task,
    TaskError,
    TaskInstance,
    ToolError,
    Verdict,
    get_task,
)

__all__ = [
    "TASKS",
    "Score",
    "Task",
    "TaskError",
    "TaskInstance",
    "ToolError",
    "Verdict",
    "calculator",
    "get_task",
]
