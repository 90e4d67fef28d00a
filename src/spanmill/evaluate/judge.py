"""An LLM judge behind any OpenAI-compatible endpoint, comparing two answers side by side.

Judges favour whichever answer they read first (or second) more often than
chance, so the two answers are shown in one order for half the items and in
the other order for the rest: the position bias adds to both models alike and
cancels in their difference. The prompt is versioned; the version and the
template go into the evaluation's results, so a verdict can always be traced
to the words that asked for it.

The endpoint's key comes from the settings (on a cluster, from a Secret mounted
as an environment variable) and is sent only as a bearer token.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Literal

import httpx

from spanmill.evaluate.evaluators import (
    EvaluatorContext,
    EvaluatorError,
    ItemScore,
    ReplayItem,
    Scored,
)

PROMPT_VERSION: Final = "pairwise-2026-12-1"
SYSTEM_PROMPT: Final = (
    "You compare two answers to the same conversation and say which one is better: "
    "more correct, more helpful, and closer to what the conversation asks for, "
    "including its format (a tool call where a tool call is due)."
)
USER_TEMPLATE: Final = (
    "Conversation:\n{conversation}\n\n"
    "Answer A:\n{a}\n\n"
    "Answer B:\n{b}\n\n"
    "Which answer is better? Reply with one word: A, B or TIE."
)
# Judge requests in flight at once.
CONCURRENCY: Final = 8
# A tie in any case; A and B as capitals (the article "a" is not a verdict: "It's a tie"
# read as A); a reply of the letter alone in any case.
_VERDICT = re.compile(r"\b((?i:tie)|A|B)\b")
Verdict = Literal["A", "B", "TIE"]


@dataclass(frozen=True)
class Judgement:
    """One pairwise verdict, in the challenger's terms."""

    challenger_first: bool
    verdict: Verdict | None  # as the judge said it, positions A/B; None: no verdict found
    raw: str

    @property
    def preference(self) -> float | None:
        """1 if the challenger's answer won, 0 if the champion's did, 0.5 for a tie; None
        where the judge said nothing readable (not a tie: that item is not measured)."""
        if self.verdict is None:
            return None
        if self.verdict == "TIE":
            return 0.5
        challenger_is = "A" if self.challenger_first else "B"
        return 1.0 if self.verdict == challenger_is else 0.0


def parse_verdict(reply: str) -> Verdict | None:
    """The judge's verdict: the first TIE (any case), A or B standing as a word, or a
    reply that is the letter alone ("b."); upper-cased."""
    match = _VERDICT.search(reply)
    if match:
        return match.group(1).upper()  # type: ignore[return-value]
    bare = reply.strip(" \t\n.!\"'").upper()
    return bare if bare in ("A", "B", "TIE") else None  # type: ignore[return-value]


def render_conversation(prompt: Sequence[Mapping[str, str]]) -> str:
    return "\n".join(f"[{m.get('role', '?')}] {m.get('content', '')}" for m in prompt)


def judge_messages(item: ReplayItem, first: str, second: str) -> list[dict[str, str]]:
    user = USER_TEMPLATE.format(conversation=render_conversation(item.prompt), a=first, b=second)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def swap_plan(n: int, seed: int) -> list[bool]:
    """Whether the challenger's answer is shown first, per item: exactly half of them (n // 2),
    which half chosen by ``seed``."""
    plan = [i < n // 2 for i in range(n)]
    random.Random(seed).shuffle(plan)
    return plan


class JudgeEvaluator:
    """The ``judge`` evaluator: metric ``preference`` (the challenger's win rate, ties 0.5)."""

    name = "judge"
    metrics = ("preference",)

    def __init__(
        self, context: EvaluatorContext, transport: httpx.BaseTransport | None = None
    ) -> None:
        if not context.judge_url or not context.judge_model:
            raise EvaluatorError(
                "the judge evaluator needs an OpenAI-compatible endpoint and a model: set "
                "SPANMILL_EVAL_JUDGE_URL and SPANMILL_EVAL_JUDGE_MODEL"
            )
        self.url = context.judge_url.rstrip("/")
        self.model = context.judge_model
        self.seed = context.seed
        self.timeout_s = context.judge_timeout_s
        self.headers = (
            {"Authorization": f"Bearer {context.judge_api_key}"} if context.judge_api_key else {}
        )
        self.concurrency = CONCURRENCY
        self.transport = transport

    def describe(self) -> dict[str, str]:
        """What the results must say about the judge."""
        return {
            "prompt_version": PROMPT_VERSION,
            "model": self.model,
            "url": self.url,
            "system_prompt": SYSTEM_PROMPT,
            "user_template": USER_TEMPLATE,
        }

    def judge(self, client: httpx.Client, messages: list[dict[str, str]]) -> str:
        body = {"model": self.model, "messages": messages, "temperature": 0.0, "max_tokens": 8}
        try:
            response = client.post(f"{self.url}/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise EvaluatorError(f"the judge at {self.url} is unreachable: {exc}") from None
        if response.status_code != 200:
            raise EvaluatorError(
                f"the judge at {self.url} answered {response.status_code}: {response.text[:300]}"
            )
        try:
            content = response.json()["choices"][0]["message"].get("content")
        except (ValueError, LookupError, TypeError, AttributeError):
            raise EvaluatorError(
                f"the judge at {self.url} answered 200 but not an OpenAI chat completion: "
                f"{response.text[:300]}"
            ) from None
        return str(content or "")

    def judgements(
        self, items: Sequence[ReplayItem], answers: Mapping[str, Sequence[str]]
    ) -> list[Judgement]:
        plan = swap_plan(len(items), self.seed)
        pairs = []
        for item, first, champion, challenger in zip(
            items, plan, answers["champion"], answers["challenger"], strict=True
        ):
            a, b = (challenger, champion) if first else (champion, challenger)
            pairs.append(judge_messages(item, a, b))
        with (
            httpx.Client(
                timeout=self.timeout_s, headers=self.headers, transport=self.transport
            ) as client,
            ThreadPoolExecutor(self.concurrency) as pool,
        ):
            replies = list(pool.map(lambda messages: self.judge(client, messages), pairs))
        return [
            Judgement(first, parse_verdict(raw), raw)
            for first, raw in zip(plan, replies, strict=True)
        ]

    def score(self, items: Sequence[ReplayItem], answers: Mapping[str, Sequence[str]]) -> Scored:
        scored: Scored = {"champion": [], "challenger": []}
        for judgement in self.judgements(items, answers):
            said = judgement.verdict or f"no verdict in {judgement.raw[:60]!r}"
            order = "challenger first" if judgement.challenger_first else "champion first"
            why = f"judge: {said} ({order})"
            won = judgement.preference
            # An unreadable reply measures nothing: counted as a tie, a judge that answers
            # nothing readable would satisfy the gate's min_items with made-up equality.
            scored["challenger"].append(ItemScore({} if won is None else {"preference": won}, why))
            scored["champion"].append(
                ItemScore({} if won is None else {"preference": 1.0 - won}, why)
            )
        return scored
