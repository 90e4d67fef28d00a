"""The SQL agent: questions about generated SQLite databases, answered by querying them.

An example task plugin, the second beside the calculator: spanmill finds it through
the ``spanmill.tasks`` entry point ``sql`` (pyproject.toml) and never imports it.

- ``databases``: six schemas (shops, schools, flights, hotels, clinics, libraries),
  each a few related tables; database ``<schema>-<seed>`` holds rows drawn from
  its seed, so the same name always holds the same rows.
- ``questions``: question templates per schema with their gold SQL (filters,
  joins, aggregates, GROUP BY, ORDER BY with LIMIT, counts).
- ``execute``: the query runner (read-only, time and row limits) and the
  comparison of results.
- ``task``: :class:`SqlTask`, prompts, the ``sql`` tool and the verifier.

Splits: train questions are asked about **shops, schools, flights and hotels**;
held-out questions about **clinics and libraries**, schemas the train split never
shows, so a held-out score measures SQL on unseen tables, not recall of them.

The protocol, several turns:

1. the agent calls the tool, as JSON content ``{"tool": "sql", "query": "SELECT ..."}``
   or as OpenAI ``tool_calls``; the system prompt shows the instance's CREATE TABLE
   statements;
2. the rows come back as a ``tool`` message (a header, at most 20 rows, a count),
   or the SQLite error; the agent may send a corrected query, as often as the
   episode loop's turn limit allows (three LLM calls by default, see
   ``spanmill/tasks/loop.py``: a query, one retry, the answer);
3. the agent answers in text.

Rewards: ``success`` (primary, the episode) is 1 when the rows of the agent's last
query equal the gold query's, compared as a multiset of rows unless the gold SQL has
ORDER BY, column names aside, numbers within 0.005, and a text answer follows
them; ``valid_query`` (one per call, linked to that call's turn) is 1 when that
query ran.

The zero-shot and few-shot prompts share one system prompt; few-shot only adds
example turns (one of them a failed query and its retry), so dropping the examples
from a few-shot sample gives exactly the zero-shot prompt.
"""

from spanmill_examples.sql.task import HELDOUT_SCHEMAS, TRAIN_SCHEMAS, SqlTask

__all__ = ["HELDOUT_SCHEMAS", "TRAIN_SCHEMAS", "SqlTask"]
