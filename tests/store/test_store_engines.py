"""The store as other engines read it: DuckDB and pyarrow datasets, hive partitioning,
the documented types, and the live file list that keeps every span once."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
from store_samples import BASE_NS
from store_upkeep import HOUR_NS, Feeder, hour_span
from typer.testing import CliRunner

from spanmill.cli.main import app
from spanmill.store import SPAN_SCHEMA, SpanStore
from spanmill.store.compact import Compactor

HOUR0 = BASE_NS - BASE_NS % HOUR_NS


def _store(root: Path) -> Feeder:
    feeder = Feeder(str(root))
    for hour in range(2):
        for batch in range(3):
            feeder.write([hour_span(HOUR0 + hour * HOUR_NS, hour * 100 + batch * 10 + i)
                          for i in range(10)])  # fmt: skip
    return feeder


def test_duckdb_and_pyarrow_read_the_tree_with_hive_partitions(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root)
    table = ds.dataset(root, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 60
    for field in SPAN_SCHEMA:
        assert table.schema.field(field.name).type == field.type, field.name
    assert set(table.column("dt").to_pylist()) == {"2025-06-15"}
    assert set(table.column("hour").to_pylist()) == {15, 16}
    described = duckdb.sql(
        f"DESCRIBE SELECT * FROM read_parquet('{root}/**/*.parquet', hive_partitioning=true)"
    ).fetchall()
    types = {row[0]: row[1] for row in described}
    assert types["start_time"] == "TIMESTAMPTZ_NS" and types["dt"] == "DATE"
    assert types["rewards"].startswith("STRUCT(") and types["prompt_token_ids"] == "BIGINT[]"
    by_hour = duckdb.sql(
        f"SELECT hour, count(*) FROM read_parquet('{root}/**/*.parquet', hive_partitioning=true) "
        "GROUP BY hour ORDER BY hour"
    ).fetchall()
    assert by_hour == [(15, 30), (16, 30)]


def test_the_live_file_list_keeps_every_span_once_across_compaction(tmp_path: Path) -> None:
    root = tmp_path / "store"
    feeder = _store(root)
    Compactor(str(root), settle_s=0).run()
    feeder.replay(feeder.jobs[0])  # a replayed batch: its file is back, and replaced
    raw = duckdb.sql(f"SELECT count(*) FROM read_parquet('{root}/**/*.parquet')").fetchall()
    assert raw == [(70,)]  # the raw tree holds the replayed file's rows a second time
    result = CliRunner().invoke(app, ["store", "files", "--store", str(root)])
    assert result.exit_code == 0, result.output
    live = result.output.split()
    assert len(live) == 2 and all("compacted-" in path for path in live)
    paths = [path.removeprefix("file://") for path in live]
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet({paths})").fetchall() == [(60,)]
    assert SpanStore(str(root)).count() == 60


def test_the_macros_answer_the_common_questions(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root)
    store = SpanStore(str(root))
    per_day = store.query("SELECT * FROM episodes_per_agent_per_day()").to_pylist()
    assert sum(row["spans"] for row in per_day) == 60
    assert {row["agent"] for row in per_day} == {"calculator", "planner"}
    calls = store.query("SELECT count(*) AS n FROM llm_calls()").to_pylist()[0]["n"]
    assert calls == 60  # every sample span is a chat call
    result = CliRunner().invoke(
        app, ["store", "query", "--store", str(root), "SELECT * FROM episodes_per_agent_per_day()"]
    )
    assert result.exit_code == 0 and "calculator" in result.output
    assert isinstance(store.query("SELECT * FROM reward_by_model_version(NULL)"), pa.Table)
