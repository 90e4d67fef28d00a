"""A simulated customer: asks the bundled questions, judges the answers, sends feedback late.

Each question in ``questions.json`` names the FAQ entry that answers it; an answer
resolves the question when it contains that entry's key fact. Feedback goes out
only after every episode has run, in one batch, as it would when customers rate
their tickets hours later.

    python -m support_agent.simulate --model support --n 20 --temperature 0
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import openai
from opentelemetry import trace

from support_agent.agent import (
    FAQ,
    HERE,
    RESULTS,
    SYSTEM_PROMPT,
    Episode,
    add_client_options,
    feedback,
    make_client,
    run_episode,
    send_feedback,
    setup_telemetry,
)

QUESTIONS_FILE = HERE / "questions.json"


@dataclass(frozen=True)
class Question:
    id: str
    faq_id: str
    question: str


@dataclass(frozen=True)
class Outcome:
    question: Question
    key_fact: str
    episode: Episode
    resolved: bool

    @property
    def called_tool(self) -> bool:
        """Whether the model made a tool call (one the gateway parsed from its text)."""
        return bool(self.episode.tool_calls)

    @property
    def called_search(self) -> bool:
        """Whether its first tool call named the tool offered (the gateway passes on any name)."""
        return bool(self.episode.tool_calls) and self.episode.tool_calls[0]["name"] == "search_faq"

    @property
    def found_entry(self) -> bool:
        """Whether a search the model made returned the entry that answers the question."""
        marker = f"[{self.question.faq_id}]"
        return any(marker in call["result"] for call in self.episode.tool_calls)


def load_questions(path: Path = QUESTIONS_FILE) -> list[Question]:
    return [Question(**q) for q in json.loads(path.read_text(encoding="utf-8"))]


def _normalise(text: str) -> str:
    return " ".join(text.casefold().split())


def judge(answer: str, key_fact: str) -> bool:
    """Resolved when the answer states the key fact (case and spacing aside)."""
    return _normalise(key_fact) in _normalise(answer)


def simulate(
    client: openai.OpenAI,
    model: str,
    questions: Sequence[Question],
    *,
    faq: FAQ,
    tracer: trace.Tracer | None = None,
    temperature: float = 0.0,
    max_turns: int = 3,
    max_tokens: int = 96,
    system_prompt: str = SYSTEM_PROMPT,
    example: bool = True,
    results: int = RESULTS,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """One episode per question, judged; no feedback is sent here."""
    outcomes = []
    for question in questions:
        episode = run_episode(
            client,
            model,
            question.question,
            faq=faq,
            tracer=tracer,
            temperature=temperature,
            max_turns=max_turns,
            max_tokens=max_tokens,
            system_prompt=system_prompt,
            example=example,
            results=results,
        )
        key_fact = faq[question.faq_id].key_fact
        outcome = Outcome(question, key_fact, episode, judge(episode.answer, key_fact))
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    return outcomes


def feedback_items(
    outcomes: Sequence[Outcome], by: Literal["response_id", "trace_id"] = "response_id"
) -> list[dict[str, Any]]:
    """One ``resolved`` item per episode that got an answer: 1 resolved, 0 not."""
    items = []
    for outcome in outcomes:
        episode = outcome.episode
        value = 1 if outcome.resolved else 0
        if by == "trace_id":
            items.append(feedback(value, trace_id=episode.trace_id))
        elif episode.last_response_id is not None:
            items.append(feedback(value, response_id=episode.last_response_id))
    return items


def rates(outcomes: Sequence[Outcome]) -> dict[str, float]:
    n = len(outcomes) or 1
    return {
        "episodes": len(outcomes),
        "tool_call_rate": sum(o.called_tool for o in outcomes) / n,
        "search_call_rate": sum(o.called_search for o in outcomes) / n,
        "found_entry_rate": sum(o.found_entry for o in outcomes) / n,
        "resolved_rate": sum(o.resolved for o in outcomes) / n,
        "errors": sum(o.episode.error is not None for o in outcomes),
    }


def describe(outcome: Outcome, raw: bool = False) -> str:
    mark = "resolved" if outcome.resolved else "not resolved"
    line = f"{outcome.question.id} {mark:>12}  {outcome.question.question}"
    if raw:
        for reply in outcome.episode.replies:
            line += f"\n      model: {reply!r}"
        if outcome.episode.error:
            line += f"\n      error: {outcome.episode.error}"
    return line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m support_agent",
        description="Run the simulated customer against the agent.",
    )
    add_client_options(parser)
    parser.add_argument("--n", type=int, default=20, help="episodes (questions in file order)")
    parser.add_argument("--offset", type=int, default=0, help="first question to ask")
    parser.add_argument("--raw", action="store_true", help="print the model's replies")
    parser.add_argument(
        "--feedback-by", choices=("response_id", "trace_id", "none"), default="response_id"
    )
    parser.add_argument("--feedback-url", default=None, help="default: $SPANMILL_FEEDBACK_URL")
    args = parser.parse_args(argv)

    questions = load_questions()
    chosen = [questions[(args.offset + i) % len(questions)] for i in range(args.n)]
    provider = setup_telemetry(args.otlp_endpoint)
    try:
        outcomes = simulate(
            make_client(args.base_url, args.api_key),
            args.model,
            chosen,
            faq=FAQ.load(),
            temperature=args.temperature,
            max_turns=args.max_turns,
            max_tokens=args.max_tokens,
            results=args.results,
            on_outcome=lambda o: print(describe(o, args.raw), flush=True),
        )
    finally:
        provider.shutdown()  # the spans are sent before the feedback, as time would have it
    summary = rates(outcomes)
    print(json.dumps(summary))
    if args.feedback_by != "none":
        items = feedback_items(outcomes, args.feedback_by)
        send_feedback(items, url=args.feedback_url, api_key=args.api_key)
        print(f"sent {len(items)} feedback items", file=sys.stderr)
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
