"""An Airflow connection → the ledger's SQLAlchemy URL, and a read-only check of that URL.

Connection types accepted by :class:`~airflow_kafka_backpressure.hooks.ledger.LedgerHook`:

* ``kbp_ledger`` (this provider's form): extra ``sqlalchemy_url`` when set — the Password field fills
  it in when the URL has none — else ``driver`` (default ``postgresql+psycopg2``) with host, port,
  login, password and schema (the database name);
* anything else (``generic``, ``postgres`` …, as before): extra ``sqlalchemy_url``, else the
  connection's fields (a ``postgres`` connection uses ``postgresql+psycopg2``, the driver the
  ``postgres`` extra installs — SQLAlchemy 2.1 would pick psycopg 3); its other extra keys become URL
  query parameters, e.g. ``{"sslmode": "require"}``.

The extra ``timeout_s`` (read by the hook) is never passed to the database driver.
"""

from __future__ import annotations

import os
from typing import Any

LEDGER_CONN_TYPE = "kbp_ledger"
DEFAULT_DRIVER = "postgresql+psycopg2"
URL_EXTRA = "sqlalchemy_url"
TIMEOUT_EXTRA = "timeout_s"
#: Extra keys the provider reads itself: not URL query parameters.
OWN_EXTRAS = (URL_EXTRA, TIMEOUT_EXTRA, "driver")
#: Bound of the connection attempt of :func:`check_ledger_url` on PostgreSQL (seconds).
CONNECT_TIMEOUT_S = 10


class LedgerConnectionError(ValueError):
    pass


def ledger_url(conn: Any) -> str:
    """The SQLAlchemy URL of an Airflow ``Connection`` (see the module docstring)."""
    from sqlalchemy.engine import URL, make_url

    extra: dict[str, Any] = conn.extra_dejson or {}
    if extra.get("sqlalchemy_url"):
        url = str(extra["sqlalchemy_url"])
        if conn.conn_type == LEDGER_CONN_TYPE and conn.password:
            try:
                parsed = make_url(url)
            except Exception as e:
                raise LedgerConnectionError(
                    f"Connection {conn.conn_id!r}: 'SQLAlchemy URL' is not a valid URL ({type(e).__name__}). "
                    "Write it like postgresql+psycopg2://user@host:5432/db or sqlite:////path/ledger.db."
                ) from None
            if parsed.password is None and parsed.username:
                url = parsed.set(password=conn.password).render_as_string(hide_password=False)
        return url
    if conn.conn_type == LEDGER_CONN_TYPE:
        if not conn.host:
            raise LedgerConnectionError(
                f"Connection {conn.conn_id!r} (type {LEDGER_CONN_TYPE}) has neither a host nor a "
                "'SQLAlchemy URL': set the database host, port, name, user and password, or the URL "
                "(e.g. sqlite:////var/lib/kbp/ledger.db)."
            )
        return URL.create(
            str(extra.get("driver") or DEFAULT_DRIVER),
            username=conn.login or None,
            password=conn.password or None,
            host=conn.host,
            port=int(conn.port) if conn.port else None,
            database=conn.schema or None,
        ).render_as_string(hide_password=False)
    scheme = DEFAULT_DRIVER if conn.conn_type in ("postgres", "postgresql") else str(conn.conn_type)
    return URL.create(
        scheme,
        username=conn.login or None,
        password=conn.password or None,
        host=conn.host or None,
        port=int(conn.port) if conn.port else None,
        database=conn.schema or None,
        query={k: str(v) for k, v in extra.items() if k not in OWN_EXTRAS},
    ).render_as_string(hide_password=False)


def shown_url(url: str) -> str:
    """``url`` safe to show: the password replaced."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable URL>"


def check_ledger_url(url: str) -> tuple[bool, str]:
    """Can the ledger at ``url`` be reached? Read-only: connects, runs ``SELECT 1`` and looks for the
    ledger's tables; a SQLite file that does not exist yet is not created. Never shows the password."""
    from sqlalchemy import create_engine, inspect, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    shown = shown_url(url)
    try:
        parsed = make_url(url)
    except Exception as e:
        return False, f"Not a valid SQLAlchemy URL ({type(e).__name__}): {shown}"
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database
        if path and path != ":memory:" and not os.path.exists(path):
            folder = os.path.dirname(os.path.abspath(path))
            if os.path.isdir(folder) and os.access(folder, os.W_OK):
                return (
                    True,
                    f"{shown}: the file does not exist yet; the ledger creates it on first use in {folder}.",
                )
            return (
                False,
                f"{shown}: folder {folder} does not exist or is not writable; create it or fix the path.",
            )
    elif parsed.get_backend_name() == "postgresql":
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    engine = create_engine(url, poolclass=NullPool, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            has_tables = inspect(conn).has_table("kbp_batches")
    except Exception as e:
        message = str(e).splitlines()[0] if str(e) else ""
        if parsed.password:
            message = message.replace(parsed.password, "***")
        return False, f"Cannot connect to {shown}: {type(e).__name__}: {message}"
    finally:
        engine.dispose()
    state = "present" if has_tables else "not created yet (the ledger creates them on first use)"
    return True, f"Connected to {shown}; ledger tables {state}."
