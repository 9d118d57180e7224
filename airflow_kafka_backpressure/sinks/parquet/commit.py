"""The Parquet directory's commit: publishing one attempt's staging directory as the batch, on the
driver side of the write (:mod:`.write` runs it there).

Layout under the sink root::

    <sink>/batch_id=<N>/part-*.parquet        the batch's data (Hive-style partition directory)
    <sink>/batch_id=<N>/_manifest.json        what the batch holds (see below)
    <sink>/batch_id=<N>/_errors/part-*.parquet  the batch's records that did not decode (a pipeline
                                              with a key_format or value_format): the error table,
                                              swapped in with the batch, hidden from its readers
    <sink>/_kbp_staging_<N>_<token>/          a write in progress, or one a crash left behind
    <sink>/_kbp_replaced_<N>_<token>/         a previous version being removed
    <sink>/_kbp_fence_<N>/<attempt>_<token>   the attempts that started writing and have not
                                              committed yet (:mod:`.fencing`; a commit removes its
                                              own and older ones, and the directory once empty)

Names starting with ``_`` are skipped by Spark's and pyarrow's dataset readers (temporary names
contain no ``=``: Spark would take ``_x=y`` for a partition directory), so readers of the root see
each batch once or not at all.

What the commit does, and what a crash after each step leaves:

1. keep exactly the Parquet files Spark's committer published in the staging directory (its
   ``_SUCCESS`` marker, checksum files and anything else are deleted);
2. collect the reader's completion records (``_read/``: one per input partition read to its end,
   with the executor that read it), so the manifest counts the records *read* per topic-partition,
   whatever the transform did;
3. write ``_manifest.json`` into the staging directory — crash: a hidden leftover;
4. refuse to replace a committed batch that belongs to another pipeline or other offset ranges (a
   reset ledger or two pipelines sharing a sink would otherwise overwrite older output), and refuse
   to commit when a newer attempt of the same batch started writing or committed it (fencing by
   the ledger's attempt number, :mod:`.fencing`);
5. swap staging in as ``batch_id=<N>`` — the commit:

   * local filesystems (Linux): if ``batch_id=<N>`` exists, ``renameat2(RENAME_EXCHANGE)`` swaps
     the two directories in one atomic step (readers see the old version or the new one, never
     neither, never both); else ``renameat2(RENAME_NOREPLACE)`` (refused if another attempt
     committed meanwhile);
   * fallback (object stores, HDFS, filesystems without renameat2): rename the committed version
     to ``_kbp_replaced_<N>_<token>``, then staging to ``batch_id=<N>`` — between the two renames
     the batch is briefly absent (never duplicated); a crash there fails the job, and its retry
     rewrites the batch. On S3 this step fails today: pyarrow cannot rename a directory there
     (``NO_SUCH_KEY`` on a ``CopyObject`` of the directory key), so the commit raises and leaves the
     staging directory (``tests/integration/test_s3_server.py``; issue 22);
6. delete the replaced version and this batch's other leftovers.

Re-running a batch therefore always converges to exactly one copy of its records. An empty batch is
still committed: one schema-only Parquet file plus the manifest.

Manifest fields: ``manifest_version``, ``batch_id``, ``token`` and ``attempt`` (the attempt that wrote
it: its token and the ledger's attempt number, or null), ``written_at_ms``, ``format``, ``files``
([{name, bytes, rows}]), ``rows`` (written), ``executors`` (distinct executors that read the batch's
ranges: named by the Python reader's completion records, or for the native reader by the driver's
status store; when none is known — an empty batch, a Connect session's native read — at least one
if Spark wrote a file), ``ranges``, ``partitions``
([{topic, partition, records}] read), ``records``, ``bytes`` (key + value bytes read), ``unread``
(ranges the job did not read to their end, or read without counting — the transform did not
consume them, or it read them with the native reader; their counts come from a second read), and what the caller passes as ``describe`` (pipeline, run id, reader,
transform).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_kafka_backpressure.batch.models import OffsetRange, batch_path
from airflow_kafka_backpressure.sinks.base import SinkFormatError
from airflow_kafka_backpressure.sinks.completion import completed_reads, tally_reads
from airflow_kafka_backpressure.sinks.parquet.fencing import (
    ERRORS_DIR,
    clear_fence,
    fence_markers,
    fence_problem,
    read_fence,
)
from airflow_kafka_backpressure.sinks.parquet.manifest import MANIFEST_NAME, manifest_at
from airflow_kafka_backpressure.storage import Location, StorageError, location

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

STAGING_PREFIX = "_kbp_staging_"
REPLACED_PREFIX = "_kbp_replaced_"
READ_DIR = "_read"
MANIFEST_VERSION = 2


class SinkError(SinkFormatError):
    """The sink could not be written or committed; the message says what to do."""


def staging_dir_name(batch_id: int, token: str) -> str:
    return f"{STAGING_PREFIX}{int(batch_id)}_{token}"


def batch_dir_name(batch_id: int) -> str:
    return batch_path("", batch_id).lstrip("/")


def staging_uri(sink: str, batch_id: int, token: str) -> str:
    """The staging directory of attempt ``token`` (string only: a Connect client may not be able to
    build the sink's filesystem, and needs none to name it)."""
    return sink.rstrip("/") + "/" + staging_dir_name(batch_id, token)


def errors_uri(sink: str, batch_id: int, token: str) -> str:
    """Where attempt ``token`` writes the batch's bad records (inside its staging directory)."""
    return staging_uri(sink, batch_id, token) + "/" + ERRORS_DIR


def read_records_dir(sink: str, batch_id: int, token: str) -> str:
    """Where the reader records the input partitions it read completely (inside the staging dir)."""
    return staging_uri(sink, batch_id, token) + "/" + READ_DIR


def _arrow_schema(schema: StructType) -> Any:
    """``schema`` as Arrow's, timestamps in UTC. pyspark's converter takes ``timezone="UTC"`` from
    Spark 4.2 and ``timestamp_utc=True`` in 4.0 and 4.1."""
    import inspect

    from pyspark.sql.pandas.types import to_arrow_schema

    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[call-arg, unused-ignore]


def _write_empty_file(staging: Location, schema: StructType, compression: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    name = f"part-00000-empty.{compression}.parquet"
    target = staging.child(name)
    pq.write_table(
        _arrow_schema(schema).empty_table(),
        target.path,
        filesystem=target.fs,
        compression=compression,
    )
    return {"name": name, "bytes": int(target.fs.get_file_info(target.path).size), "rows": 0}


def _published_files(staging: Location) -> list[dict[str, Any]]:
    """The Parquet files Spark's committer published in ``staging`` ({name, bytes, rows}, rows from
    each file's footer); every other entry but the reader's records is deleted."""
    import pyarrow.parquet as pq

    files = []
    for name, is_dir, size in staging.children():
        if name in (READ_DIR, ERRORS_DIR) and is_dir:
            continue
        if is_dir or name.startswith(("_", ".")) or not name.endswith(".parquet"):
            staging.child(name).delete()  # _SUCCESS, checksum files, an aborted task's _temporary
            continue
        f = staging.child(name)
        try:
            rows = pq.read_metadata(f.path, filesystem=f.fs).num_rows
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot read the Parquet footer of {f.uri}: {e}") from e
        files.append({"name": name, "bytes": int(size), "rows": int(rows)})
    return sorted(files, key=lambda f: f["name"])


def check_replaceable(
    existing: dict[str, Any] | None, describe: dict[str, Any], ranges: Sequence[OffsetRange], where: str
) -> None:
    """Refuse to replace a committed batch written for another pipeline or other offsets (pure).

    A replay of the same pipeline's batch that writes the planned ranges trimmed at their start
    (retention or a topic reset took offsets, and the committed version could not be adopted: it is
    incomplete) replaces it: the same batch, every offset it still holds read again."""
    if existing is None:
        return
    theirs_pipeline = existing.get("pipeline")
    theirs = sorted(OffsetRange.from_dict(r) for r in existing.get("ranges", ()))
    ours = sorted(r for r in ranges)
    if theirs_pipeline != describe.get("pipeline"):
        raise SinkError(
            f"{where} already holds a batch of another pipeline, {theirs_pipeline!r} (this is "
            f"{describe.get('pipeline')!r}): two pipelines share this sink. Refusing to overwrite its data: give "
            "each pipeline its own sink, then replay this batch"
        )
    if theirs == ours or _trimmed(theirs, ours):
        return
    raise SinkError(
        f"{where} already holds this pipeline's batch with ranges {', '.join(map(str, theirs)) or 'none'}, not "
        f"{', '.join(map(str, ours)) or 'none'}: the batch id belongs to other offsets, so the ledger was reset, "
        "restored from an older backup or pointed elsewhere (its batch ids started again). Refusing to overwrite "
        "that data: move the sink's old output away (or give the pipeline a new sink) and replay the batch"
    )


def _trimmed(theirs: Sequence[OffsetRange], ours: Sequence[OffsetRange]) -> bool:
    """``ours`` is ``theirs`` with some ranges starting later (same partitions, same ends)."""
    mine = {r.tp: r for r in ours}
    return set(mine) == {r.tp for r in theirs} and all(
        mine[r.tp].until_offset == r.until_offset and mine[r.tp].from_offset >= r.from_offset for r in theirs
    )


def commit_batch(
    sink: str,
    batch_id: int,
    token: str,
    ranges: Sequence[OffsetRange],
    describe: dict[str, Any],
    schema: StructType,
    compression: str = "snappy",
    *,
    attempt: int | None = None,
    reads: Sequence[tuple[OffsetRange, int, int]] = (),
    read_by: Sequence[str] = (),
    written_rows: int | None = None,
    error_rows: int | None = None,
) -> dict[str, Any]:
    """Publish the staging directory of attempt ``token`` as batch ``batch_id`` (see the module doc).
    ``reads``: ranges read to their end, with their records and key+value bytes, known on the
    driver (the native reader's observed counts) rather than left as completion records, and
    ``read_by`` the executors that read them. ``written_rows``: the rows the writer wrote (Spark
    counted them as they went to its Parquet writer, after the transform; the arrow writer's tasks
    report theirs): the published files must hold exactly as many, or nothing is published.
    ``error_rows``: the bad records written into ``_errors/`` (a decoded batch), checked the same
    way and recorded as ``bad_records``."""
    root = location(sink)
    staging = root.child(staging_dir_name(batch_id, token))
    final = root.child(batch_dir_name(batch_id))
    try:
        staging.mkdirs()
        files = _published_files(staging)
        read_dir = staging.child(READ_DIR)
        completed, executors = completed_reads(read_dir)
        executors |= set(read_by)
        counts, nbytes, unread = tally_reads(ranges, [*completed, *reads])
        read_dir.delete()
        seen = sum(int(f["rows"]) for f in files)
        errors_dir = staging.child(ERRORS_DIR)
        error_files = _published_files(errors_dir) if error_rows and errors_dir.exists() else []
        bad = sum(int(f["rows"]) for f in error_files)
        if error_rows is not None and bad != error_rows:
            written_rows, seen = error_rows, bad  # the same refusal: files the committing side cannot see
        if written_rows is not None and seen != written_rows:
            staging.delete()
            raise SinkError(
                f"batch {batch_id}: the writer wrote {written_rows} rows but the committing side sees {seen} "
                f"in {len(files)} Parquet file(s) under {staging.uri}; nothing was published. The files were "
                "written where the Spark driver cannot see them (a local sink path while executors run on "
                "other hosts: use a path every executor and the driver share, such as HDFS, S3 or a shared "
                "mount) or removed during the commit"
            )
        # executors: those that read the ranges; none read (an empty batch, the native reader): at
        # least the one that wrote a file
        n_executors = len(executors) or (1 if files else 0)
        if not files:
            files = [_write_empty_file(staging, schema, compression)]
        manifest: dict[str, Any] = {
            "manifest_version": MANIFEST_VERSION,
            "batch_id": int(batch_id),
            "token": token,
            "attempt": attempt,
            **describe,
            "ranges": [r.to_dict() for r in ranges],
            "partitions": [
                {"topic": r.topic, "partition": r.partition, "records": counts[r.tp]}
                for r in ranges
                if r.tp in counts
            ],
            "records": sum(counts.values()),
            "bytes": nbytes,
            "unread": [r.to_dict() for r in unread],
            "rows": sum(int(f["rows"]) for f in files),
            "executors": n_executors,
            "format": "parquet",
            "files": files,
            "written_at_ms": int(time.time() * 1000),
            "bad_records": bad,
            "error_files": error_files,
        }
        staging.child(MANIFEST_NAME).write_bytes(json.dumps(manifest, sort_keys=True).encode())

        existing = manifest_at(final) if final.exists() else None
        try:
            check_replaceable(existing, describe, ranges, final.uri)
            problem = fence_problem(batch_id, attempt, token, read_fence(root, batch_id), existing)
            if problem:
                raise SinkError(problem)
        except SinkError:
            staging.delete()
            committed_by = None if existing is None else existing.get("attempt")
            if attempt is not None and committed_by is not None and int(committed_by) > attempt:
                # a zombie refused by the committed version: its marker (and any older) is redundant
                clear_fence(root, batch_id, int(committed_by))
            raise
        _swap_in(root, staging, final, batch_id, token, replace=existing is not None or final.exists())
        _delete_leftovers(root, batch_id, attempt)
        if attempt is not None:
            clear_fence(root, batch_id, attempt)
        return manifest
    except StorageError as e:
        raise SinkError(f"batch {batch_id}: cannot commit to sink {sink!r}: {e}") from e


def _delete_leftovers(root: Location, batch_id: int, attempt: int | None) -> None:
    """After a commit: the replaced version, and the staging directories of this attempt and older
    ones (crashes, aborted writes). A newer attempt's staging directory is its write in progress:
    it stays (its attempt is known from its fence marker, raised before it writes)."""
    attempts = fence_markers(root, batch_id)
    staging = f"{STAGING_PREFIX}{int(batch_id)}_"
    for name, _, _ in root.children():
        if name.startswith(f"{REPLACED_PREFIX}{int(batch_id)}_"):
            root.child(name).delete()
        elif name.startswith(staging):
            theirs = attempts.get(name[len(staging) :])
            if theirs is None or attempt is None or theirs <= attempt:
                root.child(name).delete()


def _swap_in(
    root: Location, staging: Location, final: Location, batch_id: int, token: str, *, replace: bool
) -> None:
    """Publish ``staging`` as ``final`` (module doc, step 5); the old version ends up under a
    leftover name that the caller deletes."""
    if replace:
        if staging.exchange_with(final):  # atomic: staging now holds the previous version
            return
        replaced = root.child(f"{REPLACED_PREFIX}{int(batch_id)}_{token}")
        final.move_to(replaced)
        try:
            staging.move_to(final)
        except StorageError:
            if not final.exists():
                replaced.move_to(final)  # put the previous version back; the retry replaces it
            raise
        return
    if not staging.move_no_replace(final):
        staging.delete()
        raise SinkError(
            f"batch {batch_id}: another attempt committed {final.uri} while this one (token {token[:8]}…) "
            "was committing; this attempt's output is discarded — run the batch again if it is still unfinished"
        )


def leftovers(sink: str, batch_id: int) -> list[str]:
    """Names of this batch's temporary directories under the sink root (crashes, or a running write)."""
    prefixes = (f"{STAGING_PREFIX}{int(batch_id)}_", f"{REPLACED_PREFIX}{int(batch_id)}_")
    return sorted(name for name, _, _ in location(sink).children() if name.startswith(prefixes))
