"""The ledger's command line: ``python -m airflow_kafka_backpressure.ledger COMMAND [options]``.

Which ledger: ``--url URL`` (any SQLAlchemy URL), or ``--conn-id ID`` (an Airflow connection, resolved
like the pipeline's ``ledger_conn_id``; needs Airflow's configuration), else the default SQLite ledger
under ``AIRFLOW_HOME``.

``upgrade [--revision REV]``
    Bring the schema to the newest revision (tasks also do this on first use).
``current``
    Print the schema revision.
``abandon --batch N --reason TEXT [--stale-after-s S]``
    Give up a batch whose offsets can never be read again (retention deleted them): it becomes
    ``abandoned``, its offsets are recorded as lost with the reason, and commits move past it. A
    batch still marked planned/running/replaying needs ``--stale-after-s`` (no activity for that long).
``prune --pipeline NAME (--keep-batches N | --older-than-days D | --losses-older-than-days L)``
    Delete old finished batches with their ranges (see :meth:`Ledger.prune`); their recorded losses
    stay, unless ``--losses-older-than-days`` deletes those of pruned batches recorded before then.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .commands import PROG
from .engine import default_ledger_url
from .migrate import head_revision
from .records import PruneResult
from .repository import Ledger, now_ms
from .states import LedgerError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Manage the Kafka backpressure ledger.")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        where = p.add_mutually_exclusive_group()
        where.add_argument("--url", help="SQLAlchemy URL of the ledger")
        where.add_argument(
            "--conn-id", help="Airflow connection id of the ledger (the pipeline's ledger_conn_id)"
        )
        return p

    up = add("upgrade", "Bring the ledger's schema to the newest revision this package knows.")
    up.add_argument("--revision", default="head", help="target revision (default: head)")
    add("current", "Print the ledger's schema revision.")
    ab = add(
        "abandon", "Give up a batch whose offsets retention deleted: record them as lost, let commits pass."
    )
    ab.add_argument("--batch", type=int, required=True, help="the batch id")
    ab.add_argument("--reason", required=True, help="why (kept with the lost offsets, shown on the page)")
    ab.add_argument(
        "--stale-after-s",
        type=float,
        help="allow a planned/running/replaying batch idle for this long (seconds)",
    )
    pr = add(
        "prune",
        "Delete old finished batches and their ranges (never past a commit or a head); recorded losses "
        "stay unless --losses-older-than-days is given.",
    )
    pr.add_argument("--pipeline", required=True)
    keep = pr.add_argument_group("what to keep (at least one)")
    keep.add_argument("--keep-batches", type=int, help="keep the newest N batches")
    keep.add_argument("--older-than-days", type=float, help="delete only batches that ended this long ago")
    keep.add_argument(
        "--losses-older-than-days",
        type=float,
        help="also delete recorded losses this old whose batch was pruned (kept otherwise)",
    )
    return parser


def resolve_url(url: str | None, conn_id: str | None) -> str:
    if url:
        return url
    if conn_id:
        from airflow.sdk import BaseHook  # Airflow only when a connection must be resolved

        from .connection import ledger_url

        return ledger_url(BaseHook.get_connection(conn_id))
    return default_ledger_url()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        url = resolve_url(args.url, args.conn_id)
        with Ledger(url) as ledger:
            return _run(args, ledger)
    except (LedgerError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, ledger: Ledger) -> int:
    if args.command == "upgrade":
        before, after = ledger.upgrade(args.revision)
        what = "already at" if before == after else f"upgraded from {before or 'no schema'} to"
        print(f"Ledger {ledger.url}: {what} revision {after}.")
        return 0
    if args.command == "current":
        revision = ledger.schema_revision()
        head = head_revision()
        note = "up to date" if revision == head else f"this package's newest is {head}; run `{PROG} upgrade`"
        print(f"Ledger {ledger.url}: revision {revision or 'none'} ({note}).")
        return 0
    ledger.upgrade()
    if args.command == "abandon":
        stale_before = None if args.stale_after_s is None else now_ms() - int(args.stale_after_s * 1000)
        batch = ledger.abandon(args.batch, args.reason, stale_before_ms=stale_before)
        lost = sum(r.until_offset - r.from_offset for r in ledger.batch_ranges(batch.batch_id))
        print(
            f"Batch {batch.batch_id} of pipeline {batch.pipeline!r} is abandoned: its {lost} offsets are "
            "recorded as lost; commits may move past them."
        )
        return 0
    if args.command == "prune":
        batches = args.keep_batches is not None or args.older_than_days is not None
        if not batches and args.losses_older_than_days is None:
            print(
                "error: give --keep-batches and/or --older-than-days (and/or --losses-older-than-days)",
                file=sys.stderr,
            )
            return 2
        result = PruneResult()
        if batches:
            older = (
                None if args.older_than_days is None else now_ms() - int(args.older_than_days * 86_400_000)
            )
            result += ledger.prune(args.pipeline, keep_batches=args.keep_batches, older_than_ms=older)
        if args.losses_older_than_days is not None:
            if not args.losses_older_than_days > 0:
                print("error: --losses-older-than-days must be > 0", file=sys.stderr)
                return 2
            result += ledger.prune_losses(
                args.pipeline, older_than_ms=now_ms() - int(args.losses_older_than_days * 86_400_000)
            )
        print(
            f"Pipeline {args.pipeline!r}: pruned {result.batches} batches, {result.ranges} ranges, "
            f"{result.losses} loss records."
        )
        return 0
    raise AssertionError(args.command)  # argparse only accepts the commands above


if __name__ == "__main__":
    sys.exit(main())
