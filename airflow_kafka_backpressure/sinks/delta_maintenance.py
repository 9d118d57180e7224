"""The Delta sink's maintenance (:mod:`.maintenance`), through delta-rs (``deltalake``):

* **compaction**: delta-rs's ``OPTIMIZE`` (bin-packing each partition's small files into files of
  ``target_file_mb``; with ``sort_by``, a Z-order by that column), one commit that removes the
  small files and adds the merged ones. A later rewrite of a batch (a replay) finds its rows in
  the merged files by their statistics and copies the other batches' rows out, as it does after
  Spark's ``OPTIMIZE`` (``sinks/delta.py``);
* **transaction ids**: ``delta.setTransactionRetentionDuration`` = the retention, so that the
  per-batch application ids the sink commits with (one a batch) drop out of the table's state
  once their batch can no longer be in flight, instead of growing it by one a batch forever;
* **VACUUM**: files the table no longer references (removed by compaction or a batch's
  rewrite, or written by an attempt that never committed) and older than the retention are
  deleted. The Delta log keeps its own retention (``delta.logRetentionDuration``, 30 days by
  default), which the sink's read-back of a batch's commit relies on.

On S3 the commit is delta-rs's own: the ledger's lock of the table (held by every batch job into a
maintained table, and by the maintenance) makes the maintenance the table's only writer while it
runs, so delta-rs's unsafe-rename mode is safe here.
"""

from __future__ import annotations

from typing import Any

from .base import SinkFormatError
from .delta_rs import add_actions, delta_table
from .maintenance import MaintenanceReport, PartitionFiles, partition_key, retention_hours_whole, tally

#: The table property that bounds how long Delta keeps an application's transaction id.
TXN_RETENTION = "delta.setTransactionRetentionDuration"


def _files(table: Any) -> dict[str, PartitionFiles]:
    actions = add_actions(table)
    columns = table.metadata().partition_columns
    return tally(
        [(partition_key({c: a.get(f"partition.{c}") for c in columns}), a["size_bytes"]) for a in actions]
    )


def maintain_delta(sink: str, options: Any) -> MaintenanceReport:
    """One maintenance of the Delta table at ``sink`` (module doc); ``options``: the pipeline's
    :class:`~..batch.options.MaintenanceOptions`."""
    table = delta_table(sink, writing=True, why=f"the maintenance of the Delta table {sink}")
    report = MaintenanceReport(table=sink, format="delta")
    if table is None:
        report.notes.append("no table yet (its first batch creates it)")
        return report
    report.before = _files(table)
    hours = retention_hours_whole(options.retention_s)
    wanted = f"interval {hours} hours"
    if table.metadata().configuration.get(TXN_RETENTION) != wanted:
        table.alter.set_table_properties({TXN_RETENTION: wanted}, raise_if_not_exists=False)
        report.notes.append(f"{TXN_RETENTION} set to {wanted!r}")
    if options.sort_by is not None:
        if options.sort_by not in [f.name for f in table.schema().fields]:
            raise SinkFormatError(
                f"maintenance.sort_by = {options.sort_by!r}: the Delta table {sink} has no such column; "
                "name one of its columns or set sort_by to null"
            )
        metrics = table.optimize.z_order([options.sort_by], target_size=options.target_file_bytes)
    else:
        metrics = table.optimize.compact(target_size=options.target_file_bytes)
    report.files_removed = int(metrics.get("numFilesRemoved", 0))
    report.files_added = int(metrics.get("numFilesAdded", 0))
    deleted = table.vacuum(
        retention_hours=hours,
        dry_run=False,
        full=True,  # files no log entry names too (an attempt that never committed), not only removed ones
        # the pipeline's retention rule is checked when its DAGs load; the table's own default
        # (7 days) may be longer than the user chose
        enforce_retention_duration=False,
    )
    report.files_deleted = len(deleted)
    table.update_incremental()
    report.after = _files(table)
    report.version = str(table.version())
    return report
