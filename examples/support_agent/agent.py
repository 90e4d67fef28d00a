"""A customer-support agent for Orbit Notes (a fictional note-taking app).

Plain ``openai`` SDK code with one tool, ``search_faq``, over the FAQ bundled
beside this file. It knows nothing of spanmill: its LLM calls are traced by
OpenLLMetry (``opentelemetry-instrumentation-openai``), each episode is one
``invoke_agent`` span made with the OpenTelemetry API, and the spans go out over
OTLP/HTTP to ``OTEL_EXPORTER_OTLP_ENDPOINT``. Feedback that comes later (was the
customer's problem resolved?) is posted with ``httpx`` to ``/v1/feedback``.

The agent loop: question -> model (with ``tools=``) -> the tool calls it asked
for, run here -> their results as ``tool`` messages -> model -> ... until the
model answers in text or ``max_turns`` model calls have been made.

    python -m support_agent.agent --model support "How do I export my notes?"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

HERE = Path(__file__).resolve().parent
FAQ_FILE = HERE / "faq.json"
AGENT_NAME = "support"
SERVICE_NAME = "support-agent"
DEFAULT_MODEL = "support"
PRODUCT = "Orbit Notes"

# The JSON call is spelled out because a small model without a tool format of its
# own (SmolLM2's chat template ignores ``tools=``) must write the call as text.
# A model with native tool calling takes the ``tools`` schema instead.
SYSTEM_PROMPT = (
    f"You are the customer support assistant of {PRODUCT}, a note-taking app. "
    "You answer from the FAQ only. To search the FAQ, reply with only this JSON:\n"
    '{"tool": "search_faq", "query": "<the customer\'s question>"}\n'
    "When the search result arrives, answer the customer in one sentence, "
    "copying the facts from the result."
)

# One worked exchange, shown to the model as real chat turns before the customer's
# question: a small model follows a demonstrated call far more often than a described
# one. Its FAQ entry is asked about by no bundled question.
EXAMPLE_QUESTION = "How do I change my email address?"
EXAMPLE_QUERY = "change email address"
EXAMPLE_ANSWER = (
    "Go to Settings > Account > Email, enter the new address and confirm the link we send to it."
)

# Entries a search returns. SmolLM2 tends to copy the last entry it was shown, right
# or not: with two (the best first) it resolves half as many questions as with one.
RESULTS = 1

# A reply is one line: a small model that wrote its JSON call goes on to invent the
# search result on the next line, and a call with text after it is no call at all.
STOP = ["\n"]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search_faq",
            "description": f"Search the {PRODUCT} FAQ; returns the best matching entries.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What the customer asks about."}
                },
                "required": ["query"],
            },
        },
    }
]


# -- the FAQ and its tool --------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    answer: str
    key_fact: str
    keywords: tuple[str, ...] = ()

    def render(self) -> str:
        return f"[{self.id}] {self.title}\n{self.answer}"


_WORD = re.compile(r"[a-z0-9][a-z0-9-]*")
_STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "get",
    "have", "how", "i", "in", "is", "it", "me", "my", "of", "on", "or", "the", "to", "what",
    "when", "where", "which", "who", "why", "with", "you", "your", "orbit", "notes", "note",
})  # fmt: skip


def _terms(text: str) -> set[str]:
    """Lower-case words without stopwords, with a crude plural folded away."""
    words = _WORD.findall(text.lower())
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words} - _STOPWORDS


class FAQ:
    """The bundled FAQ with a keyword search good enough for a support bot."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.entries = list(entries)
        self._by_id = {e.id: e for e in self.entries}
        self._index = [
            (e, _terms(" ".join(e.keywords)), _terms(e.title), _terms(e.answer))
            for e in self.entries
        ]

    @classmethod
    def load(cls, path: Path = FAQ_FILE) -> FAQ:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            [
                Entry(e["id"], e["title"], e["answer"], e["key_fact"], tuple(e.get("keywords", ())))
                for e in data["entries"]
            ]
        )

    def __getitem__(self, entry_id: str) -> Entry:
        return self._by_id[entry_id]

    def search(self, query: str, k: int = 2) -> list[Entry]:
        """The ``k`` best entries for ``query``: keyword hits weigh most, then the title."""
        terms = _terms(query)
        scored = []
        for position, (entry, keywords, title, answer) in enumerate(self._index):
            score = 3 * len(terms & keywords) + 2 * len(terms & title) + len(terms & answer)
            if score:
                scored.append((-score, position, entry))
        return [entry for _, _, entry in sorted(scored)[:k]]


def search_faq(faq: FAQ, query: str, results: int = RESULTS) -> str:
    """The tool: the ``results`` best entries as text, the best first."""
    found = faq.search(query, k=results)
    if not found:
        return "No FAQ entry matches. Ask the customer to contact help@orbitnotes.example."
    return "\n\n".join(entry.render() for entry in found)


