"""Engines for the ledger: the default URL, SQLite connection set-up (foreign keys, WAL, busy
timeout, ``BEGIN IMMEDIATE`` for writers), bounds on every call, and clear errors.

**Bounds.** Every call waits at most ``timeout_s`` (default :data:`DEFAULT_TIMEOUT_S`) for each thing
it waits on: SQLite's busy timeout (another writer holds the database); PostgreSQL's connect timeout,
``statement_timeout``, ``lock_timeout`` and ``idle_in_transaction_session_timeout`` (a session frozen
inside a transaction cannot hold its locks for ever); the connection pool's checkout.

**Errors.** A database that cannot be reached, times out or is locked raises
:class:`~.states.LedgerUnavailable`; a ledger whose tables are older than this code raises
:class:`~.states.LedgerError` naming the upgrade command. Both name the ledger's URL with its
password replaced by ``***`` and never quote the password.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.pool import StaticPool

from .commands import ledger_command
from .states import LedgerError, LedgerUnavailable

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "READ_ONLY",
    "configure_engine",
    "configure_sqlite",
    "default_ledger_url",
    "make_engine",
    "redacted_url",
]

#: How long any one ledger call may wait (connect, lock, statement), in seconds.
DEFAULT_TIMEOUT_S = 30.0


def default_ledger_url() -> str:
    """``sqlite:///$AIRFLOW_HOME/kafka_backpressure_ledger.db`` (AIRFLOW_HOME defaults to ~/airflow)."""
    home = os.environ.get("AIRFLOW_HOME") or str(Path("~/airflow").expanduser())
    return f"sqlite:///{Path(home) / 'kafka_backpressure_ledger.db'}"


READ_ONLY = "kbp_read_only"


