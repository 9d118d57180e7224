"""Bring a ledger's schema to the revision this code needs (Alembic, own version table).

* A new database gets every revision from the baseline up.
* A ledger made before migrations existed (``kbp_batches`` but no version table) is stamped with the
  baseline revision first, then upgraded.
* A ledger at a revision this code does not know (a newer release upgraded it) is refused.

Safe when several processes start at once: the upgrade runs in one transaction that first takes a
lock (PostgreSQL: a transaction-level advisory lock; SQLite: ``BEGIN IMMEDIATE``, the write lock),
then reads the revision again. PostgreSQL and SQLite both run DDL inside transactions, so an upgrade
that fails leaves the schema as it was. On SQLite, foreign-key enforcement is switched off for the
upgrading connection only (a table rebuild needs it, as SQLite's ALTER TABLE guide says) and every
foreign key is checked before the commit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from .engine import READ_ONLY
from .states import LedgerError, LedgerNotInitialised

if TYPE_CHECKING:  # alembic is imported when a schema is read or upgraded, not with the package
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = [
    "BASELINE_REVISION",
    "MIGRATION_TIMEOUT_S",
    "VERSION_TABLE",
    "SchemaState",
    "head_revision",
    "schema_state",
    "upgrade",
]

#: Alembic's version table for the ledger (Airflow's own is ``alembic_version``).
VERSION_TABLE = "kbp_alembic_version"
#: The schema before migrations existed.
BASELINE_REVISION = "0001"
#: The bound on one upgrade's statements on PostgreSQL (a backfill reads the whole history once).
MIGRATION_TIMEOUT_S = 3600
#: pg_advisory_xact_lock key held while a process upgrades a PostgreSQL ledger.
_PG_LOCK_KEY = 0x6B62705F6C656467  # "kbp_ledg"
_SCRIPT_LOCATION = Path(__file__).resolve().parent / "migrations"


@functools.cache
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config(None))


def _config(connection: Connection | None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_SCRIPT_LOCATION))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest revision this code knows."""
    head = _script().get_current_head()
    assert head is not None, "the ledger migrations have no head revision"
    return head


@dataclass(frozen=True)
class SchemaState:
    """What a database holds: its revision (None: no version row) and whether ledger tables exist."""

    revision: str | None
    has_tables: bool

    @property
    def legacy(self) -> bool:
        """A ledger made by ``create_all`` before migrations existed."""
        return self.revision is None and self.has_tables


def schema_state(conn: Connection) -> SchemaState:
    from alembic.runtime.migration import MigrationContext

    names = set(inspect(conn).get_table_names())
    revision = None
    if VERSION_TABLE in names:
        revision = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()
    return SchemaState(revision, "kbp_batches" in names)


def _refuse_unknown(state: SchemaState, where: str) -> None:
    if state.revision is None:
        return
    try:
        known = _script().get_revision(state.revision)
    except Exception:  # alembic raises several kinds for an unknown id
        known = None
    if known is None:
        raise LedgerError(
            f"The ledger at {where} is at schema revision {state.revision!r}, which this version of "
            f"airflow-provider-kafka-backpressure does not know (its newest is {head_revision()!r}): a "
            "newer release upgraded it. Install that release (or a newer one) on every scheduler, "
            "worker, triggerer and API server that uses this ledger; downgrading a ledger is not "
            "supported."
        )


#: What a reader tells the user to do about a ledger that is missing or behind this release.
UPGRADE_HINT = (
    "The first plan task of a pipeline creates and upgrades it, or run "
    "`python -m airflow_kafka_backpressure.ledger upgrade` (with --conn-id for a connection) as a deploy step."
)


def check_current(engine: Engine, where: str) -> None:
    """For readers (the monitoring page, its API): the ledger exists at this release's schema, else
    :class:`LedgerNotInitialised` says what to run. Reads only: no DDL, no lock."""
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        state = schema_state(conn)
        conn.rollback()
    _refuse_unknown(state, where)
    if not state.has_tables:
        raise LedgerNotInitialised(
            f"The ledger at {where} is not initialised yet (no ledger tables). {UPGRADE_HINT}"
        )
    head = head_revision()
    if state.revision != head:
        raise LedgerNotInitialised(
            f"The ledger at {where} is at schema revision {state.revision!r}, older than this release's "
            f"{head!r}: it has not been upgraded yet. {UPGRADE_HINT}"
        )


def upgrade(engine: Engine, where: str, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade the ledger behind ``engine`` to ``revision``; returns (revision before, revision after).

    ``where`` names the ledger in messages (a URL without its password).
    """
    from alembic import command

    target = head_revision() if revision == "head" else revision
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        state = schema_state(conn)
        conn.rollback()
    _refuse_unknown(state, where)
    if state.revision == target:
        return state.revision, target  # the usual case: nothing to lock
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            _sqlite_foreign_keys(conn, False)
        try:
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    # Waiting for another process's upgrade stays bounded by the ledger's timeout; the
                    # upgrade's own statements (a backfill over a long history) get a longer bound.
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
                    for setting in ("statement_timeout", "idle_in_transaction_session_timeout"):
                        conn.exec_driver_sql(f"SET LOCAL {setting} = {MIGRATION_TIMEOUT_S * 1000}")
                state = schema_state(conn)  # again, under the lock: another process may have upgraded
                _refuse_unknown(state, where)
                if state.has_tables and not state.legacy and state.revision is None:
                    raise LedgerError(
                        f"The ledger at {where} has ledger tables but an empty {VERSION_TABLE}."
                    )
                if state.legacy:
                    _check_legacy(conn, where)
                    command.stamp(_config(conn), BASELINE_REVISION)
                command.upgrade(_config(conn), target)
                if sqlite:
                    _sqlite_foreign_key_check(conn, where)
        finally:
            if sqlite:
                _sqlite_foreign_keys(conn, True)
    return state.revision, target


def _check_legacy(conn: Connection, where: str) -> None:
    names = set(inspect(conn).get_table_names())
    if "kbp_ranges" not in names:
        raise LedgerError(
            f"The database at {where} has a kbp_batches table but no kbp_ranges table and no "
            f"{VERSION_TABLE}: it is not a ledger this package made. Point the ledger at another "
            "database or schema."
        )


def _sqlite_foreign_keys(conn: Connection, on: bool) -> None:
    # PRAGMA foreign_keys is a no-op inside a transaction: set it on the raw connection, which runs in
    # autocommit mode (the engine set isolation_level=None), before SQLAlchemy begins.
    raw = conn.connection.driver_connection
    assert raw is not None  # a connection checked out of the pool
    raw.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def _sqlite_foreign_key_check(conn: Connection, where: str) -> None:
    bad = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
    if bad:
        raise LedgerError(
            f"Upgrading the ledger at {where} would break foreign keys ({bad[:5]}); nothing was "
            "changed. Report this as a bug with the ledger file."
        )
