"""LedgerHook: an Airflow connection (any SQLAlchemy URL) → the batch/range ledger.

Without a connection id the ledger is a SQLite file under ``AIRFLOW_HOME``. With one: a
``kbp_ledger`` connection (this provider's form), or any other (``generic``, ``postgres`` …) with its
extra ``{"sqlalchemy_url": "…"}`` or its fields — see :mod:`..ledger.connection`. The extra ``{"timeout_s": 30}`` bounds every
ledger call (connect, locks, statements; see :mod:`airflow_kafka_backpressure.ledger.engine`).
Engines are cached per URL and bound in the process.

A writer's first use of a ledger in a process (the operators, the ledger commands) upgrades its
schema to the newest revision this package knows (the migrations lock, so tasks starting at once are
safe; a ledger upgraded by a newer release is refused with a message). Readers — the monitoring page
and its API, open to any viewer — never run DDL: they say "not initialised" until a writer or
``python -m airflow_kafka_backpressure.ledger upgrade`` (a deploy step) has.

**A SQLite ledger is one file on one host.** Under an executor that runs tasks on several hosts
(Celery, Kubernetes, Edge, ECS/Batch/Lambda …, alone or in a hybrid ``[core] executor`` list), or
with a triggerer on another host (``[kafka_backpressure] remote_triggerer = True``), every host
would keep its own ledger and silently split the pipeline's history. :meth:`LedgerHook.get_conn`
refuses a SQLite ledger there, naming ``ledger_conn_id`` (:func:`multi_host_refusal`).
"""

from __future__ import annotations

import math
import threading
from typing import Any

from airflow.sdk import BaseHook

from ..get_provider_info import ui_field_behaviour
from ..ledger import Ledger, default_ledger_url
from ..ledger.connection import LEDGER_CONN_TYPE, TIMEOUT_EXTRA, check_ledger_url, ledger_url
from ..ledger.engine import DEFAULT_TIMEOUT_S

#: Executors whose tasks may run on other hosts than the scheduler (matched on the class name, so
#: module paths and ``alias:module.Class`` entries count too).
MULTI_HOST_EXECUTORS = (
    "CeleryExecutor",
    "KubernetesExecutor",
    "CeleryKubernetesExecutor",
    "LocalKubernetesExecutor",
    "EdgeExecutor",
    "AwsEcsExecutor",
    "AwsBatchExecutor",
    "AwsLambdaExecutor",
)
#: ``[kafka_backpressure] remote_triggerer``: say True when a triggerer runs on another host.
REMOTE_TRIGGERER_OPTION = ("kafka_backpressure", "remote_triggerer")

_LEDGERS: dict[tuple[str, float], Ledger] = {}
_LOCK = threading.Lock()


def ledger_for_url(url: str, timeout_s: float = DEFAULT_TIMEOUT_S, *, upgrade: bool = True) -> Ledger:
    """The process's ledger for ``url``. Writers (``upgrade``) create it and upgrade its schema on
    first use; readers (the monitoring page and its API) never do: until a writer or a deploy step
    has, they get :class:`~airflow_kafka_backpressure.ledger.LedgerNotInitialised` naming what to run."""
    with _LOCK:
        ledger = _LEDGERS.get((url, timeout_s))
        if ledger is None:
            ledger = Ledger(url, timeout_s=timeout_s)
            try:
                if upgrade:
                    ledger.upgrade()
                else:
                    ledger.check_current()
            except BaseException:
                ledger.dispose()
                raise
            _LEDGERS[(url, timeout_s)] = ledger  # current now: a reader never checks it again
        return ledger


