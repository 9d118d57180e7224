"""The ledger through an Airflow ``postgres`` connection (the kind the UI and the compose stack make)."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy.engine import make_url

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def test_postgres_connection_opens_the_ledger_with_the_installed_driver(postgres_schema_url, monkeypatch):
    from airflow_kafka_backpressure.hooks.ledger import LedgerHook

    u = make_url(postgres_schema_url)  # a fresh schema, selected by the libpq "options" parameter
    conn_id = f"kbp_ledger_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": u.host,
                "port": u.port,
                "login": u.username,
                "password": u.password,
                "schema": u.database,
                "extra": {"options": u.query["options"]},
            }
        ),
    )
    hook = LedgerHook(conn_id)
    assert hook.url().startswith("postgresql+psycopg2://")
    ledger = hook.get_conn()
    assert ledger.engine.dialect.name == "postgresql"
    assert ledger.recent_batches("no-such-pipeline", limit=1) == []
