"""Every ledger call has a bound, and its errors name the ledger without its password.

Real databases: a SQLite file locked by another connection, a real PostgreSQL server with a row
lock held and a slow statement, a port nobody listens on and a server that accepts the TCP
connection but never answers.
"""

from __future__ import annotations

import json
import secrets
import socket
import sqlite3
import traceback

import pytest
from sqlalchemy import create_engine, make_url, text

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.ledger import Ledger, LedgerError, LedgerUnavailable
from tests.integration.ledger_dbs import new_database  # noqa: F401 (fixture)

P, T = "orders", "events"
SECRET = "s3cret-Passw0rd-42"


def new_batch(led: Ledger) -> int:
    return led.record_plan(P, "run-1", [OffsetRange(T, 0, 0, 10)], "/s", 1000, 0).batch_id


def assert_no_secret(err: BaseException) -> None:
    shown = "".join(traceback.format_exception(err))
    assert SECRET not in shown


def test_a_locked_sqlite_ledger_fails_within_the_bound_with_a_clear_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger(url) as setup:
        setup.upgrade()
        b = new_batch(setup)
    holder = sqlite3.connect(tmp_path / "l.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a stuck writer holds the database's write lock
    try:
        with Ledger(url, timeout_s=0.3) as led:
            with pytest.raises(LedgerUnavailable) as e:
                led.mark_running(b)
            msg = str(e.value)
            assert f"The ledger at {url} could not be reached or did not answer within 0.3 s" in msg
            assert "database is locked" in msg and '"timeout_s"' in msg and "Retrying the task is safe" in msg
            assert led.heads(P) == {OffsetRange(T, 0, 0, 1).tp: 10}  # readers are not blocked (WAL)
    finally:
        holder.rollback()
        holder.close()
    with Ledger(url, timeout_s=0.3) as led:
        assert led.mark_running(b).status == "running"
        with led.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 300


@pytest.mark.postgres
def test_postgresql_sessions_carry_the_bounds_and_a_held_row_lock_times_out(postgres_schema_url):
    with Ledger(postgres_schema_url, timeout_s=1) as led:
        led.upgrade()
        b = new_batch(led)
        with led.engine.connect() as conn:
            for setting in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"):
                assert conn.exec_driver_sql(f"SHOW {setting}").scalar() == "1s"
        other = create_engine(postgres_schema_url)
        try:
            with other.begin() as holder:  # another process holds the batch's row lock
                holder.execute(text("SELECT 1 FROM kbp_batches WHERE batch_id = :b FOR UPDATE"), {"b": b})
                with pytest.raises(LedgerUnavailable, match="due to (lock|statement) timeout") as e:
                    led.mark_running(b)
                # The message names the ledger (password hidden) so the user knows which one timed out.
                assert make_url(postgres_schema_url).render_as_string(hide_password=True) in str(e.value)
            with pytest.raises(LedgerUnavailable, match="statement timeout"):
                with led.engine.connect() as conn:
                    conn.execute(text("SELECT pg_sleep(5)"))
        finally:
            other.dispose()
        assert led.mark_running(b).status == "running"


def test_an_unreachable_ledger_is_named_without_its_password():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"postgresql+psycopg2://kbp:{SECRET}@127.0.0.1:{port}/ledger"
    with Ledger(url, timeout_s=2) as led:
        assert SECRET not in led.url and SECRET not in repr(led)
        for call in (led.upgrade, lambda: led.heads(P)):
            with pytest.raises(LedgerUnavailable) as e:
                call()
            assert f"postgresql+psycopg2://kbp:***@127.0.0.1:{port}/ledger" in str(e.value)
            assert "Connection refused" in str(e.value) or "connection" in str(e.value).lower()
            assert_no_secret(e.value)


@pytest.mark.postgres
def test_a_database_the_server_does_not_have_is_named_with_the_fix(postgres_url):
    """Not an old schema (PostgreSQL says 'database "…" does not exist' at connect), nor a server out
    of reach: the database named in the URL, and how to make it."""
    name = f"no_such_ledger_{secrets.token_hex(4)}"
    url = make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    with Ledger(url, timeout_s=5) as led:
        for call in (led.upgrade, lambda: led.heads(P)):
            with pytest.raises(
                LedgerError, match=f"names the database '{name}', which that server does not have"
            ) as e:
                call()
            assert "CREATE DATABASE" in str(e.value) and "older than this package" not in str(e.value)
            assert not isinstance(e.value, LedgerUnavailable)


def test_a_server_that_never_answers_is_given_up_on_after_the_connect_bound():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # the kernel completes the handshake; nobody ever reads or answers
        port = server.getsockname()[1]
        with Ledger(f"postgresql+psycopg2://kbp:{SECRET}@127.0.0.1:{port}/ledger", timeout_s=2) as led:
            with pytest.raises(LedgerUnavailable, match="timeout expired") as e:
                led.heads(P)
            assert_no_secret(e.value)


def test_a_bug_in_a_statement_is_not_reported_as_an_unreachable_ledger(tmp_path):
    from sqlalchemy.exc import OperationalError

    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        with pytest.raises(OperationalError, match="syntax error") as e:
            with led.engine.connect() as conn:
                conn.exec_driver_sql("SELEC 1")
        assert not isinstance(e.value, LedgerError)


def test_a_ledger_with_an_old_schema_names_the_upgrade_command(new_database):
    url = new_database()
    with Ledger(url) as led:
        led.upgrade("0001")
        with pytest.raises(LedgerError, match="schema is older than this package") as e:
            led.heads(P)
        assert "python -m airflow_kafka_backpressure.ledger upgrade" in str(e.value)
        assert not isinstance(e.value, LedgerUnavailable)


def test_the_hook_takes_the_bound_from_the_connection(monkeypatch, tmp_path):
    from airflow_kafka_backpressure.hooks.ledger import LedgerHook

    url = f"sqlite:///{tmp_path / 'hooked.db'}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_BOUNDED",
        json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": url, "timeout_s": 2.5}}),
    )
    led = LedgerHook("kbp_bounded").get_conn()
    assert led.timeout_s == 2.5 and led.url == url
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_BAD",
        json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": url, "timeout_s": "soon"}}),
    )
    with pytest.raises(ValueError, match="Connection 'kbp_bad': extra 'timeout_s' = 'soon' must be a number"):
        LedgerHook("kbp_bad").get_conn()
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_PG",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "db",
                "login": "u",
                "password": SECRET,
                "schema": "ledger",
                "port": 5432,
                "extra": {"timeout_s": 5, "sslmode": "require"},
            }
        ),
    )
    assert LedgerHook("kbp_pg").url() == f"postgresql+psycopg2://u:{SECRET}@db:5432/ledger?sslmode=require"
