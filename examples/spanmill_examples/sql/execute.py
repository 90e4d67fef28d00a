"""Running one query read-only, within a time and a row limit, and comparing results.

Two locks keep a query from changing a database: the file is opened with
``mode=ro``, and an authorizer lets a statement only select, read and call
functions (a write, ATTACH, VACUUM, PRAGMA or transaction is refused before it
runs). A progress handler stops a query that runs past its time limit; a query
that returns more than ``max_rows`` rows is an error, not a silent truncation.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from spanmill.tasks.base import ToolError

QUERY_TIME_LIMIT_S: Final = 1.0
MAX_ROWS: Final = 200
MAX_QUERY_CHARS: Final = 2000
# Longest string or blob a query may build; stops zeroblob(1e9) and friends.
MAX_VALUE_BYTES: Final = 100_000
# The progress handler runs every this many virtual-machine instructions.
_PROGRESS_STEPS: Final = 1000
# Rows shown to the agent; more are counted, not shown.
SHOWN_ROWS: Final = 20
SHOWN_CHARS: Final = 80
# Numbers are equal when within this much: an answer rounded to cents still counts.
ABS_TOLERANCE: Final = 0.005 + 1e-9
REL_TOLERANCE: Final = 1e-6


class QueryError(ToolError):
    """A query that failed or was refused; the message goes back to the agent."""


@dataclass(frozen=True)
class QueryResult:
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


_ALLOWED_ACTIONS: Final = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
_REFUSED: Final[dict[int, str]] = {
    sqlite3.SQLITE_INSERT: "insert rows",
    sqlite3.SQLITE_UPDATE: "update rows",
    sqlite3.SQLITE_DELETE: "delete rows",
    sqlite3.SQLITE_CREATE_TABLE: "create a table",
    sqlite3.SQLITE_CREATE_TEMP_TABLE: "create a table",
    sqlite3.SQLITE_CREATE_INDEX: "create an index",
    sqlite3.SQLITE_CREATE_VIEW: "create a view",
    sqlite3.SQLITE_CREATE_TEMP_VIEW: "create a view",
    sqlite3.SQLITE_CREATE_TRIGGER: "create a trigger",
    sqlite3.SQLITE_CREATE_VTABLE: "create a virtual table",
    sqlite3.SQLITE_DROP_TABLE: "drop a table",
    sqlite3.SQLITE_DROP_TEMP_TABLE: "drop a table",
    sqlite3.SQLITE_DROP_INDEX: "drop an index",
    sqlite3.SQLITE_DROP_VIEW: "drop a view",
    sqlite3.SQLITE_DROP_TRIGGER: "drop a trigger",
    sqlite3.SQLITE_DROP_VTABLE: "drop a virtual table",
    sqlite3.SQLITE_ALTER_TABLE: "alter a table",
    sqlite3.SQLITE_ATTACH: "attach a database (or VACUUM)",
    sqlite3.SQLITE_DETACH: "detach a database",
    sqlite3.SQLITE_PRAGMA: "run a PRAGMA",
    sqlite3.SQLITE_TRANSACTION: "begin or end a transaction",
    sqlite3.SQLITE_SAVEPOINT: "use a savepoint",
    sqlite3.SQLITE_ANALYZE: "run ANALYZE",
    sqlite3.SQLITE_REINDEX: "run REINDEX",
}

_SCHEMA_TABLES: Final = frozenset(
    {"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"}
)


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that can only read ``path``; limits are the caller's to set."""
    if not path.is_file():
        raise QueryError(f"database {path.name} does not exist")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_QUERY_CHARS * 4)
    return conn


