"""Rewards: what counts as one, and which call or episode it judges, here alone.

**What counts.** A reward is a GenAI evaluation: a name (``gen_ai.evaluation.name``)
and a finite numeric score (``gen_ai.evaluation.score.value``), on a span of its own or as a
``gen_ai.evaluation.result`` event on any span, optionally marked primary
(``spanmill.reward.primary``) and linked to one call by ``gen_ai.response.id`` (an
event without one evaluates the call it sits on). :func:`rewards_of` is that reading;
the span record (``Span.rewards``) and the collector's rows (the store's ``rewards``
column) both use it.

**What it judges.** A reward whose response id names a call that was read judges that
call (and so its episode). Any other reward (no response id, or the id of a call not
read) judges an episode: the reward span's own explicit episode, else the episode of
the first call in its trace (feedback posted by trace id sits in a trace of its own
beside its episode's calls). :data:`LINKED_REWARDS` is that rule as a DuckDB macro,
``linked_rewards()``, over the store's ``spans`` view (:mod:`spanmill.store.queries`
defines it on every connection); the dataset builder runs it over the spans it read
(:func:`spanmill.store.queries.linked_rewards`), the rollout signals over the store.
This module needs nothing but the standard library: every span writer, the gateway's
included, reads rewards through it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

from spanmill import semconv as sc


def reward_fields(
    attributes: Mapping[str, Any], default_response_id: str | None
) -> dict[str, Any] | None:
    """The reward ``attributes`` carry (a GenAI evaluation's name and numeric score), as
    the store's ``rewards`` items hold it; None where they carry none."""
    name = attributes.get(sc.GEN_AI_EVALUATION_NAME)
    score = attributes.get(sc.GEN_AI_EVALUATION_SCORE_VALUE)
    if type(name) is not str or type(score) not in (int, float):  # bool is no score
        return None
    if not math.isfinite(score):  # type: ignore[arg-type]
        # Not a score anything can learn from or compare (NaN is neither above nor
        # below a threshold); the SDK and /v1/feedback refuse it where it is sent.
        return None
    response_id = attributes.get(sc.GEN_AI_RESPONSE_ID, default_response_id)
    label = attributes.get(sc.GEN_AI_EVALUATION_SCORE_LABEL)
    return {
        "name": name,
        "value": float(score),  # type: ignore[arg-type]
        "response_id": response_id if type(response_id) is str else None,
        "primary": attributes.get(sc.SPANMILL_REWARD_PRIMARY) is True,
        "label": label if type(label) is str else None,
    }


def rewards_of(
    attributes: Mapping[str, Any], events: Iterable[tuple[str, Mapping[str, Any]]] = ()
) -> list[dict[str, Any]]:
    """A span's rewards: its own (a reward span), then its evaluation events'. An event
    without a ``gen_ai.response.id`` of its own evaluates the call it sits on."""
    found = []
    own = reward_fields(attributes, None)
    if own is not None:
        found.append(own)
    default: str | None = None
    for name, event_attributes in events:
        if name != sc.GEN_AI_EVALUATION_RESULT_EVENT:
            continue
        if default is None:
            response_id = attributes.get(sc.GEN_AI_RESPONSE_ID)
            default = response_id if type(response_id) is str else None
        reward = reward_fields(event_attributes, default)
        if reward is not None:
            found.append(reward)
    return found


# One row a reward, oldest span first (a span's own rewards in their order): its name,
# value, primary flag and scope, the call it judges (call_response_id; NULL when none
# was read), the episode it judges, and whether that episode has a call that was read.
# Built on the store's llm_calls() and span_rewards() macros.
LINKED_REWARDS: Final = (
    "CREATE MACRO linked_rewards() AS TABLE "
    "WITH calls AS (SELECT trace_id, episode_id, response_id, start_time FROM llm_calls()), "
    "by_response AS (SELECT response_id, any_value(episode_id) AS episode_id FROM calls "
    "WHERE response_id IS NOT NULL GROUP BY response_id), "
    "by_trace AS (SELECT trace_id, arg_min(episode_id, start_time) AS episode_id "
    "FROM calls GROUP BY trace_id), "
    'judged AS (SELECT r.name, r.value, r."primary", r.label, r.scope_name, '
    "r.resource_attributes, r.trace_id, r.span_id, r.start_time, r.position, "
    "c.response_id AS call_response_id, "
    "coalesce(c.episode_id, CASE WHEN r.episode_id <> r.trace_id THEN r.episode_id "
    "ELSE coalesce(t.episode_id, r.episode_id) END) AS episode_id "
    "FROM span_rewards() r LEFT JOIN by_response c ON r.response_id = c.response_id "
    "LEFT JOIN by_trace t ON r.trace_id = t.trace_id) "
    "SELECT *, (call_response_id IS NOT NULL "
    "OR coalesce(episode_id IN (SELECT episode_id FROM calls), false)) AS reaches_call "
    "FROM judged"
)
