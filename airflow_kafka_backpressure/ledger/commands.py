"""The ledger's command lines as users type them, for error messages (pure: no database)."""

from __future__ import annotations

import shlex

__all__ = ["PROG", "abandon_command", "ledger_command"]

PROG = "python -m airflow_kafka_backpressure.ledger"


def ledger_command(command: str, *, ledger_conn_id: str | None = None, **options: object) -> str:
    """The command line a user runs for ``command`` on the ledger of ``ledger_conn_id`` (for messages).

    Options are given as keyword arguments (``batch=12`` → ``--batch 12``); strings are quoted.
    """
    parts = [PROG, command]
    if ledger_conn_id:
        parts += ["--conn-id", shlex.quote(ledger_conn_id)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        parts += [flag, shlex.quote(str(value))]
    return " ".join(parts)


def abandon_command(
    batch_id: int, ledger_conn_id: str | None = None, reason: str = "<why the offsets are gone>"
) -> str:
    """The command that abandons ``batch_id`` (error messages name it)."""
    return ledger_command("abandon", ledger_conn_id=ledger_conn_id, batch=batch_id, reason=reason)
