"""What an agent task is: instances, prompts, tools and a verifier with named rewards.

Tasks are plugins: a distribution lists its Task classes in the ``spanmill.tasks``
entry-point group and :data:`TASKS`, :func:`get_task` and :func:`find_task` find them
by name, loading each only when it is asked for. The core imports none of them.

Messages are OpenAI chat messages as plain dicts. A few-shot example turn carries
``"spanmill.message.example": true`` (:data:`spanmill.semconv.SPANMILL_MESSAGE_EXAMPLE`)
so that the gateway records it as an example and the dataset builder can drop it.

Instances are split into train and held-out by a hash of their canonical id, never
by position or seed: the same problem lands on the same side whatever seed or
count produced it, so the two splits can never share an instance.
"""

from __future__ import annotations

import hashlib
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar, Final, Literal, TypeVar

from spanmill import semconv as sc
from spanmill.errors import SpanmillError
from spanmill.plugins import Plugins

Split = Literal["train", "heldout"]
PromptStyle = Literal["zero_shot", "few_shot"]
Message = dict[str, Any]

SPLITS: Final[tuple[Split, ...]] = ("train", "heldout")
PROMPT_STYLES: Final[tuple[PromptStyle, ...]] = ("zero_shot", "few_shot")
DEFAULT_HELDOUT_PERCENT: Final = 20
# Installed distributions list their tasks here: ``name = "module:TaskClass"``.
ENTRY_POINT_GROUP: Final = "spanmill.tasks"


class TaskError(SpanmillError):
    """A task is unknown, or cannot give what was asked of it."""


class ToolError(ValueError):
    """A tool call the agent made cannot run; the message goes back to the agent."""


@dataclass(frozen=True)
class TaskInstance:
    """One problem of a task. ``id`` is canonical: equal problems have equal ids."""

    task: str
    id: str
    question: str
    answer: str
    data: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Score:
    """One named reward. ``turn`` is the index of the assistant turn it judges
    (0 for the first LLM call); None means it judges the whole episode."""

    name: str
    value: float
    primary: bool = False
    turn: int | None = None


@dataclass(frozen=True)
class Verdict:
    """The verifier's named rewards for one episode, exactly one of them primary."""

    scores: tuple[Score, ...]
    explanation: str = ""

    def __post_init__(self) -> None:
        primaries = [score.name for score in self.scores if score.primary]
        if len(primaries) != 1:
            raise ValueError(f"a verdict needs exactly one primary score, got {primaries}")

    @property
    def primary(self) -> Score:
        return next(score for score in self.scores if score.primary)

    @property
    def rewards(self) -> dict[str, float]:
        return {score.name: score.value for score in self.scores}

    def __getitem__(self, name: str) -> float:
        return self.rewards[name]


