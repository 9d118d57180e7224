"""The Iceberg sink's maintenance (:mod:`.maintenance`), through pyiceberg (0.12 has snapshot
expiry but no rewrite of data files, so the compaction is here):

* **compaction**: per partition with two or more small data files (under ``target_file_mb``),
  the files are read (pyarrow), concatenated (a file written before a schema change gets the new
  columns as nulls), ordered by ``sort_by`` when given, and written as files of about
  ``target_file_mb`` into ``<table>/data/kbp_compacted/<uuid>/``; one ``overwrite`` snapshot
  removes the small files and adds the merged ones (``kbp.maintenance`` in its summary, no
  ``kbp.batch``: it is no batch's commit). A data file with delete files attached is left as it
  is (its rows are not all live). A later rewrite of a batch (a replay) deletes its rows from the
  merged files by their statistics, copying the other batches' rows;
* **snapshot expiry**: snapshots older than the retention go (never a branch's or tag's head);
* **unreferenced files**: files in the table's ``data/`` and ``metadata/`` folders that no
  remaining snapshot or metadata file references and older than the retention are deleted: the
  small files compaction replaced, the data of expired snapshots, an attempt's files that never
  committed (nothing else under the table's location is touched: a catalog's SQLite file kept
  there stays).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from .base import SinkFormatError
from .maintenance import MAINTENANCE_PROPERTY, MaintenanceReport, tally

#: Where compaction writes, under the table's data folder (beside the batches' ``kbp_batch_id=N``).
COMPACTED_FOLDER = "kbp_compacted"


def _live_tasks(table: Any) -> list[Any]:
    return [] if table.current_snapshot() is None else list(table.scan().plan_files())


def _partition_name(table: Any, data_file: Any) -> str:
    spec = table.specs()[data_file.spec_id]
    return spec.partition_to_path(data_file.partition, table.schema()) if spec.fields else ""


def _files(table: Any, tasks: list[Any]) -> dict[str, Any]:
    return tally([(_partition_name(table, t.file), t.file.file_size_in_bytes) for t in tasks])


def _groups(table: Any, tasks: list[Any], target: int) -> list[list[Any]]:
    """The data files compaction merges (of the table's live ``tasks``): per partition (and spec),
    those under ``target`` bytes with no delete file, where there are two or more."""
    by_partition: dict[tuple[int, str], list[Any]] = {}
    for task in tasks:
        f = task.file
        if task.delete_files or f.file_size_in_bytes >= target:
            continue
        by_partition.setdefault((f.spec_id, _partition_name(table, f)), []).append(f)
    return [files for _, files in sorted(by_partition.items()) if len(files) >= 2]


def _merged(io: Any, files: list[Any], sort_by: str | None) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for f in files:
        with io.new_input(f.file_path).open() as stream:
            tables.append(pq.read_table(stream))
    merged = pa.concat_tables(tables, promote_options="permissive")
    if sort_by is not None:
        merged = merged.sort_by(sort_by)
    return merged


def _write(io: Any, location: str, rows: Any, target: int, on_disk: int) -> list[str]:
    """``rows`` as Parquet files of about ``target`` bytes (``on_disk``: what the rows took in
    their small files), their paths."""
    import pyarrow.parquet as pq

    per_file = max(1, int(rows.num_rows * target / max(on_disk, 1)))
    folder = f"{location}/data/{COMPACTED_FOLDER}/{uuid.uuid4().hex}"
    paths = []
    for n, start in enumerate(range(0, rows.num_rows, per_file)):
        path = f"{folder}/{n:05d}.parquet"
        with io.new_output(path).create() as stream:
            pq.write_table(rows.slice(start, per_file), stream)
        paths.append(path)
    return paths


def _compact(table: Any, tasks: list[Any], io: Any, options: Any, report: MaintenanceReport) -> Any:
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    target = options.target_file_bytes
    groups = _groups(table, tasks, target)
    if not groups:
        return table
    if (
        options.sort_by is not None
        and table.schema().find_field(options.sort_by, case_sensitive=True) is None
    ):
        raise SinkFormatError(
            f"maintenance.sort_by = {options.sort_by!r}: the Iceberg table {table.name()} has no such column; "
            "name one of its columns or set sort_by to null"
        )
    added = []
    for files in groups:
        rows = _merged(io, files, options.sort_by)
        on_disk = sum(f.file_size_in_bytes for f in files)
        for path in _write(io, table.location().rstrip("/"), rows, target, on_disk):
            added.append(parquet_file_to_data_file(io, table.metadata, path))
    removed = [f for files in groups for f in files]
    report.files_removed, report.files_added = len(removed), len(added)
    with table.transaction() as tx:
        with tx.update_snapshot(
            snapshot_properties={MAINTENANCE_PROPERTY: report.commit_property()}
        ).overwrite() as op:
            for f in removed:
                op.delete_data_file(f)
            for f in added:
                op.append_data_file(f)
    return table


def _referenced(table: Any, io: Any) -> set[str]:
    """Every file the table's metadata references: its metadata files, manifest lists, manifests
    and the data files of every snapshot kept."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    paths = {table.metadata_location, *(m.metadata_file for m in table.metadata.metadata_log)}
    for snapshot in table.metadata.snapshots:
        paths.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in paths:  # snapshots share manifests, and a manifest never changes
                continue
            paths.add(manifest.manifest_path)
            paths.update(
                e.data_file.file_path for e in manifest.fetch_manifest_entry(io, discard_deleted=True)
            )
    return {PyArrowFileIO.parse_location(p)[2] for p in paths}


#: The folders under a table's location that hold its files (Iceberg's defaults, where pyiceberg
#: and the sink write): nothing else there is looked at, let alone deleted
TABLE_FOLDERS = ("data", "metadata")


def _unreferenced(table: Any, io: Any, older_than: float) -> Iterable[str]:
    """The paths of files in the table's folders (:data:`TABLE_FOLDERS`) that nothing references
    and that were last modified before ``older_than`` (seconds since the epoch)."""
    from pyarrow.fs import FileSelector, FileType
    from pyiceberg.io.pyarrow import PyArrowFileIO

    scheme, netloc, root = PyArrowFileIO.parse_location(table.location().rstrip("/"))
    fs = io.fs_by_scheme(scheme, netloc)
    referenced = _referenced(table, io)
    for folder in TABLE_FOLDERS:
        for info in fs.get_file_info(FileSelector(f"{root}/{folder}", recursive=True, allow_not_found=True)):
            if info.type != FileType.File or info.path in referenced:
                continue
            if info.mtime is not None and info.mtime.timestamp() < older_than:
                yield f"{scheme}://{info.path}" if scheme != "file" else info.path


def maintain_iceberg(sink_format: Any, sink: str, options: Any) -> MaintenanceReport:
    """One maintenance of the Iceberg table at ``sink`` (module doc), through ``sink_format``'s
    catalog (an :class:`~.iceberg.IcebergSink`); ``options``: the pipeline's
    :class:`~..batch.options.MaintenanceOptions`."""
    table = sink_format.load(sink)
    report = MaintenanceReport(table=sink, format="iceberg")
    if table is None:
        report.notes.append("no table yet (its first batch creates it)")
        return report
    io = sink_format.io(sink)
    tasks = _live_tasks(table)  # planned once for the report and the compaction
    report.before = _files(table, tasks)
    table = _compact(table, tasks, io, options, report)
    cutoff = time.time() - options.retention_s
    kept = len(table.snapshots())
    table.maintenance.expire_snapshots().older_than(datetime.fromtimestamp(cutoff, timezone.utc)).commit()
    table = sink_format.load(sink)
    report.snapshots_expired = kept - len(table.snapshots())
    for path in list(_unreferenced(table, io, cutoff)):
        io.delete(path)
        report.files_deleted += 1
    report.after = _files(table, _live_tasks(table))
    snapshot = table.current_snapshot()
    report.version = None if snapshot is None else str(snapshot.snapshot_id)
    return report


__all__ = ["COMPACTED_FOLDER", "maintain_iceberg"]
