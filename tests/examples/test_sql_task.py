"""The SQL agent's task: its databases, its read-only query runner, its questions,
prompts and verifier."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from spanmill_examples.sql import HELDOUT_SCHEMAS, TRAIN_SCHEMAS, SqlTask
from spanmill_examples.sql.databases import SCHEMAS, DatabaseStore
from spanmill_examples.sql.execute import (
    MAX_ROWS,
    SHOWN_ROWS,
    QueryError,
    QueryResult,
    format_result,
    result_difference,
    run_query,
    same_value,
)
from spanmill_examples.sql.questions import TEMPLATES
from spanmill_examples.sql.task import FEW_SHOT_EXAMPLES, tool_call_content

from spanmill import semconv as sc
from spanmill.tasks import TaskError, TaskInstance, ToolError, find_task, get_task
from spanmill.tasks.loop import EpisodeLoop
from spanmill.train.reference import reference_rows


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> SqlTask:
    return SqlTask(tmp_path_factory.mktemp("sql-databases"))


@pytest.fixture(scope="module")
def shops(task: SqlTask) -> Path:
    return task.databases.path("shops", 0)


def rows_of(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        names = [
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        ]
        return {
            name: conn.execute(f"SELECT * FROM {name} ORDER BY rowid").fetchall() for name in names
        }
    finally:
        conn.close()


def acceptable(task: SqlTask, instance: TaskInstance) -> bool:
    """Whether a hand-made instance is one the task could have drawn."""
    data = instance.data
    template = next(t for t in TEMPLATES[data["schema"]] if t.id == data["template"])
    database = task.database(instance)
    return template.acceptable(database, data["values"], run_query(database, data["sql"]))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the plugin and its databases ------------------------------------------------------


def test_the_registry_finds_the_sql_task_by_name_and_by_agent() -> None:
    assert isinstance(get_task("sql"), SqlTask)
    assert isinstance(find_task("sql"), SqlTask)


def test_a_database_is_the_same_for_the_same_seed_wherever_it_is_built(tmp_path: Path) -> None:
    first = DatabaseStore(tmp_path / "a").path("clinics", 3)
    second = DatabaseStore(tmp_path / "b").path("clinics", 3)
    other = DatabaseStore(tmp_path / "a").path("clinics", 4)
    assert rows_of(first) == rows_of(second)
    assert rows_of(first) != rows_of(other)
    # Built once, then reused as it is; the file itself is read-only.
    assert DatabaseStore(tmp_path / "a").path("clinics", 3) == first
    assert not first.stat().st_mode & 0o222


def test_every_schema_has_related_tables_with_rows(task: SqlTask) -> None:
    assert {"shops", "schools", "clinics", "flights", "libraries"} <= set(SCHEMAS)
    for name, schema in SCHEMAS.items():
        held = rows_of(task.databases.path(name, 0))
        assert list(held) == schema.table_names
        assert len(held) >= 3 and all(len(rows) >= 3 for rows in held.values()), name
        assert "REFERENCES" in schema.ddl, name


def test_unknown_databases_are_refused(task: SqlTask) -> None:
    with pytest.raises(TaskError, match="no SQL schema 'zoos'"):
        task.databases.path("zoos", 0)
    with pytest.raises(TaskError, match="database seeds run from 0 to 7, got 8"):
        task.databases.path("shops", 8)


# -- the query runner ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "refused"),
    [
        (
            "INSERT INTO customers VALUES (999, 'Eve', 'Lyon', '2024-01-01')",
            r"insert rows \(customers\)",
        ),
        ("UPDATE products SET price = 0", "update rows"),
        ("DELETE FROM orders", r"delete rows \(orders\)"),
        ("DROP TABLE customers", "change the schema"),
        ("CREATE TABLE notes (x)", "change the schema"),
        ("CREATE TRIGGER t AFTER INSERT ON orders BEGIN SELECT 1; END", "create a trigger"),
        ("ALTER TABLE customers ADD COLUMN vip INTEGER", r"alter a table \(customers\)"),
        ("ATTACH DATABASE 'elsewhere.db' AS other", "attach a database"),
        ("VACUUM INTO 'copy.db'", "attach a database"),
        ("PRAGMA journal_mode = DELETE", r"run a PRAGMA \(journal_mode\)"),
        ("BEGIN", "begin or end a transaction"),
        ("WITH doomed AS (SELECT id FROM orders) DELETE FROM orders WHERE id IN doomed", "delete"),
    ],
)
def test_a_query_that_tries_to_write_is_refused_and_changes_nothing(
    shops: Path, query: str, refused: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    before, held = digest(shops), rows_of(shops)
    with pytest.raises(
        QueryError, match=rf"the query was refused: it tries to {refused}.*read-only"
    ):
        run_query(shops, query)
    assert digest(shops) == before and rows_of(shops) == held
    assert list(tmp_path.iterdir()) == []


def test_a_runaway_query_stops_at_the_time_limit(shops: Path) -> None:
    endless = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT COUNT(*) FROM n"
    )
    with pytest.raises(QueryError, match=r"ran past the time limit of 0\.2 s and was stopped"):
        run_query(shops, endless, time_limit_s=0.2)
    cross = "SELECT COUNT(*) FROM order_items a, order_items b, order_items c, order_items d"
    with pytest.raises(QueryError, match="time limit"):
        run_query(shops, cross, time_limit_s=0.2)


def test_rows_are_capped(shops: Path) -> None:
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT x FROM n"
    with pytest.raises(QueryError, match=f"returns more than {MAX_ROWS} rows; add a filter"):
        run_query(shops, endless)
    with pytest.raises(QueryError, match="more than 10 rows"):
        run_query(shops, "SELECT id FROM orders", max_rows=10)
    many = run_query(shops, "SELECT id, status FROM orders")
    shown = format_result(many).splitlines()
    assert shown[0] == "id | status"
    assert len(shown) == 1 + SHOWN_ROWS + 1
    assert shown[-1] == f"({len(many.rows)} rows; the first {SHOWN_ROWS} shown)"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT * FROM nowhere", "SQLite error: no such table: nowhere"),
        ("SELECT cost FROM products", "SQLite error: no such column: cost"),
        ("SELECT 1; SELECT 2", "one SQL statement at a time"),
        ("   ", "the query is empty"),
        ("SELECT " + "1 + " * 600 + "1", "over the limit of 2000"),
        ("SELECT length(zeroblob(1000000000))", "SQLite error: string or blob too big"),
    ],
)
def test_bad_queries_get_a_clear_error(shops: Path, query: str, message: str) -> None:
    with pytest.raises(QueryError, match=re.escape(message)):
        run_query(shops, query)


def test_results_are_shown_compactly(shops: Path) -> None:
    result = QueryResult(("name", "price", "note"), (("Kite", 12.5, None), ("Webcam", 40.0, "x")))
    assert (
        format_result(result)
        == "name | price | note\nKite | 12.5 | NULL\nWebcam | 40.0 | x\n(2 rows)"
    )
    empty = run_query(shops, "SELECT name FROM customers WHERE city = 'Atlantis'")
    assert format_result(empty) == "name\n(no rows)"


@pytest.mark.parametrize(
    ("got", "wanted", "same"),
    [
        (3, 3.0, True),
        (45.12, 45.123333, True),  # rounded to cents
        (45.13, 45.123333, False),
        (1e6 + 0.5, 1e6 + 0.5000001, True),
        ("3", 3, False),
        ("Lyon", "lyon", False),
        (None, None, True),
        (None, 0, False),
        (True, 1, False),
    ],
)
def test_values_compare_numbers_with_a_small_tolerance(got: Any, wanted: Any, same: bool) -> None:
    assert same_value(got, wanted) is same


def test_results_compare_as_multisets_unless_ordered() -> None:
    wanted = QueryResult(("city", "n"), (("Lyon", 2), ("Porto", 2), ("Lyon", 2)))
    shuffled = QueryResult(("c", "count"), (("Porto", 2), ("Lyon", 2), ("Lyon", 2)))
    assert result_difference(shuffled, wanted, ordered=False) is None
    assert result_difference(shuffled, wanted, ordered=True) == (
        "row 1 is 'Porto | 2', 'Lyon | 2' wanted"
    )
    # A multiset: the duplicate row counts.
    once = QueryResult(("city", "n"), (("Porto", 2), ("Lyon", 2), ("Porto", 2)))
    assert result_difference(once, wanted, ordered=False) == "no row 'Lyon | 2' in the result"
    wider = QueryResult(("city", "n", "x"), tuple((*row, 1) for row in wanted.rows))
    assert (
        result_difference(wider, wanted, ordered=False) == "the query returns 3 columns, 2 wanted"
    )


# -- instances -------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_instances(task: SqlTask) -> None:
    assert task.instances("train", 30, seed=3) == task.instances("train", 30, seed=3)
    assert task.instances("train", 30, seed=3) != task.instances("train", 30, seed=4)
    assert task.instances("heldout", 25, seed=1)[:10] == task.instances("heldout", 10, seed=1)


def test_heldout_questions_are_about_schemas_train_never_shows(task: SqlTask) -> None:
    assert not set(TRAIN_SCHEMAS) & set(HELDOUT_SCHEMAS)
    assert set(TRAIN_SCHEMAS) | set(HELDOUT_SCHEMAS) == set(SCHEMAS)
    train = task.instances("train", 200, seed=5)
    heldout = task.instances("heldout", 200, seed=5)
    assert {i.data["schema"] for i in train} == set(TRAIN_SCHEMAS)
    assert {i.data["schema"] for i in heldout} == set(HELDOUT_SCHEMAS)
    train_tables = {name for s in TRAIN_SCHEMAS for name in SCHEMAS[s].table_names}
    heldout_tables = {name for s in HELDOUT_SCHEMAS for name in SCHEMAS[s].table_names}
    assert not train_tables & heldout_tables


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_every_gold_query_runs_and_every_reference_solution_succeeds(
    task: SqlTask, split: str
) -> None:
    instances = task.instances(split, 200, seed=0)  # type: ignore[arg-type]
    assert len({i.id for i in instances}) == 200
    assert len({i.data["template"] for i in instances}) >= 15
    kinds = " ".join(str(i.data["sql"]) for i in instances)
    for kind in ("JOIN", "GROUP BY", "ORDER BY", "LIMIT", "COUNT(", "AVG(", "SUM(", "WHERE"):
        assert kind in kinds, kind
    for instance in instances:
        assert "{" not in instance.question and instance.answer
        gold = run_query(task.database(instance), instance.data["sql"])
        assert 1 <= len(gold.rows) <= 12
        transcript = task.reference_transcript(instance)
        assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "assistant"]
        assert transcript[1]["content"] == tool_call_content(instance.data["sql"])
        assert transcript[-1]["content"] == instance.answer
        verdict = task.verify(instance, transcript)
        assert verdict.rewards == {"success": 1.0, "valid_query": 1.0}, (instance.id, verdict)


def test_ordered_questions_have_no_ties(task: SqlTask) -> None:
    ordered = [i for i in task.instances("train", 200, seed=2) if i.data["ordered"]]
    assert ordered
    for instance in ordered:
        template = next(
            t for t in TEMPLATES[instance.data["schema"]] if t.id == instance.data["template"]
        )
        assert template.order_key is not None
        keys = [
            row[template.order_key]
            for row in run_query(task.database(instance), instance.data["sql"]).rows
        ]
        assert len(set(keys)) == len(keys)


def test_the_same_question_has_the_same_id_however_it_was_made(task: SqlTask) -> None:
    drawn = task.instances("heldout", 1, seed=0)[0]
    data = drawn.data
    assert (
        task.make_instance(data["schema"], data["db_seed"], data["template"], data["values"])
        == drawn
    )
    with pytest.raises(TaskError, match="no sql template 'nope' for schema 'shops'"):
        task.make_instance("shops", 0, "nope", {})


def test_bad_requests_for_instances_are_refused(task: SqlTask) -> None:
    with pytest.raises(TaskError, match="split must be one of train, heldout"):
        task.instances("test", 1)  # type: ignore[arg-type]
    with pytest.raises(TaskError, match="must not be negative"):
        task.instances("train", -1)
    assert task.instances("train", 0) == []


# -- the tool and the prompts ----------------------------------------------------------


def test_the_tool_runs_on_the_instances_database(task: SqlTask) -> None:
    instance = task.make_instance("shops", 0, "customers-in-city", {"city": "Porto"})
    assert task.run_episode_tool(
        instance, "sql", {"query": "SELECT COUNT(*) FROM customers WHERE city = 'Porto'"}
    ) == ("COUNT(*)\n2\n(1 row)")
    with pytest.raises(ToolError, match="unknown tool 'calculator'"):
        task.run_episode_tool(instance, "calculator", {"query": "SELECT 1"})
    with pytest.raises(ToolError, match="needs"):
        task.run_episode_tool(instance, "sql", {"sql": "SELECT 1"})
    with pytest.raises(ToolError, match="database of an episode's instance"):
        task.run_tool("sql", {"query": "SELECT 1"})
    (schema,) = task.tools()
    assert schema["function"]["name"] == "sql"
    assert schema["function"]["parameters"]["required"] == ["query"]


def test_the_system_prompt_shows_the_instances_schema_and_few_shot_only_adds_examples(
    task: SqlTask,
) -> None:
    instance = task.instances("heldout", 1, seed=0)[0]
    zero = task.messages(instance, "zero_shot")
    few = task.messages(instance, "few_shot")
    assert [m["role"] for m in zero] == ["system", "user"]
    assert zero[0] == few[0] and zero[-1] == few[-1]
    assert [m for m in few if sc.SPANMILL_MESSAGE_EXAMPLE not in m] == zero
    system = zero[0]["content"]
    assert '{"tool": "sql", "query":' in system
    assert SCHEMAS[instance.data["schema"]].ddl in system
    assert "CREATE TABLE customers" not in system
    with pytest.raises(TaskError, match="prompt style"):
        task.messages(instance, "chain_of_thought")  # type: ignore[arg-type]


def test_few_shot_turns_are_marked_and_pass_the_verifier(task: SqlTask) -> None:
    turns = task.few_shot_turns(task.instances("train", 1)[0])
    assert all(turn[sc.SPANMILL_MESSAGE_EXAMPLE] is True for turn in turns)
    users = [i for i, turn in enumerate(turns) if turn["role"] == "user"]
    assert len(users) == len(FEW_SHOT_EXAMPLES)
    for start, end, example in zip(users, [*users[1:], len(turns)], FEW_SHOT_EXAMPLES, strict=True):
        instance = task.make_instance(
            example.schema, example.db_seed, example.template, example.values
        )
        shown = [
            {key: value for key, value in turn.items() if key != sc.SPANMILL_MESSAGE_EXAMPLE}
            for turn in turns[start:end]
        ]
        assert shown[0]["content"].endswith(instance.question)
        assert acceptable(task, instance)
        verdict = task.verify(instance, shown)
        assert verdict["success"] == 1.0, verdict.explanation
        calls = [score.value for score in verdict.scores if score.name == "valid_query"]
        assert calls == ([0.0, 1.0] if example.first_try else [1.0])


# -- the verifier ----------------------------------------------------------------------


def assistant(content: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def call(query: str) -> dict[str, Any]:
    return assistant(tool_call_content(query))


def tool(content: str = "rows") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "call_1", "content": content}


def native_call(query: str) -> dict[str, Any]:
    function = {"name": "sql", "arguments": json.dumps({"query": query})}
    return assistant(None, tool_calls=[{"id": "call_1", "type": "function", "function": function}])


def hand_made(task: SqlTask, template: str, values: dict[str, Any]) -> TaskInstance:
    instance = task.make_instance("shops", 0, template, values)
    assert acceptable(task, instance)
    return instance


@pytest.fixture(scope="module")
def per_city(task: SqlTask) -> TaskInstance:
    return hand_made(task, "customers-per-city", {})


@pytest.fixture(scope="module")
def top_products(task: SqlTask) -> TaskInstance:
    return hand_made(task, "most-expensive-products", {"k": 3})


@pytest.fixture(scope="module")
def average(task: SqlTask) -> TaskInstance:
    return hand_made(task, "average-price-in-category", {"category": "electronics"})


PER_CITY = "SELECT city, COUNT(*) FROM customers GROUP BY city"
TOP = "SELECT name, price FROM products ORDER BY price DESC LIMIT 3"
AVERAGE = "SELECT AVG(price) FROM products WHERE category = 'electronics'"

VERDICTS = [
    ("per_city", "the gold query", [call(PER_CITY), tool(), assistant("done")], 1, 1),
    (
        "per_city",
        "same rows in another order, other column names",
        [
            call(
                "SELECT city AS town, COUNT(id) AS n FROM customers GROUP BY city "
                "ORDER BY n, town DESC"
            ),
            tool(),
            assistant("ok"),
        ],
        1,
        1,
    ),
    ("per_city", "the tool_calls form", [native_call(PER_CITY), tool(), assistant("ok")], 1, 1),
    (
        "per_city",
        "a wrong column",
        [call("SELECT city, MAX(id) FROM customers GROUP BY city"), tool(), assistant("ok")],
        0,
        1,
    ),
    (
        "per_city",
        "a missing column",
        [call("SELECT city FROM customers GROUP BY city"), tool(), assistant("ok")],
        0,
        1,
    ),
    (
        "per_city",
        "an error",
        [call("SELECT town, COUNT(*) FROM customers GROUP BY town"), tool(), assistant("ok")],
        0,
        0,
    ),
    (
        "per_city",
        "a retry that fixes the error",
        [
            call("SELECT town, COUNT(*) FROM customers GROUP BY town"),
            tool(),
            call(PER_CITY),
            tool(),
            assistant("ok"),
        ],
        1,
        1,
    ),
    (
        "per_city",
        "a right query, then a failing one",
        [call(PER_CITY), tool(), call("SELECT town FROM customers"), tool(), assistant("ok")],
        0,
        0,
    ),
    ("per_city", "no answer after the rows", [call(PER_CITY), tool()], 0, 1),
    ("per_city", "an empty answer", [call(PER_CITY), tool(), assistant("  ")], 0, 1),
    ("per_city", "prose instead of a query", [assistant("Lyon has 5 customers.")], 0, 0),
    ("per_city", "nothing said", [], 0, 0),
    ("per_city", "a write", [call("DELETE FROM customers"), tool(), assistant("ok")], 0, 0),
    ("top_products", "the gold order", [call(TOP), tool(), assistant("ok")], 1, 1),
    (
        "top_products",
        "the right rows in the wrong order",
        [call("SELECT name, price FROM (" + TOP + ") ORDER BY price ASC"), tool(), assistant("ok")],
        0,
        1,
    ),
    (
        "top_products",
        "the cheapest instead",
        [call("SELECT name, price FROM products ORDER BY price LIMIT 3"), tool(), assistant("ok")],
        0,
        1,
    ),
    ("average", "the exact average", [call(AVERAGE), tool(), assistant("ok")], 1, 1),
    (
        "average",
        "the average rounded to cents",
        [call(AVERAGE.replace("AVG(price)", "ROUND(AVG(price), 2)")), tool(), assistant("ok")],
        1,
        1,
    ),
    (
        "average",
        "another average",
        [call(AVERAGE.replace("electronics", "toys")), tool(), assistant("ok")],
        0,
        1,
    ),
]


@pytest.mark.parametrize(
    ("which", "turns", "success", "valid_query"),
    [pytest.param(w, t, s, v, id=name) for w, name, t, s, v in VERDICTS],
)
def test_the_verifier_compares_the_last_querys_rows_with_the_gold_ones(
    task: SqlTask,
    request: pytest.FixtureRequest,
    which: str,
    turns: list[dict[str, Any]],
    success: int,
    valid_query: int,
) -> None:
    instance = request.getfixturevalue(which)
    verdict = task.verify(instance, [{"role": "user", "content": instance.question}, *turns])
    assert verdict.rewards == {"success": success, "valid_query": valid_query}, verdict.explanation
    assert verdict.explanation


def test_each_query_gets_its_own_valid_query_score_on_its_turn(
    task: SqlTask, per_city: TaskInstance
) -> None:
    bad = "SELECT town, COUNT(*) FROM customers GROUP BY town"
    verdict = task.verify(per_city, [call(bad), tool(), call(PER_CITY), tool(), assistant("ok")])
    assert [(s.name, s.value, s.turn, s.primary) for s in verdict.scores] == [
        ("success", 1.0, None, True),
        ("valid_query", 0.0, 0, False),
        ("valid_query", 1.0, 1, False),
    ]
    write = task.verify(per_city, [call("DROP TABLE customers"), tool(), assistant("ok")])
    assert write.explanation.startswith("the last query failed: the query was refused")


def test_the_episode_loop_runs_queries_on_the_instances_database(
    task: SqlTask, per_city: TaskInstance
) -> None:
    loop = EpisodeLoop(task, per_city)
    request = loop.add_reply(call("SELECT town FROM customers"))
    assert request is not None
    outcome = loop.run_tool(request)
    assert outcome.content == "error: SQLite error: no such column: town"
    loop.add_tool_result("call_1", outcome.content)
    request = loop.add_reply(call(PER_CITY))
    assert request is not None
    outcome = loop.run_tool(request)
    assert outcome.error is None and outcome.content.startswith("city | COUNT(*)\n")
    loop.add_tool_result("call_2", outcome.content)
    assert loop.add_reply(assistant(per_city.answer)) is None and loop.done
    assert loop.verdict().rewards == {"success": 1.0, "valid_query": 1.0}


def test_reference_solutions_make_a_distillation_dataset(task: SqlTask) -> None:
    instances = task.instances("train", 3, seed=0)
    rows = reference_rows(task, instances)
    assert len(rows) == 2 * len(instances)
    first = rows[0]
    assert (
        first["prompt"][0]["role"] == "system" and "CREATE TABLE" in first["prompt"][0]["content"]
    )
    assert first["completion"][0]["content"] == tool_call_content(instances[0].data["sql"])
