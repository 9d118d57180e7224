"""Many-row statements: a plan of 10,000 partitions inserts 10,000 ranges and updates 10,000
partition rows, each in one statement.

On PostgreSQL the rows go as one array per column, joined back into rows by ``unnest``: one
statement, one round trip, parsed once. SQLAlchemy's many-row ``INSERT … VALUES`` sends a statement
per 1,000 rows with 8 parameters a row, and ``executemany`` an ``UPDATE`` per row, 10,000 round trips
(1.4-1.6 s each, bench/ledger_growth.py). Elsewhere (SQLite, in-process: no round trips) one
statement run once per row by the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Table,
    Text,
    bindparam,
    cast,
    column,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

__all__ = ["insert_rows", "update_rows"]


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (each a mapping of column name to value, all with the same columns)."""
    if not rows:
        return
    names = list(rows[0])
    if conn.dialect.name != "postgresql":
        _executemany(conn, table.insert().values({name: bindparam(name) for name in names}), rows)
        return
    given = _unnest(table, rows, {name: name for name in names})
    conn.execute(table.insert().from_select(names, select(*(given.c[name] for name in names))))


def update_rows(
    conn: Connection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    match: Mapping[str, str],
    assign: Mapping[str, str],
    where: Iterable[ColumnElement[bool]] = (),
    moves: Callable[[Any], ColumnElement[bool]] | None = None,
) -> None:
    """Update one row of ``table`` per row of ``rows``: the one whose columns of ``match`` equal the
    row's values under the keys they name, and that satisfies ``where``; each column of ``assign``
    is set to the row's value under the key it names, where ``moves(value of the first assigned
    column)`` holds when given."""
    if not rows:
        return
    first = next(iter(assign.values()))
    if conn.dialect.name != "postgresql":
        params: dict[str, BindParameter[Any]] = {
            key: bindparam(key) for key in (*match.values(), *assign.values())
        }
        stmt = update(table).where(*where, *(table.c[c] == params[k] for c, k in match.items()))
        if moves is not None:
            stmt = stmt.where(moves(params[first]))
        _executemany(conn, stmt.values({c: params[k] for c, k in assign.items()}), rows)
        return
    given = _unnest(table, rows, {**match, **assign})
    stmt = update(table).where(*where, *(table.c[c] == given.c[k] for c, k in match.items()))
    if moves is not None:
        stmt = stmt.where(moves(given.c[first]))
    conn.execute(stmt.values({c: given.c[k] for c, k in assign.items()}))


def _executemany(conn: Connection, stmt: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """``stmt`` once per row, through the driver's ``executemany`` with the rows as tuples: SQLAlchemy's
    own per-row parameter handling cost more than SQLite's work for 10,000 rows. The values go to the
    driver as they are (the ledger's many-row columns are integers and strings)."""
    compiled = stmt.compile(dialect=conn.dialect)
    order = compiled.positiontup
    assert order is not None, f"{conn.dialect.name}: expected a positional parameter style"
    fixed = compiled.params
    conn.exec_driver_sql(compiled.string, [tuple(r[k] if k in r else fixed[k] for k in order) for r in rows])


def _unnest(table: Table, rows: Sequence[Mapping[str, Any]], columns: Mapping[str, str]) -> Any:
    """``rows`` as a PostgreSQL derived table ``kbp_given``: one column per key of ``columns``' values,
    typed like the table's column that names it, from one array each."""
    kinds = {key: table.c[c].type for c, key in columns.items()}
    arrays = (
        cast(bindparam(f"{key}s", _array_text([r[key] for r in rows]), type_=Text), ARRAY(kind))
        for key, kind in kinds.items()
    )
    return (
        func.unnest(*arrays)
        .table_valued(*(column(key, kind) for key, kind in kinds.items()), name="kbp_given")
        .render_derived()
    )


def _array_text(values: Sequence[Any]) -> str:
    """``values`` (ints, strings, None) in PostgreSQL's array input syntax (``{1,NULL,"a\\"b"}``):
    one string the server parses, where psycopg2 would render each element as its own literal
    (80,000 of them in a plan of 10,000 ranges). Each distinct value is rendered once."""
    rendered = {v: _element(v) for v in set(values)}
    return "{" + ",".join([rendered[v] for v in values]) + "}"


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
