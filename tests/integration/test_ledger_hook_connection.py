"""LedgerHook.test_connection on a real PostgreSQL server, through a ``kbp_ledger`` connection made
of the form's fields (host, port, user, password, database)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.engine import make_url

from airflow_kafka_backpressure.hooks.ledger import LedgerHook
from airflow_kafka_backpressure.ledger import Ledger

pytestmark = pytest.mark.postgres


def _form_connection(monkeypatch, conn_id: str, url: str, password: str | None = None) -> None:
    u = make_url(url)
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps(
            {
                "conn_type": "kbp_ledger",
                "host": u.host,
                "port": u.port,
                "login": u.username,
                "password": u.password if password is None else password,
                "schema": u.database,
            }
        ),
    )


def test_the_form_connection_reaches_postgres_and_sees_the_ledger_tables(postgres_url, monkeypatch):
    _form_connection(monkeypatch, "kbp_pg_form", postgres_url)
    hook = LedgerHook("kbp_pg_form")
    assert make_url(hook.url()).render_as_string(hide_password=False) == make_url(postgres_url).set(
        drivername="postgresql+psycopg2"
    ).render_as_string(hide_password=False)
    Ledger(postgres_url).create_all()
    ok, message = hook.test_connection()
    assert ok, message
    assert "tables present" in message


def test_a_wrong_password_fails_with_a_message_that_hides_it(postgres_url, monkeypatch):
    # the session's server checks passwords on TCP (the fixture's, and .ci/postgres.sh's)
    assert make_url(postgres_url).password, (
        "the test PostgreSQL URL has no password: point KBP_TEST_POSTGRES_URL at a server that checks "
        "passwords on TCP (scram-sha-256), or unset it to start the fixture's own"
    )
    _form_connection(monkeypatch, "kbp_pg_bad", postgres_url, password="wrong-s3cret")
    ok, message = LedgerHook("kbp_pg_bad").test_connection()
    assert not ok and "Cannot connect" in message and "wrong-s3cret" not in message


def test_an_unreachable_server_fails_clearly(monkeypatch):
    from kbp_local.process import free_port

    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_PG_DEAD",
        json.dumps(
            {
                "conn_type": "kbp_ledger",
                "host": "127.0.0.1",
                "port": free_port(),
                "login": "kbp",
                "password": "s3cret",
                "schema": "ledger",
            }
        ),
    )
    ok, message = LedgerHook("kbp_pg_dead").test_connection()
    assert not ok and "OperationalError" in message and "s3cret" not in message and "127.0.0.1" in message
