"""LedgerHook: an Airflow connection (any SQLAlchemy URL) → the batch/range ledger.

Without a connection id the ledger is a SQLite file under ``AIRFLOW_HOME``. With one, the
connection's URI is used (a ``postgres`` connection becomes ``postgresql://…``), or its extra
``{"sqlalchemy_url": "…"}`` when given. Engines are cached per URL in the process.
"""

from __future__ import annotations

import threading
from typing import Any

from airflow.sdk import BaseHook

from ..ledger import Ledger, default_ledger_url

_LEDGERS: dict[str, Ledger] = {}
_LOCK = threading.Lock()


def ledger_for_url(url: str) -> Ledger:
    with _LOCK:
        ledger = _LEDGERS.get(url)
        if ledger is None:
            ledger = Ledger(url)
            ledger.create_all()
            _LEDGERS[url] = ledger
        return ledger


class LedgerHook(BaseHook):
    conn_name_attr = "ledger_conn_id"
    default_conn_name = "kbp_ledger_default"
    conn_type = "generic"
    hook_name = "Kafka backpressure ledger"

    def __init__(self, ledger_conn_id: str | None = None) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id

    def url(self) -> str:
        if not self.ledger_conn_id:
            return default_ledger_url()
        conn = self.get_connection(self.ledger_conn_id)
        extra: dict[str, Any] = conn.extra_dejson or {}
        if extra.get("sqlalchemy_url"):
            return str(extra["sqlalchemy_url"])
        uri = conn.get_uri()
        if uri.startswith("postgres://"):
            uri = "postgresql://" + uri[len("postgres://") :]
        return uri

    def get_conn(self) -> Ledger:
        return ledger_for_url(self.url())
