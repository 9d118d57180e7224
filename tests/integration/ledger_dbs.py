"""Ledger fixtures: a ledger and empty databases for tests, on SQLite (files) and a real PostgreSQL (schemas), and a
normalised description of a database's schema to compare two of them."""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, inspect, text

from airflow_kafka_backpressure.ledger import Ledger
from tests.fixtures_postgres import url_with_search_path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a SQLite file, or a fresh schema of the session's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("postgres_schema_url")


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    """A ledger at the newest schema revision on ``ledger_url``."""
    led = Ledger(ledger_url)
    led.create_all()
    try:
        yield led
    finally:
        led.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def new_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """``new_database()`` → the URL of a new, empty database (SQLite file or PostgreSQL schema)."""
    if request.param == "sqlite":
        n = iter(range(1_000_000))
        yield lambda: f"sqlite:///{tmp_path / f'ledger-{next(n)}.db'}"
        return
    server = request.getfixturevalue("postgres_url")
    engine = create_engine(server)
    schemas: list[str] = []

    def make() -> str:
        schema = f"kbp_m_{secrets.token_hex(6)}"
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        schemas.append(schema)
        return url_with_search_path(server, schema)

    try:
        yield make
    finally:
        with engine.begin() as conn:
            for schema in schemas:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


def with_ledgers_at_once(url: str, n: int, work: Callable[[Ledger, int], object]) -> list[object]:
    """Run ``work(ledger, i)`` for i < n in n threads, each with its own Ledger (own engine and
    connections) on ``url``, released together; returns each result or the exception it raised."""
    results: list[object] = [None] * n
    start = threading.Barrier(n)

    def run(i: int) -> None:
        led = Ledger(url)
        try:
            start.wait(timeout=30)
            results[i] = work(led, i)
        except Exception as e:  # collected and asserted on by the test
            results[i] = e
        finally:
            led.dispose()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return results


def run_ddl(url: str, statements: list[str]) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for stmt in statements:
                conn.exec_driver_sql(stmt)
    finally:
        engine.dispose()


def _norm(sql: Any) -> str:
    return re.sub(r"\s+", " ", str(sql)).strip() if sql is not None else ""


def describe_schema(conn: Connection, skip: tuple[str, ...] = ("kbp_alembic_version",)) -> dict[str, Any]:
    """Tables of the ledger with columns (name, type, nullable), primary key, foreign keys (with their
    options), unique constraints, indexes (with partial-index predicates), check constraints and
    storage options (PostgreSQL's fillfactor)."""
    insp = inspect(conn)
    out: dict[str, Any] = {}
    for table in sorted(insp.get_table_names()):
        if not table.startswith("kbp_") or table in skip:
            continue
        indexes = [
            (
                i["name"],
                tuple(i["column_names"]),
                bool(i["unique"]),
                tuple(sorted((k, _norm(v)) for k, v in (i.get("dialect_options") or {}).items())),
            )
            for i in insp.get_indexes(table)
            if not i.get("duplicates_constraint")
        ]
        out[table] = {
            "columns": [
                (c["name"], str(c["type"].compile(dialect=conn.dialect)), bool(c["nullable"]))
                for c in insp.get_columns(table)
            ],
            "primary_key": tuple(insp.get_pk_constraint(table)["constrained_columns"]),
            "foreign_keys": sorted(
                (
                    fk["name"],
                    tuple(fk["constrained_columns"]),
                    fk["referred_table"],
                    tuple(fk["referred_columns"]),
                    tuple(sorted((k, str(v)) for k, v in (fk.get("options") or {}).items())),
                )
                for fk in insp.get_foreign_keys(table)
            ),
            "unique": sorted(
                (u["name"], tuple(u["column_names"])) for u in insp.get_unique_constraints(table)
            ),
            "indexes": sorted(indexes),
            "checks": sorted((c["name"], _norm(c["sqltext"])) for c in insp.get_check_constraints(table)),
            "options": sorted((k, _norm(v)) for k, v in insp.get_table_options(table).items()),
        }
    return out
