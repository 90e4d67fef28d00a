"""DuckDB macros over the store's ``spans`` view, for the questions asked most.

:meth:`~spanmill.store.SpanStore.query` defines them on every connection, so the
CLI (``spanmill store query``, ``spanmill spans stats``), the rollout signals and a
data team's own SQL share one definition of each:

- ``llm_calls()``: spans that are LLM calls (``operation_name`` a GenAI chat or
  completion operation).
- ``span_rewards()``: one row per reward a span carries (its own and its
  evaluation events'), with the span's episode and the call it names.
- ``linked_rewards()``: each reward with the call or episode it judges
  (:mod:`spanmill.rewards` says the rule).
- ``episodes_per_agent_per_day()``: episodes and spans per agent per UTC day.
- ``reward_by_model_version(reward)``: for a reward name (NULL: the primary
  reward), its count and mean per model and version of the calls it judges,
  joined by response id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from spanmill import semconv as sc
from spanmill.rewards import LINKED_REWARDS

if TYPE_CHECKING:
    import pyarrow as pa

_OPERATIONS = ", ".join(f"'{op}'" for op in sorted(sc.LLM_OPERATIONS))

LLM_CALLS: Final = (
    f"CREATE MACRO llm_calls() AS TABLE SELECT * FROM spans WHERE operation_name IN ({_OPERATIONS})"
)
SPAN_REWARDS: Final = (
    "CREATE MACRO span_rewards() AS TABLE "
    "SELECT episode_id, trace_id, span_id, r.name AS name, r.value AS value, "
    'r.response_id AS response_id, r."primary" AS "primary", r.label AS label, '
    "resource_attributes, scope_name, start_time, position FROM (SELECT episode_id, "
    "trace_id, span_id, resource_attributes, scope_name, start_time, unnest(rewards) AS r, "
    "unnest(range(len(rewards))) AS position FROM spans WHERE rewards IS NOT NULL)"
)
# What a reward judges needs only these (DuckDB binds a macro's columns when it is made).
REWARD_MACROS: Final = (LLM_CALLS, SPAN_REWARDS, LINKED_REWARDS)
MACROS: Final = (
    *REWARD_MACROS,
    "CREATE MACRO episodes_per_agent_per_day() AS TABLE "
    "SELECT CAST(date_trunc('day', start_time) AS DATE) AS day, "
    "coalesce(agent_name, service_name, '-') AS agent, "
    "count(DISTINCT episode_id) AS episodes, count(*) AS spans "
    "FROM spans GROUP BY ALL ORDER BY day, agent",
    "CREATE MACRO reward_by_model_version(reward) AS TABLE "
    "SELECT c.model AS model, c.model_version AS model_version, count(*) AS rewards, "
    "avg(r.value) AS mean_reward FROM linked_rewards() r "
    "JOIN llm_calls() c ON r.call_response_id = c.response_id "
    'WHERE (reward IS NULL AND r."primary") OR r.name = reward '
    "GROUP BY ALL ORDER BY model, model_version",
)


def linked_rewards(table: pa.Table) -> pa.Table:
    """:data:`~spanmill.rewards.LINKED_REWARDS` over ``table`` (spans with at least ``trace_id``,
    ``span_id``, ``episode_id``, ``start_time``, ``operation_name``, ``response_id``,
    ``rewards``, ``scope_name`` and ``resource_attributes``), oldest reward first."""
    import duckdb

    connection = duckdb.connect()
    try:
        connection.register("spans", table)
        for macro in REWARD_MACROS:
            connection.execute(macro)
        relation = connection.sql(
            "SELECT * FROM linked_rewards() ORDER BY start_time, trace_id, span_id, position"
        )
        return relation.to_arrow_table()
    finally:
        connection.close()
