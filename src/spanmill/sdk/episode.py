"""Episodes, tool calls and rewards as OpenTelemetry spans and span events.

An episode is one ``invoke_agent`` span; everything the agent does inside it (LLM
calls through the gateway, tool calls) becomes its descendants, in the same
trace. Rewards follow the convention documented in :mod:`spanmill.semconv`: a
``gen_ai.evaluation.result`` event, on the episode span, linked to one LLM call
by ``gen_ai.response.id`` when given.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from spanmill import semconv as sc
from spanmill.sdk.tracing import default_agent_name, get_tracer

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Episode:
    """The episode in progress: its span and the ids that group its spans."""

    agent_name: str
    episode_id: str
    task_id: str | None
    span: trace.Span
    primary_rewards: list[str] = field(default_factory=list)

    @property
    def trace_id(self) -> str:
        """The trace id as 32 hex characters (all zeros when tracing is not configured)."""
        return format(self.span.get_span_context().trace_id, "032x")

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.span.set_attribute(key, value)


_current: ContextVar[Episode | None] = ContextVar("spanmill_episode", default=None)


# Without tracing every reward goes unrecorded; saying so once is enough.
_warned_unrecorded = False


def current_episode() -> Episode | None:
    """The innermost active episode of this thread or task, if any."""
    return _current.get()


def _trace_of(span: Any) -> str:
    """An episode's id where none is given: its trace's, which is what a call recorded in
    that trace without an episode id of its own (an OpenLLMetry span, the gateway's span
    of a call that sent its trace context) is read as belonging to. A fresh id where
    nothing is recorded (tracing not configured: no trace)."""
    trace_id = span.get_span_context().trace_id
    return format(trace_id, "032x") if trace_id else uuid.uuid4().hex


class episode:
    """Run an agent episode inside an ``invoke_agent`` span.

    As a context manager it yields the :class:`Episode`; as a decorator each call
    of the function is one episode (coroutine functions included). ``agent_name``
    defaults to the one given to :func:`~spanmill.sdk.configure`. ``task_id``
    groups attempts at the same task; ``episode_id`` defaults to the episode's trace id,
    so that calls recorded in its trace without an id of their own are its calls (give
    one where several episodes share a trace, and pass it to their calls' metadata).
    An exception marks the span as an error and propagates.
    """

    def __init__(
        self,
        agent_name: str | None = None,
        *,
        task_id: str | None = None,
        episode_id: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        name = agent_name or default_agent_name()
        if not name:
            raise ValueError(
                "episode() needs an agent name: pass one, or configure(agent_name=...) first"
            )
        self.agent_name = name
        self.task_id = task_id
        self.episode_id = episode_id
        self.attributes = dict(attributes or {})
        self._stack: list[tuple[Any, Token[Episode | None]]] = []

    def __enter__(self) -> Episode:
        attributes: dict[str, AttributeValue] = {
            **self.attributes,
            sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
            sc.GEN_AI_AGENT_NAME: self.agent_name,
        }
        if self.episode_id:
            attributes[sc.SPANMILL_EPISODE_ID] = self.episode_id
        if self.task_id is not None:
            attributes[sc.SPANMILL_TASK_ID] = self.task_id
        manager = get_tracer().start_as_current_span(
            f"{sc.OPERATION_INVOKE_AGENT} {self.agent_name}", attributes=attributes
        )
        span = manager.__enter__()
        episode_id = self.episode_id or _trace_of(span)
        if not self.episode_id:
            span.set_attribute(sc.SPANMILL_EPISODE_ID, episode_id)
        state = Episode(
            agent_name=self.agent_name, episode_id=episode_id, task_id=self.task_id, span=span
        )
        self._stack.append((manager, _current.set(state)))
        return state

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        manager, token = self._stack.pop()
        _current.reset(token)
        manager.__exit__(exc_type, exc, tb)

    def _fresh(self) -> episode:
        return episode(
            self.agent_name,
            task_id=self.task_id,
            episode_id=self.episode_id,
            attributes=self.attributes,
        )

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        # A fresh manager per call: concurrent calls must not share one span.
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                with self._fresh():
                    return await func(*args, **kwargs)

            return cast(Callable[P, R], run_async)

        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with self._fresh():
                return func(*args, **kwargs)

        return run


@dataclass
class ToolCall:
    """The tool call in progress; :meth:`set_result` records what the tool returned."""

    name: str
    call_id: str | None
    span: trace.Span

    def set_result(self, result: Any) -> None:
        self.span.set_attribute(sc.GEN_AI_TOOL_CALL_RESULT, _as_text(result))

    def set_error(self, message: str) -> None:
        """Mark the call failed without raising: the agent got the error back as a result."""
        self.span.set_status(trace.Status(trace.StatusCode.ERROR, message))


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


@contextmanager
def tool_call(name: str, call_id: str | None = None, arguments: Any = None) -> Iterator[ToolCall]:
    """Run one tool call inside an ``execute_tool`` span.

    ``arguments`` (a JSON string or a JSON-serializable value) is recorded as the
    call's arguments. An exception marks the span as an error and propagates.
    """
    attributes: dict[str, AttributeValue] = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_EXECUTE_TOOL,
        sc.GEN_AI_TOOL_NAME: name,
    }
    if call_id:
        attributes[sc.GEN_AI_TOOL_CALL_ID] = call_id
    if arguments is not None:
        attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = _as_text(arguments)
    active = current_episode()
    if active is not None:
        attributes[sc.SPANMILL_EPISODE_ID] = active.episode_id
    with get_tracer().start_as_current_span(
        f"{sc.OPERATION_EXECUTE_TOOL} {name}", attributes=attributes
    ) as span:
        yield ToolCall(name=name, call_id=call_id, span=span)


def emit_reward(
    name: str,
    value: float,
    *,
    response_id: str | None = None,
    primary: bool = False,
    label: str | None = None,
    explanation: str | None = None,
) -> None:
    """Record a named reward as a ``gen_ai.evaluation.result`` event.

    It goes on the current episode's span, or on the current span when no episode
    is active. With ``response_id`` it rewards the one LLM call that returned that
    response; without, the whole episode. One reward per episode should be
    ``primary``: the one training optimises.
    """
    if not name:
        raise ValueError("a reward needs a name, e.g. 'success'")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"reward {name!r} must be a finite number, got {value!r}")
    attributes: dict[str, AttributeValue] = {
        sc.GEN_AI_EVALUATION_NAME: name,
        sc.GEN_AI_EVALUATION_SCORE_VALUE: float(value),
        sc.SPANMILL_REWARD_PRIMARY: primary,
    }
    if response_id:
        attributes[sc.GEN_AI_RESPONSE_ID] = response_id
    if label is not None:
        attributes[sc.GEN_AI_EVALUATION_SCORE_LABEL] = label
    if explanation is not None:
        attributes[sc.GEN_AI_EVALUATION_EXPLANATION] = explanation
    active = current_episode()
    if active is not None:
        span = active.span
        if primary:
            if active.primary_rewards and name not in active.primary_rewards:
                logger.warning(
                    "episode %s already has primary reward %r; %r is marked primary too, "
                    "and training optimises only one",
                    active.episode_id,
                    active.primary_rewards[0],
                    name,
                )
            active.primary_rewards.append(name)
    else:
        span = trace.get_current_span()
    if not span.is_recording():
        global _warned_unrecorded
        log = logger.debug if _warned_unrecorded else logger.warning
        _warned_unrecorded = True
        log(
            "reward %r=%s not recorded: no episode or span is active (or tracing is not "
            "configured); emit rewards inside spanmill.sdk.episode(...)",
            name,
            value,
        )
        return
    span.add_event(sc.GEN_AI_EVALUATION_RESULT_EVENT, attributes=attributes)