@dataclass(frozen=True)
class ToolCallRequest:
    """A tool call read off an assistant message, in either form the task accepts."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None


def split_of(canonical_id: str, heldout_percent: int = DEFAULT_HELDOUT_PERCENT) -> Split:
    """The split an instance belongs to, from a stable hash of its canonical id."""
    digest = hashlib.sha256(canonical_id.encode("utf-8")).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % 100 < heldout_percent else "train"


def is_example(message: Mapping[str, Any]) -> bool:
    return message.get(sc.SPANMILL_MESSAGE_EXAMPLE) is True


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a message's content, whether a string or a list of text parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def plain_number(text: str) -> Fraction | None:
    """The number a text is, commas and surrounding spaces aside, or None."""
    try:
        return Fraction(text.strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _strip_fence(text: str) -> str:
    if text.startswith("```") and text.endswith("```") and len(text) >= 6:
        inner = text[3:-3]
        first, _, rest = inner.partition("\n")
        return (rest if first.strip().isalpha() or not first.strip() else inner).strip()
    return text


def extract_tool_call(message: Mapping[str, Any]) -> ToolCallRequest | None:
    """The tool call an assistant message makes, or None.

    Two forms are accepted: OpenAI ``tool_calls`` (the first one counts), and a
    content that is exactly one JSON object ``{"tool": NAME, ...arguments}``,
    which is how a model without a native tool format calls tools.
    """
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        first = calls[0]
        function = first.get("function") if isinstance(first, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            return None
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        call_id = first.get("id")
        return ToolCallRequest(
            function["name"], arguments, call_id if isinstance(call_id, str) else None
        )
    text = _strip_fence(message_text(message).strip())
    if not text.startswith("{"):
        return None
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(document, dict) or not isinstance(document.get("tool"), str):
        return None
    name = document.pop("tool")
    return ToolCallRequest(name, document)


InstanceT = TypeVar("InstanceT", bound=TaskInstance)


def collect_instances(
    draw: Callable[[random.Random], InstanceT],
    *,
    task: str,
    split: Split,
    n: int,
    seed: int,
    heldout_percent: int = DEFAULT_HELDOUT_PERCENT,
) -> list[InstanceT]:
    """``n`` distinct instances of ``split``, drawn in a sequence fixed by ``seed``.

    Asking for more with the same seed extends the same list: the first ``n`` of
    ``n + k`` instances are the ``n`` instances.
    """
    if split not in SPLITS:
        raise TaskError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if n < 0:
        raise TaskError(f"the number of instances must not be negative, got {n}")
    rng = random.Random(f"{task}:{split}:{seed}")
    found: list[InstanceT] = []
    seen: set[str] = set()
    budget = 1000 + 50 * n
    for _ in range(budget):
        if len(found) >= n:
            break
        instance = draw(rng)
        if instance.id in seen or split_of(instance.id, heldout_percent) != split:
            continue
        seen.add(instance.id)
        found.append(instance)
    if len(found) < n:
        raise TaskError(
            f"task {task!r}: found only {len(found)} distinct {split} instances in "
            f"{budget} draws, {n} asked; ask for fewer"
        )
    return found


class Task(ABC):
    """A sample agent task: the problems, the prompts, the tools, and how to judge."""

    name: ClassVar[str]
    # The name the agent serves under: its spans' gen_ai.agent.name and its model's name.
    agent_name: ClassVar[str]
    prompt_version: ClassVar[str] = "1"
    heldout_percent: ClassVar[int] = DEFAULT_HELDOUT_PERCENT

    @abstractmethod
    def instances(self, split: Split, n: int, seed: int = 0) -> list[TaskInstance]:
        """``n`` distinct instances of ``split``, the same for the same seed."""

    @abstractmethod
    def system_prompt(self, style: PromptStyle) -> str:
        """The system prompt's text for a prompt style."""

    @abstractmethod
    def few_shot_turns(self, instance: TaskInstance) -> list[Message]:
        """Worked examples for ``instance``'s few-shot prompt as chat turns, each marked
        as an example; a task may choose them by the question (retrieved examples)."""

    @abstractmethod
    def tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI tool schemas."""

    @abstractmethod
    def run_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Run one tool call; raises ToolError with a message for the agent."""

    def run_episode_tool(
        self, instance: TaskInstance, name: str, arguments: Mapping[str, Any]
    ) -> str:
        """Run one tool call of an episode on ``instance``: what the episode loop calls.

        A task whose tools depend on the problem (the database a query runs on)
        overrides this; the others keep :meth:`run_tool` alone.
        """
        return self.run_tool(name, arguments)

    @abstractmethod
    def verify(self, instance: TaskInstance, transcript: Sequence[Mapping[str, Any]]) -> Verdict:
        """Judge an episode's messages (examples and system turns are ignored)."""

    def reference_transcript(self, instance: TaskInstance) -> list[Message]:
        """The question and the turns that solve it, as an agent following the
        protocol would: what reference datasets, demos and tests are made of.

        Optional: a task without reference solutions raises TaskError.
        """
        raise TaskError(
            f"task {self.name!r} has no reference solutions; its Task class does not "
            "implement reference_transcript"
        )

    def same_answer(self, reply: str, reference: str) -> bool | None:
        """Whether a final reply gives the answer ``reference`` gives; None when the
        task cannot tell, and the caller compares the texts its own way.

        The default reads only plain numbers (``12.50`` is ``12.5``, ``1,250`` is
        ``1250``): a task overrides it to read answers as its verifier does.
        """
        wanted = plain_number(reference)
        if wanted is None:
            return None
        return plain_number(reply) == wanted

    def prompt_name(self, style: PromptStyle) -> str:
        return f"{self.name}.{style}"

    def messages(self, instance: TaskInstance, style: PromptStyle) -> list[Message]:
        """The opening messages of an episode: system prompt, examples, the question."""
        if style not in PROMPT_STYLES:
            raise TaskError(
                f"prompt style must be one of {', '.join(PROMPT_STYLES)}, got {style!r}"
            )
        opening: list[Message] = [{"role": "system", "content": self.system_prompt(style)}]
        if style == "few_shot":
            opening.extend(self.few_shot_turns(instance))
        opening.append({"role": "user", "content": instance.question})
        return opening


class TaskRegistry(Plugins[type[Task]]):
    """Every task by name: the ``spanmill.tasks`` entry points of the installed
    distributions, and the tasks defined in-process with :func:`register` (tests)."""

    def __init__(self, group: str = ENTRY_POINT_GROUP) -> None:
        super().__init__(group, "task", self._task_class, TaskError)

    def register(self, cls: type[Task]) -> None:  # type: ignore[override]
        super().register(cls.name, cls)

    def _task_class(self, name: str, loaded: Any) -> type[Task]:
        where = self.where(self.entry_points()[name])
        if not (isinstance(loaded, type) and issubclass(loaded, Task)):
            raise TaskError(f"{where} names {loaded!r}, which is not a Task subclass")
        if loaded.name != name:
            raise TaskError(
                f"{where} names {loaded.__qualname__}, whose name is {loaded.name!r}; the entry "
                "point's name must be the task's name"
            )
        return loaded


TASKS: Final = TaskRegistry()

T = TypeVar("T", bound=type[Task])


def register(cls: T) -> T:
    """Class decorator: make a task defined in-process available to :func:`get_task`.

    Installed tasks need no decorator: their distribution lists them in the
    ``spanmill.tasks`` entry-point group.
    """
    TASKS.register(cls)
    return cls


def get_task(name: str) -> Task:
    """A new instance of the task called ``name``, installed or registered in-process."""
    try:
        cls = TASKS[name]
    except KeyError:
        raise TaskError(
            f"unknown task {name!r}; installed tasks: {TASKS.installed()}. A task is a "
            f"Task subclass listed in the {ENTRY_POINT_GROUP!r} entry-point group of an "
            "installed distribution"
        ) from None
    return cls()


def find_task(agent: str) -> Task | None:
    """A new instance of the task whose agent is ``agent``, or None when no task has it.

    Every task is loaded to read its agent's name. A plugin that fails to load is
    passed over while another task has the agent; when none does, the failure is
    raised, since the broken plugin may be the one.
    """
    playing: list[str] = []
    broken: list[TaskError] = []
    for name in TASKS:
        try:
            cls = TASKS[name]
        except TaskError as exc:
            broken.append(exc)
            continue
        if cls.agent_name == agent:
            playing.append(name)
    if len(playing) > 1:
        raise TaskError(
            f"tasks {', '.join(playing)} all have the agent {agent!r}; name the one to use"
        )
    if playing:
        return get_task(playing[0])
    if broken:
        raise TaskError(f"cannot tell whether agent {agent!r} has a task: {broken[0]}")
    return None