def multi_host_executors(executor_setting: str) -> list[str]:
    """The entries of Airflow's ``[core] executor`` setting (a comma-separated list of names, module
    paths or ``alias:module.Class``) that run tasks on several hosts (pure)."""
    out = []
    for entry in (executor_setting or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        class_name = entry.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        if class_name in MULTI_HOST_EXECUTORS:
            out.append(entry)
    return out


def multi_host_refusal(
    url: str, ledger_conn_id: str | None, executor_setting: str, remote_triggerer: bool
) -> str | None:
    """Why a ledger at ``url`` must not be used under this Airflow configuration (pure): a SQLite
    file ledger with tasks or triggers on several hosts. None: fine."""
    if not url.startswith("sqlite") or ":memory:" in url:
        return None
    why = []
    executors = multi_host_executors(executor_setting)
    if executors:
        why.append(f"Airflow's executor ({', '.join(executors)}) runs tasks on several hosts")
    if remote_triggerer:
        why.append("a triggerer runs on another host ([kafka_backpressure] remote_triggerer = True)")
    if not why:
        return None
    which = (
        f"connection {ledger_conn_id!r} is" if ledger_conn_id else "the default ledger (no ledger_conn_id) is"
    )
    return (
        f"The ledger of {which} a SQLite file ({url.split('///', 1)[-1]}), but {' and '.join(why)}: each host "
        "would keep its own ledger and split the pipeline's batches and offsets. Set the pipeline's "
        "ledger_conn_id to a connection of a shared database (e.g. a kbp_ledger or postgres connection to "
        "PostgreSQL) that every worker and triggerer reaches, then run "
        "`python -m airflow_kafka_backpressure.ledger upgrade --conn-id <that id>`."
    )


def airflow_multi_host_refusal(url: str, ledger_conn_id: str | None) -> str | None:
    """:func:`multi_host_refusal` under this process's Airflow configuration."""
    from airflow.configuration import conf

    executor = conf.get("core", "executor", fallback="") or ""
    remote = conf.getboolean(*REMOTE_TRIGGERER_OPTION, fallback=False)
    return multi_host_refusal(url, ledger_conn_id, executor, remote)


class LedgerHook(BaseHook):
    conn_name_attr = "ledger_conn_id"
    default_conn_name = "kbp_ledger_default"
    conn_type = LEDGER_CONN_TYPE
    hook_name = "Kafka Backpressure ledger (SQL database)"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form (declared in the provider info, which Airflow 3.2+ reads first)."""

        return ui_field_behaviour(cls.conn_type)

    def __init__(self, ledger_conn_id: str | None = None) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id

    def _extra(self) -> dict[str, Any]:
        if not self.ledger_conn_id:
            return {}
        return dict(self.get_connection(self.ledger_conn_id).extra_dejson or {})

    def url(self) -> str:
        if not self.ledger_conn_id:
            return default_ledger_url()
        return ledger_url(self.get_connection(self.ledger_conn_id))

    def timeout_s(self) -> float:
        """The connection's ``timeout_s`` extra, else the ledger's default bound."""
        value = self._extra().get(TIMEOUT_EXTRA, DEFAULT_TIMEOUT_S)
        try:
            timeout = float(value)
        except (TypeError, ValueError):
            timeout = math.nan
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(
                f"Connection {self.ledger_conn_id!r}: extra {TIMEOUT_EXTRA!r} = {value!r} must be a number of "
                f"seconds > 0 (the most a ledger call may wait); fix it or remove it (default {DEFAULT_TIMEOUT_S:g})."
            )
        return timeout

    def get_conn(self, *, upgrade: bool = True) -> Ledger:
        """The ledger; a SQLite one is refused when tasks or triggers run on several hosts.
        ``upgrade=False`` for readers: a ledger missing or behind this release raises
        :class:`~airflow_kafka_backpressure.ledger.LedgerNotInitialised` instead of being migrated."""
        url = self.url()
        refusal = airflow_multi_host_refusal(url, self.ledger_conn_id)
        if refusal:
            raise ValueError(refusal)
        return ledger_for_url(url, self.timeout_s(), upgrade=upgrade)

    def test_connection(self) -> tuple[bool, str]:
        """Connect (read-only) and say whether the ledger's tables exist; never shows the password."""
        try:
            url = self.url()
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"
        return check_ledger_url(url)