def run_query(
    path: Path,
    query: str,
    *,
    time_limit_s: float = QUERY_TIME_LIMIT_S,
    max_rows: int = MAX_ROWS,
) -> QueryResult:
    """The rows ``query`` returns from the database at ``path``, read-only.

    Raises QueryError, with a message for the agent, when the query is not one
    SELECT statement, fails, tries to change anything, runs past ``time_limit_s``
    or returns more than ``max_rows`` rows.
    """
    if not isinstance(query, str) or not query.strip():
        raise QueryError("the query is empty; write one SQLite SELECT statement")
    if len(query) > MAX_QUERY_CHARS:
        raise QueryError(
            f"the query is {len(query)} characters long, over the limit of {MAX_QUERY_CHARS}"
        )
    refused: list[str] = []

    def authorize(action: int, first: str | None, second: str | None, *_: Any) -> int:
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        target = second if action == sqlite3.SQLITE_ALTER_TABLE else first
        if target in _SCHEMA_TABLES:
            # CREATE and DROP show up first as writes to the schema table.
            refused.append("change the schema (create or drop a table, index or view)")
        else:
            what = _REFUSED.get(action, f"perform action {action}")
            refused.append(f"{what} ({target})" if target else what)
        return sqlite3.SQLITE_DENY

    deadline = time.monotonic() + time_limit_s
    timed_out = False

    def progress() -> int:
        nonlocal timed_out
        timed_out = time.monotonic() > deadline
        return 1 if timed_out else 0

    conn = connect_read_only(path)
    try:
        conn.set_authorizer(authorize)
        conn.set_progress_handler(progress, _PROGRESS_STEPS)
        try:
            cursor = conn.execute(query)
            fetched = cursor.fetchmany(max_rows + 1)
            columns = tuple(column[0] for column in cursor.description or ())
        except sqlite3.Error as exc:
            if refused:
                raise QueryError(
                    f"the query was refused: it tries to {refused[0]}; the database is "
                    "read-only and only SELECT statements run"
                ) from None
            if timed_out:
                raise QueryError(
                    f"the query ran past the time limit of {time_limit_s:g} s and was stopped; "
                    "simplify it (a missing join condition or an endless recursive CTE?)"
                ) from None
            if isinstance(exc, sqlite3.ProgrammingError) and "one statement" in str(exc):
                raise QueryError("send one SQL statement at a time") from None
            raise QueryError(f"SQLite error: {exc}") from None
    finally:
        conn.close()
    if not columns:
        raise QueryError("the statement returns no rows; write a SELECT query")
    if len(fetched) > max_rows:
        raise QueryError(
            f"the query returns more than {max_rows} rows; add a filter, an aggregate or a LIMIT"
        )
    return QueryResult(columns, tuple(tuple(row) for row in fetched))


# -- showing results --------------------------------------------------------------------


def format_value(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return repr(round(value, 4))
    if isinstance(value, bytes):
        return f"<blob of {len(value)} bytes>"
    text = str(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def format_row(row: Sequence[Any]) -> str:
    return " | ".join(format_value(value) for value in row)


def format_result(result: QueryResult) -> str:
    """The tool's reply: a header of column names, the rows (at most SHOWN_ROWS), a count."""
    lines = [" | ".join(result.columns)]
    lines += [format_row(row) for row in result.rows[:SHOWN_ROWS]]
    count = len(result.rows)
    if count > SHOWN_ROWS:
        lines.append(f"({count} rows; the first {SHOWN_ROWS} shown)")
    else:
        lines.append("(no rows)" if count == 0 else f"({count} row{'s' if count > 1 else ''})")
    return "\n".join(lines)


def answer_text(result: QueryResult) -> str:
    """A final answer written from rows: one value alone, else one row per line."""
    if len(result.rows) == 1 and len(result.columns) == 1:
        return format_value(result.rows[0][0])
    return "\n".join(format_row(row) for row in result.rows)


# -- comparing results ------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def same_value(got: Any, wanted: Any) -> bool:
    """Numbers within a small tolerance (3 and 3.0 alike); anything else exactly."""
    if _is_number(got) and _is_number(wanted):
        return math.isclose(got, wanted, rel_tol=REL_TOLERANCE, abs_tol=ABS_TOLERANCE)
    return type(got) is type(wanted) and bool(got == wanted)


def same_row(got: Sequence[Any], wanted: Sequence[Any]) -> bool:
    return len(got) == len(wanted) and all(map(same_value, got, wanted))


def result_difference(got: QueryResult, wanted: QueryResult, *, ordered: bool) -> str | None:
    """Why ``got`` is not ``wanted`` (None when it is): same rows, as a multiset
    unless ``ordered``; column names do not count, column count and values do."""
    if len(got.columns) != len(wanted.columns):
        return f"the query returns {len(got.columns)} columns, {len(wanted.columns)} wanted"
    if len(got.rows) != len(wanted.rows):
        return f"the query returns {len(got.rows)} rows, {len(wanted.rows)} wanted"
    if ordered:
        for index, (mine, theirs) in enumerate(zip(got.rows, wanted.rows, strict=True)):
            if not same_row(mine, theirs):
                return f"row {index + 1} is {format_row(mine)!r}, {format_row(theirs)!r} wanted"
        return None
    unmatched = list(got.rows)
    for row in wanted.rows:
        match = next((i for i, mine in enumerate(unmatched) if same_row(mine, row)), None)
        if match is None:
            return f"no row {format_row(row)!r} in the result"
        del unmatched[match]
    return None
