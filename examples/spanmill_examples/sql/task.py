"""The SQL agent's task: instances, prompts, the ``sql`` tool, the verifier."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

from spanmill import semconv as sc
from spanmill.tasks.base import (
    SPLITS,
    Message,
    PromptStyle,
    Score,
    Split,
    Task,
    TaskError,
    TaskInstance,
    ToolError,
    Verdict,
    collect_instances,
    extract_tool_call,
    is_example,
    message_text,
)
from spanmill_examples.sql.databases import (
    DATABASES_PER_SCHEMA,
    SCHEMAS,
    DatabaseStore,
    database_name,
)
from spanmill_examples.sql.execute import (
    QueryError,
    QueryResult,
    answer_text,
    format_result,
    result_difference,
    run_query,
)
from spanmill_examples.sql.questions import TEMPLATES, Template, Value

TOOL_NAME: Final = "sql"
# Held-out questions are asked about schemas the train split never shows.
TRAIN_SCHEMAS: Final = ("shops", "schools", "flights", "hotels")
HELDOUT_SCHEMAS: Final = ("clinics", "libraries")
SPLIT_SCHEMAS: Final[dict[Split, tuple[str, ...]]] = {
    "train": TRAIN_SCHEMAS,
    "heldout": HELDOUT_SCHEMAS,
}
# Value draws before a template gives up and lets another (database, template) try.
_DRAWS_PER_TEMPLATE: Final = 20
_DRAWS_PER_INSTANCE: Final = 1000

SYSTEM_PROMPT: Final = (
    "You are a SQL agent. You answer questions about a SQLite database by querying it.\n"
    "First reply with only a JSON tool call and nothing else:\n"
    '{"tool": "sql", "query": "<one SQLite SELECT statement>"}\n'
    "The query's rows, or its error, come back in the next message. If the query failed, "
    "reply with a corrected tool call. Then reply with the answer, taken from the rows.\n"
    "Select exactly the columns the question asks for. The database is read-only."
)


@dataclass(frozen=True)
class Example:
    """A worked example for the few-shot prompt; ``first_try`` a query that fails first."""

    schema: str
    db_seed: int
    template: str
    values: Mapping[str, Value]
    first_try: str | None = None


FEW_SHOT_EXAMPLES: Final = (
    Example("shops", 0, "customers-in-city", {"city": "Porto"}),
    Example(
        "shops",
        0,
        "most-expensive-products",
        {"k": 3},
        first_try="SELECT name, cost FROM products ORDER BY cost DESC LIMIT 3",
    ),
)


def tool_call_content(query: str) -> str:
    """The JSON content of an sql call in the content form."""
    return json.dumps({"tool": TOOL_NAME, "query": query})


def table_summary(schema: str) -> str:
    """The tables and their columns on one line: ``customers(id, name), ...``."""
    tables = []
    for statement in SCHEMAS[schema].tables:
        lines = statement.splitlines()
        columns = [
            line.split()[0] for line in lines[1:-1] if not line.strip().startswith("PRIMARY")
        ]
        tables.append(f"{lines[0].split()[2]}({', '.join(columns)})")
    return ", ".join(tables)


class SqlTask(Task):
    """Questions about generated SQLite databases, answered with read-only queries."""

    name: ClassVar[str] = "sql"
    agent_name: ClassVar[str] = "sql"
    prompt_version: ClassVar[str] = "1"

    def __init__(self, data_dir: Path | None = None) -> None:
        self.databases = DatabaseStore(data_dir)
        self._few_shot: list[Message] | None = None

    # -- instances ----------------------------------------------------------------------

    def database(self, instance: TaskInstance) -> Path:
        """The database file an instance's questions are about."""
        schema, seed = instance.data.get("schema"), instance.data.get("db_seed")
        if instance.task != self.name or not isinstance(schema, str) or not isinstance(seed, int):
            raise TaskError(
                f"instance {instance.id!r} is not an {self.name} instance: its data names no "
                "schema and database seed"
            )
        return self.databases.path(schema, seed)

    def make_instance(
        self, schema: str, db_seed: int, template_id: str, values: Mapping[str, Value]
    ) -> TaskInstance:
        """The instance of a template on database ``schema``-``db_seed`` with given values."""
        template = next((t for t in TEMPLATES.get(schema, ()) if t.id == template_id), None)
        if template is None:
            raise TaskError(f"no {self.name} template {template_id!r} for schema {schema!r}")
        return self._instance(schema, db_seed, template, values)[0]

    def _instance(
        self, schema: str, db_seed: int, template: Template, values: Mapping[str, Value]
    ) -> tuple[TaskInstance, QueryResult]:
        path = self.databases.path(schema, db_seed)
        gold = template.gold(values)
        try:
            result = run_query(path, gold)
        except QueryError as exc:
            raise TaskError(f"the gold query of {template.id!r} fails: {exc}") from None
        database = database_name(schema, db_seed)
        # Only what a question is made of goes into its id: equal questions, equal ids.
        canonical = ",".join(f"{name}={values[name]}" for name in sorted(values))
        instance = TaskInstance(
            task=self.name,
            id=f"{self.name}/{database}/{template.id}/{canonical}".rstrip("/"),
            question=template.question(values),
            answer=answer_text(result),
            data={
                "schema": schema,
                "db_seed": db_seed,
                "database": database,
                "template": template.id,
                "values": dict(values),
                "sql": gold,
                "ordered": template.ordered,
            },
        )
        return instance, result

    def _draw(self, rng: random.Random, schemas: Sequence[str]) -> TaskInstance:
        for _ in range(_DRAWS_PER_INSTANCE):
            schema = rng.choice(schemas)
            db_seed = rng.randrange(DATABASES_PER_SCHEMA)
            template = rng.choice(TEMPLATES[schema])
            path = self.databases.path(schema, db_seed)
            for _ in range(_DRAWS_PER_TEMPLATE):
                values = template.draw(rng, path)
                instance, result = self._instance(schema, db_seed, template, values)
                if template.acceptable(path, values, result):
                    return instance
        raise TaskError(f"no acceptable question on {', '.join(schemas)} in many draws")

    def instances(self, split: Split, n: int, seed: int = 0) -> list[TaskInstance]:
        """Train instances come from TRAIN_SCHEMAS, held-out ones from HELDOUT_SCHEMAS."""
        if split not in SPLITS:
            raise TaskError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        schemas = SPLIT_SCHEMAS[split]
        return collect_instances(
            lambda rng: self._draw(rng, schemas),
            task=self.name,
            split=split,
            n=n,
            seed=seed,
            # The split is the schema's, not the id hash's: every draw is on its side.
            heldout_percent=0 if split == "train" else 100,
        )

    # -- prompts ------------------------------------------------------------------------

    def system_prompt(self, style: PromptStyle) -> str:
        """The protocol; :meth:`messages` adds the instance's schema below it."""
        return SYSTEM_PROMPT

    def messages(self, instance: TaskInstance, style: PromptStyle) -> list[Message]:
        opening = super().messages(instance, style)
        schema = str(instance.data.get("schema"))
        if schema not in SCHEMAS:
            raise TaskError(f"instance {instance.id!r} names no {self.name} schema")
        opening[0] = {
            "role": "system",
            "content": f"{self.system_prompt(style)}\n\nThe database:\n{SCHEMAS[schema].ddl}",
        }
        return opening

    def few_shot_turns(self, instance: TaskInstance) -> list[Message]:
        if self._few_shot is None:
            self._few_shot = self._example_turns()
        return [dict(turn) for turn in self._few_shot]

    def _example_turns(self) -> list[Message]:
        turns: list[Message] = []
        for number, example in enumerate(FEW_SHOT_EXAMPLES, 1):
            instance = self.make_instance(
                example.schema, example.db_seed, example.template, example.values
            )
            question = (
                f"(An example on another database, with the tables "
                f"{table_summary(example.schema)}.)\n{instance.question}"
            )
            turns.append({"role": "user", "content": question})
            tries = [example.first_try] if example.first_try else []
            for attempt, query in enumerate([*tries, str(instance.data["sql"])], 1):
                try:
                    result = self.run_episode_tool(instance, TOOL_NAME, {"query": query})
                except ToolError as exc:
                    result = f"error: {exc}"
                turns += [
                    {"role": "assistant", "content": tool_call_content(query)},
                    {
                        "role": "tool",
                        "tool_call_id": f"example-{number}-{attempt}",
                        "content": result,
                    },
                ]
            turns.append({"role": "assistant", "content": instance.answer})
        for turn in turns:
            turn[sc.SPANMILL_MESSAGE_EXAMPLE] = True
        return turns

    # -- the tool -----------------------------------------------------------------------

    def tools(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": TOOL_NAME,
                    "description": (
                        "Run one read-only SQLite SELECT statement on the database and "
                        "return its rows."
                    ),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "query": {
                                "type": "string",
                                "description": "One SQLite SELECT statement.",
                            }
                        },
                        "required": ["query"],
                        "additionalProperties": False,
                    },
                },
            }
        ]

    def run_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        raise ToolError(
            f"the {TOOL_NAME} tool queries the database of an episode's instance; run it "
            "through run_episode_tool"
        )

    def run_episode_tool(
        self, instance: TaskInstance, name: str, arguments: Mapping[str, Any]
    ) -> str:
        return format_result(self._query(name, arguments, self.database(instance)))

    def _query(self, name: str, arguments: Mapping[str, Any], database: Path) -> QueryResult:
        if name != TOOL_NAME:
            raise ToolError(f"unknown tool {name!r}; the only tool is {TOOL_NAME!r}")
        query = arguments.get("query")
        if not isinstance(query, str):
            raise ToolError('the sql tool needs {"query": "<one SQLite SELECT statement>"}')
        return run_query(database, query)

    # -- solutions and judging ----------------------------------------------------------

    def reference_transcript(self, instance: TaskInstance) -> list[Message]:
        query = str(instance.data["sql"])
        return [
            {"role": "user", "content": instance.question},
            {"role": "assistant", "content": tool_call_content(query)},
            {
                "role": "tool",
                "content": self.run_episode_tool(instance, TOOL_NAME, {"query": query}),
            },
            {"role": "assistant", "content": instance.answer},
        ]

    def verify(self, instance: TaskInstance, transcript: Sequence[Mapping[str, Any]]) -> Verdict:
        """``success`` (the episode): the last query's rows are the gold query's, and an
        answer follows them; ``valid_query`` (each call's turn): the query ran.

        Every query is run again here on the instance's database: what the
        transcript's tool messages say is not taken on trust.
        """
        database = self.database(instance)
        try:
            gold = run_query(database, str(instance.data["sql"]))
        except QueryError as exc:
            raise TaskError(f"the gold query of {instance.id!r} fails: {exc}") from None
        turns = [m for m in transcript if m.get("role") == "assistant" and not is_example(m)]
        scores: list[Score] = []
        last: tuple[int, QueryResult | None, str] | None = None
        for index, turn in enumerate(turns):
            call = extract_tool_call(turn)
            if call is None:
                continue
            try:
                result: QueryResult | None = self._query(call.name, call.arguments, database)
                error = ""
            except ToolError as exc:
                result, error = None, str(exc)
            scores.append(Score("valid_query", float(result is not None), turn=index))
            last = (index, result, error)
        success = False
        if last is None:
            scores.append(Score("valid_query", 0.0, turn=0))
            said = message_text(turns[0]).strip()[:80] if turns else ""
            explanation = (
                f"no sql call: expected JSON like {tool_call_content('SELECT ...')}, got {said!r}"
                if turns
                else "there is no assistant turn"
            )
        else:
            index, result, error = last
            ordered = bool(instance.data.get("ordered"))
            difference = (
                None if result is None else result_difference(result, gold, ordered=ordered)
            )
            if result is None:
                explanation = f"the last query failed: {error}"
            elif difference is not None:
                explanation = f"the last query's rows are not the answer's: {difference}"
            elif index == len(turns) - 1:
                explanation = "no answer after the last query's rows"
            elif not message_text(turns[-1]).strip():
                explanation = "the final answer is empty"
            else:
                success = True
                explanation = "correct"
        return Verdict(
            scores=(Score("success", float(success), primary=True), *scores),
            explanation=explanation,
        )