def run_tool(faq: FAQ, name: str, arguments: str, results: int = RESULTS) -> str:
    """Run one tool call the model asked for; a bad call gets an error the model can read."""
    if name != "search_faq":
        return f"Error: there is no tool named {name!r}; the only tool is search_faq."
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return "Error: the arguments are not JSON."
    query = args.get("query") if isinstance(args, dict) else None
    if not isinstance(query, str) or not query.strip():
        return 'Error: search_faq needs a "query" string.'
    return search_faq(faq, query, results)


def worked_example(faq: FAQ, results: int = RESULTS) -> list[dict[str, Any]]:
    """The example exchange as OpenAI messages, its tool result from the real search.

    Its turns carry OpenAI's participant names for few-shot examples
    (``example_user``, ``example_assistant``), so whoever reads the traces can tell
    the demonstration from the customer's conversation.
    """
    call = {
        "id": "call_example",
        "type": "function",
        "function": {"name": "search_faq", "arguments": json.dumps({"query": EXAMPLE_QUERY})},
    }
    return [
        {"role": "user", "name": "example_user", "content": EXAMPLE_QUESTION},
        {"role": "assistant", "name": "example_assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": search_faq(faq, EXAMPLE_QUERY, results),
        },
        {"role": "assistant", "name": "example_assistant", "content": EXAMPLE_ANSWER},
    ]


# -- one episode -----------------------------------------------------------------------


@dataclass
class Episode:
    """One customer question handled end to end."""

    question: str
    answer: str = ""
    trace_id: str = ""
    response_ids: list[str] = field(default_factory=list)
    # What the model said each turn: its text, or its tool call as JSON.
    replies: list[str] = field(default_factory=list)
    # The tool calls the model made: {"name", "arguments", "result"}.
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None

    @property
    def last_response_id(self) -> str | None:
        return self.response_ids[-1] if self.response_ids else None


