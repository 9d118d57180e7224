"""A ledger connection (this provider's ``kbp_ledger`` form, or ``generic``/``postgres``) → its URL,
and the read-only check behind ``LedgerHook.test_connection`` on SQLite."""

from __future__ import annotations

import json

import pytest
from airflow.sdk import Connection

from airflow_kafka_backpressure.ledger.connection import (
    LedgerConnectionError,
    check_ledger_url,
    ledger_url,
)


def test_the_form_fields_make_a_postgres_url_with_the_default_driver():
    conn = Connection(
        conn_id="led",
        conn_type="kbp_ledger",
        host="db",
        port=5433,
        login="kbp",
        password="p@ss",
        schema="ledger",
    )
    assert ledger_url(conn) == "postgresql+psycopg2://kbp:p%40ss@db:5433/ledger"
    conn = Connection(
        conn_id="led",
        conn_type="kbp_ledger",
        host="db",
        schema="ledger",
        extra=json.dumps({"driver": "postgresql"}),
    )
    assert ledger_url(conn) == "postgresql://db/ledger"


def test_the_url_field_wins_and_gets_the_password_field_when_it_has_none():
    conn = Connection(
        conn_id="led",
        conn_type="kbp_ledger",
        host="ignored",
        password="s3cret",
        extra=json.dumps({"sqlalchemy_url": "postgresql+psycopg2://kbp@db/ledger"}),
    )
    assert ledger_url(conn) == "postgresql+psycopg2://kbp:s3cret@db/ledger"
    sqlite = Connection(
        conn_id="led", conn_type="kbp_ledger", extra=json.dumps({"sqlalchemy_url": "sqlite:////tmp/l.db"})
    )
    assert ledger_url(sqlite) == "sqlite:////tmp/l.db"


def test_existing_generic_and_postgres_connections_still_work():
    generic = Connection(
        conn_id="g", conn_type="generic", extra=json.dumps({"sqlalchemy_url": "sqlite:////x/l.db"})
    )
    assert ledger_url(generic) == "sqlite:////x/l.db"
    pg = Connection(
        conn_id="pg", conn_type="postgres", host="db", login="u", password="p", schema="d", port=5432
    )
    # psycopg2: the driver the postgres extra installs (SQLAlchemy 2.1 would pick psycopg 3)
    assert ledger_url(pg) == "postgresql+psycopg2://u:p@db:5432/d"
    # other extra keys are driver parameters; the provider's own keys are not
    tls = Connection(
        conn_id="pg",
        conn_type="postgres",
        host="db",
        schema="d",
        extra=json.dumps({"sslmode": "require", "timeout_s": 5}),
    )
    assert ledger_url(tls) == "postgresql+psycopg2://db/d?sslmode=require"


def test_an_empty_ledger_form_names_the_connection_and_the_fix():
    with pytest.raises(
        LedgerConnectionError, match=r"Connection 'led'.*neither a host nor a 'SQLAlchemy URL'"
    ):
        ledger_url(Connection(conn_id="led", conn_type="kbp_ledger"))


def test_check_reports_a_new_sqlite_file_without_creating_it(tmp_path):
    path = tmp_path / "ledger.db"
    ok, message = check_ledger_url(f"sqlite:///{path}")
    assert ok and "does not exist yet" in message and not path.exists()
    ok, message = check_ledger_url(f"sqlite:///{tmp_path / 'missing' / 'ledger.db'}")
    assert not ok and "does not exist or is not writable" in message


def test_check_sees_whether_the_ledger_tables_exist(tmp_path):
    from airflow_kafka_backpressure.ledger import Ledger

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    import sqlite3

    sqlite3.connect(tmp_path / "ledger.db").close()
    ok, message = check_ledger_url(url)
    assert ok and "not created yet" in message
    Ledger(url).create_all()
    ok, message = check_ledger_url(url)
    assert ok and "tables present" in message
