"""The ledger's engine, schema lifecycle and read/write plumbing, shared by the repository parts."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from sqlalchemy import Connection, Engine, text

from . import migrate
from .engine import (
    DEFAULT_TIMEOUT_S,
    READ_ONLY,
    configure_engine,
    configure_sqlite,
    default_ledger_url,
    make_engine,
    redacted_url,
)
from .schema import metadata
from .states import LedgerNotInitialised, UnknownBatch

__all__ = ["LedgerBase", "at_or_now", "first_line", "now_ms"]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def at_or_now(at_ms: int | None) -> int:
    return now_ms() if at_ms is None else int(at_ms)


class LedgerBase:
    """The engine and schema of a ledger (see :class:`~.repository.Ledger`).

    :param url: a SQLAlchemy URL (``sqlite:///...``, ``postgresql+psycopg2://...``) or an ``Engine``;
        defaults to :func:`default_ledger_url`.
    :param engine_kwargs: extra ``create_engine`` arguments (ignored when an Engine is given).
    :param timeout_s: the most any call waits for the database (connect, locks, a statement); see
        :mod:`.engine`. A given Engine gets only SQLite's busy timeout and the clear errors.
    """

    def __init__(
        self,
        url: str | Engine | None = None,
        *,
        engine_kwargs: Mapping[str, Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        if timeout_s <= 0:
            raise ValueError(f"Ledger: timeout_s must be > 0 seconds, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        if isinstance(url, Engine):
            self.engine = url
            if url.dialect.name == "sqlite":
                configure_sqlite(url, self.timeout_s)
            configure_engine(url, self.timeout_s)
        else:
            self.engine = make_engine(url or default_ledger_url(), engine_kwargs, self.timeout_s)
        #: The URL with its password replaced by ``***``: the only form messages ever show.
        self.url = redacted_url(self.engine)

    # -- lifecycle -------------------------------------------------------------------------------

    def upgrade(self, revision: str = "head") -> tuple[str | None, str]:
        """Bring the schema to ``revision`` (default: the newest this code knows) with the Alembic
        migrations; returns (revision before, revision after). Safe to call from several processes at
        once; a ledger at a newer revision than this code knows is refused (:class:`LedgerError`)."""
        if self.engine.dialect.name == "sqlite" and self.engine.url.database not in (None, "", ":memory:"):
            Path(self.engine.url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        return migrate.upgrade(self.engine, self.url, revision)

    def check_current(self) -> None:
        """Readers' check: the ledger exists at this release's schema (:class:`LedgerNotInitialised`
        otherwise). Creates nothing: a SQLite file that does not exist is not created."""
        if self.engine.dialect.name == "sqlite" and self.engine.url.database not in (None, "", ":memory:"):
            if not Path(self.engine.url.database).expanduser().exists():
                raise LedgerNotInitialised(
                    f"The ledger at {self.url} is not initialised yet (no file). {migrate.UPGRADE_HINT}"
                )
        migrate.check_current(self.engine, self.url)

    def schema_revision(self) -> str | None:
        """The ledger's schema revision (None: no ledger here yet, or one made before migrations)."""
        with self._read() as conn:
            return migrate.schema_state(conn).revision

    def create_all(self) -> None:
        """Create or upgrade the schema to the newest revision (idempotent); same as :meth:`upgrade`."""
        self.upgrade()

    def drop_all(self) -> None:
        """Drop the ledger tables and their version table (tests, or a deliberate reset)."""
        with self.engine.begin() as conn:
            metadata.drop_all(conn, checkfirst=True)
            conn.execute(text(f"DROP TABLE IF EXISTS {migrate.VERSION_TABLE}"))

    def dispose(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()

    def __repr__(self) -> str:
        return f"Ledger({self.url!r})"

    def _read(self) -> Any:
        conn = self.engine.connect().execution_options(**{READ_ONLY: True})
        return _ReadContext(conn)

    def _unknown(self, batch_id: int) -> UnknownBatch:
        return UnknownBatch(
            f"No batch {batch_id} in the ledger at {self.url}. Check the batch id (XCom of the plan "
            "task) and that every task uses the same ledger URL."
        )


class _ReadContext:
    """A read-only connection whose transaction is always rolled back (nothing to commit)."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def __enter__(self) -> Connection:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def first_line(err: BaseException | None) -> str:
    return str(err).strip().splitlines()[0] if err is not None and str(err).strip() else "integrity error"