def _call_text(name: str, arguments: str) -> str:
    """A tool call as the model wrote it: ``{"tool": NAME, ...arguments}``."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        args = None
    if not isinstance(args, dict):
        return json.dumps({"tool": name, "arguments": arguments})
    return json.dumps({"tool": name, **args})


def run_episode(
    client: openai.OpenAI,
    model: str,
    question: str,
    *,
    faq: FAQ,
    tracer: trace.Tracer | None = None,
    temperature: float = 0.0,
    max_turns: int = 3,
    max_tokens: int = 96,
    system_prompt: str = SYSTEM_PROMPT,
    example: bool = True,
    stop: list[str] | None = STOP,
    results: int = RESULTS,
) -> Episode:
    """Answer ``question``; every model call of the episode shares one trace.

    API errors end the episode and are recorded in ``Episode.error`` (and on the
    span) rather than raised, so a batch of episodes survives one bad call.
    """
    tracer = tracer or trace.get_tracer(__name__)
    episode = Episode(question)
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": AGENT_NAME,
        "gen_ai.request.model": model,
        "gen_ai.conversation.id": uuid.uuid4().hex,
    }
    with tracer.start_as_current_span(f"invoke_agent {AGENT_NAME}", attributes=attributes) as span:
        episode.trace_id = format(span.get_span_context().trace_id, "032x")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt},
            *(worked_example(faq, results) if example else []),
            {"role": "user", "content": question},
        ]
        try:
            for _ in range(max_turns):
                completion = client.chat.completions.create(
                    model=model,
                    messages=messages,  # type: ignore[arg-type]
                    tools=TOOLS,  # type: ignore[arg-type]
                    temperature=temperature,
                    max_tokens=max_tokens,
                    stop=stop,
                )
                episode.response_ids.append(completion.id)
                message = completion.choices[0].message
                if not message.tool_calls:
                    episode.answer = message.content or ""
                    episode.replies.append(episode.answer)
                    break
                calls = [c for c in message.tool_calls if c.type == "function"]
                messages.append(
                    {
                        "role": "assistant",
                        "content": message.content,
                        "tool_calls": [c.model_dump(exclude_none=True) for c in calls],
                    }
                )
                for call in calls:
                    name, arguments = call.function.name, call.function.arguments
                    result = run_tool(faq, name, arguments, results)
                    episode.replies.append(_call_text(name, arguments))
                    episode.tool_calls.append(
                        {"name": name, "arguments": arguments, "result": result}
                    )
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        except openai.APIError as exc:
            episode.error = f"{type(exc).__name__}: {exc}"
            span.set_status(trace.StatusCode.ERROR, episode.error)
    return episode


# -- telemetry -------------------------------------------------------------------------


def setup_telemetry(
    endpoint: str | None = None,
    *,
    service_name: str = SERVICE_NAME,
    set_global: bool = True,
    exporter: SpanExporter | None = None,
    headers: dict[str, str] | None = None,
) -> TracerProvider:
    """Trace the openai client with OpenLLMetry, exporting OTLP/HTTP. Call it once.

    ``endpoint``: the OTLP/HTTP base URL (``/v1/traces`` is appended); by default
    the exporter reads ``OTEL_EXPORTER_OTLP_ENDPOINT``. ``exporter`` replaces the
    OTLP exporter (tests). ``headers`` go with every export (the collector's producer
    key as ``Authorization: Bearer ...``); by default ``OTEL_EXPORTER_OTLP_HEADERS``.
    Call ``shutdown()`` on the provider before exiting so the last spans are sent.

    Once per process: OpenLLMetry 0.62's ``uninstrument()`` leaves
    ``chat.completions.create`` wrapped (its dotted unwrap paths do not resolve
    with opentelemetry-instrumentation 0.66), and a second wrapper on top sends the
    gateway the ``traceparent`` of a span that is never exported.
    """
    instrumentor = OpenAIInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        raise RuntimeError("the openai client is already instrumented in this process")
    if exporter is None:
        exporter = (
            OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces", headers=headers)
            if endpoint
            else OTLPSpanExporter(headers=headers)
        )
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if set_global:
        trace.set_tracer_provider(provider)
    instrumentor.instrument(tracer_provider=provider)
    return provider


def make_client(base_url: str | None = None, api_key: str | None = None) -> openai.OpenAI:
    """An OpenAI client for ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` unless given."""
    return openai.OpenAI(
        base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
        api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
        max_retries=1,
    )


# -- feedback --------------------------------------------------------------------------


def feedback_base_url(url: str | None = None) -> str:
    """Where ``/v1/feedback`` lives: ``SPANMILL_FEEDBACK_URL``, else the OpenAI base URL."""
    url = url or os.environ.get("SPANMILL_FEEDBACK_URL") or os.environ.get("OPENAI_BASE_URL")
    if not url:
        raise ValueError("no feedback URL: set SPANMILL_FEEDBACK_URL (the gateway's address)")
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def feedback(
    value: float,
    *,
    response_id: str | None = None,
    trace_id: str | None = None,
    name: str = "resolved",
    comment: str | None = None,
    source: str = "user",
) -> dict[str, Any]:
    """One feedback item, joined to its call by response id or to its episode by trace id."""
    if (response_id is None) == (trace_id is None):
        raise ValueError("give exactly one of response_id and trace_id")
    item: dict[str, Any] = (
        {"response_id": response_id} if response_id is not None else {"trace_id": trace_id}
    )
    item.update(name=name, value=value, source=source)
    if comment is not None:
        item["comment"] = comment
    return item


def send_feedback(
    items: dict[str, Any] | list[dict[str, Any]],
    *,
    url: str | None = None,
    api_key: str | None = None,
    timeout: float = 30.0,
) -> httpx.Response:
    """POST one item or a batch to ``{url}/v1/feedback``; raises on an HTTP error."""
    key = api_key or os.environ.get("OPENAI_API_KEY")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(
        f"{feedback_base_url(url)}/v1/feedback", json=items, headers=headers, timeout=timeout
    )
    response.raise_for_status()
    return response


# -- command line ----------------------------------------------------------------------


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=os.environ.get("SUPPORT_AGENT_MODEL", DEFAULT_MODEL))
    parser.add_argument("--base-url", default=None, help="default: $OPENAI_BASE_URL")
    parser.add_argument("--api-key", default=None, help="default: $OPENAI_API_KEY")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-turns", type=int, default=3, help="model calls per episode")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--results", type=int, default=RESULTS, help="FAQ entries per search")
    parser.add_argument(
        "--otlp-endpoint", default=None, help="default: $OTEL_EXPORTER_OTLP_ENDPOINT"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m support_agent.agent",
        description="Ask the Orbit Notes support agent a question.",
    )
    parser.add_argument("question")
    add_client_options(parser)
    parser.add_argument("--resolved", type=int, choices=(0, 1), help="then send this feedback")
    args = parser.parse_args(argv)
    provider = setup_telemetry(args.otlp_endpoint)
    try:
        episode = run_episode(
            make_client(args.base_url, args.api_key),
            args.model,
            args.question,
            faq=FAQ.load(),
            temperature=args.temperature,
            max_turns=args.max_turns,
            max_tokens=args.max_tokens,
            results=args.results,
        )
    finally:
        provider.shutdown()
    print(episode.answer or f"(no answer: {episode.error or 'turns exhausted'})")
    print(f"trace {episode.trace_id}  responses {' '.join(episode.response_ids)}", file=sys.stderr)
    if args.resolved is not None and episode.last_response_id:
        send_feedback(
            feedback(args.resolved, response_id=episode.last_response_id), api_key=args.api_key
        )
    return 1 if episode.error else 0


if __name__ == "__main__":
    sys.exit(main())