def redacted_url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def configure_sqlite(engine: Engine, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    if getattr(engine, "_kbp_sqlite_configured", False):
        return
    engine._kbp_sqlite_configured = True  # type: ignore[attr-defined]
    busy_ms = max(int(timeout_s * 1000), 1)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take over transaction control from the sqlite3 module (it does not BEGIN before SELECTs).
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        try:
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={busy_ms}")
            if engine.url.database not in (None, "", ":memory:"):
                _use_wal(cur, timeout_s)
                cur.execute("PRAGMA synchronous=NORMAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front: a deferred transaction that read first would fail
        # with "database is locked" instead of waiting when another writer committed meanwhile.
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def _use_wal(cur: Any, timeout_s: float) -> None:
    """Put the SQLite file behind ``cur`` in WAL mode, waiting up to ``timeout_s`` for other connections.

    WAL is a property of the file: once set it stays, so a connection to a ledger in WAL mode only
    reads the mode. Switching a new file to WAL needs the file to itself, and SQLite answers
    "database is locked" at once (its busy timeout does not cover the switch) when several processes
    open a new ledger together: several Airflow tasks on a fresh installation. So wait and retry here,
    bounded like every other ledger call.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _configure_postgresql(engine: Engine, timeout_s: float) -> None:
    ms = max(int(timeout_s * 1000), 1)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cur = dbapi_connection.cursor()
        try:
            for setting in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"):
                cur.execute(f"SET {setting} = {ms}")
        finally:
            cur.close()
            dbapi_connection.autocommit = autocommit


def configure_engine(engine: Engine, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Turn the engine's database errors into the ledger's clear errors (once per engine)."""
    if getattr(engine, "_kbp_errors_configured", False):
        return
    engine._kbp_errors_configured = True  # type: ignore[attr-defined]

    @event.listens_for(engine, "handle_error")
    def _on_error(ctx: ExceptionContext) -> BaseException | None:
        if ctx.is_pre_ping:
            return None  # the pool handles a dead pooled connection itself
        return ledger_error(engine, ctx.sqlalchemy_exception or ctx.original_exception, timeout_s)


#: Driver messages of a ledger whose schema is older than the code: SQLite's, and PostgreSQL's
#: undefined table or column (not its 'database "…" does not exist', refused at connect)
_OLD_SCHEMA = re.compile(r"no such (table|column)|(relation|column) \S+ does not exist")
#: the same as PostgreSQL's SQLSTATE (psycopg2's pgcode, psycopg's sqlstate): undefined table, column
_OLD_SCHEMA_STATES = ("42P01", "42703")
#: PostgreSQL at connect: the URL names a database the server does not have
_NO_DATABASE = re.compile(r'database "([^"]*)" does not exist')
#: sqlite3 reports everything as OperationalError; these mean the file is busy or out of reach.
_SQLITE_UNAVAILABLE = ("locked", "busy", "unable to open", "disk I/O error", "readonly database")


def ledger_error(engine: Engine, err: BaseException | None, timeout_s: float) -> LedgerError | None:
    """The ledger error for a database error, or None to let it through (integrity errors etc.)."""
    if err is None or isinstance(err, exc.IntegrityError) or not isinstance(err, exc.DBAPIError):
        return None
    where = redacted_url(engine)
    detail = _driver_message(engine, err)
    missing = _NO_DATABASE.search(detail)
    if isinstance(err, exc.OperationalError) and missing:
        return LedgerError(
            f"The ledger at {where} names the database {missing.group(1)!r}, which that server does not "
            f"have ({detail}). Create it (CREATE DATABASE, owned by the ledger's user) or fix the database "
            "in the ledger's URL or connection; the ledger's tables are created on first use."
        )
    state = getattr(err.orig, "pgcode", None) or getattr(err.orig, "sqlstate", None)
    old_schema = state in _OLD_SCHEMA_STATES if state else bool(_OLD_SCHEMA.search(detail))
    if isinstance(err, exc.ProgrammingError | exc.OperationalError) and old_schema:
        return LedgerError(
            f"The ledger at {where} lacks a table or column this code needs ({detail}): its schema is older "
            f"than this package. Run `{ledger_command('upgrade')} --url '<the ledger URL>'` (or `--conn-id "
            "<the ledger connection>`); tasks upgrade it themselves on first use."
        )
    if isinstance(err, exc.OperationalError) and (
        engine.dialect.name != "sqlite" or any(m in detail for m in _SQLITE_UNAVAILABLE)
    ):
        return LedgerUnavailable(
            f"The ledger at {where} could not be reached or did not answer within {timeout_s:g} s "
            f"({detail}). Check that the database is up and reachable from this host and not locked by a "
            "stuck process; if it is only slow or busy, raise the bound with the ledger connection's extra "
            '{"timeout_s": …}. Retrying the task is safe.'
        )
    return None


def _driver_message(engine: Engine, err: exc.DBAPIError) -> str:
    text = str(err.orig if err.orig is not None else err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    password = engine.url.password
    if password:
        first = first.replace(str(password), "***")
    return first


def make_engine(
    url: str, engine_kwargs: Mapping[str, Any] | None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Engine:
    """An engine for the ledger at ``url`` whose every call is bounded by ``timeout_s``."""
    kwargs: dict[str, Any] = dict(engine_kwargs or {})
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            kwargs.setdefault("poolclass", StaticPool)
            kwargs.setdefault("connect_args", {"check_same_thread": False})
        else:
            kwargs.setdefault("connect_args", {"timeout": timeout_s})
        engine = create_engine(url, **kwargs)
        configure_sqlite(engine, timeout_s)
    else:
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("pool_timeout", timeout_s)
        postgresql = parsed.get_backend_name() == "postgresql"
        if (
            postgresql
            and parsed.get_driver_name() in ("psycopg2", "psycopg")
            and "connect_timeout" not in parsed.query
        ):
            # libpq waits at least 2 s
            kwargs["connect_args"] = {
                "connect_timeout": max(round(timeout_s), 2),
                **kwargs.get("connect_args", {}),
            }
        engine = create_engine(url, **kwargs)
        if postgresql:
            _configure_postgresql(engine, timeout_s)
    configure_engine(engine, timeout_s)
    return engine
