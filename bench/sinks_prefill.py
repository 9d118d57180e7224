"""``bench/sinks.py``'s prefills: a sink's history of small batches written without Spark, so that
10,000 batches take minutes instead of half a day (that module's doc says what each holds). Each
prefill copies batch 0's committed files, made by the product's own commit, into batches
``start`` … ``stop - 1`` with their own ids, offsets and metadata."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.sinks import sink_format_for
from airflow_kafka_backpressure.sinks.parquet.commit import batch_dir_name

#: The bench's pipeline, its topic and the topic's partitions.
PIPELINE, TOPIC, PARTITIONS = "bench", "bench-events", 4


def batch_ranges(batch_id: int, rows: int) -> list[OffsetRange]:
    """The ranges of :func:`kafka_rows`'s batch of ``rows`` rows that starts at offset ``batch_id * rows``."""
    per = -(-rows // PARTITIONS)
    first = batch_id * rows
    return [
        OffsetRange(TOPIC, p, first, first + min(per, rows - p * per))
        for p in range(PARTITIONS)
        if rows > p * per
    ]


def as_batch(data: Any, batch_id: int, rows: int) -> Any:
    """A data file's rows of batch 0 (an Arrow table) as batch ``batch_id``'s: its batch id, and its
    offsets moved on by ``batch_id * rows`` (:func:`batch_ranges`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from airflow_kafka_backpressure.sinks.table import BATCH_COLUMN

    batch_col = data.schema.get_field_index(BATCH_COLUMN)
    offset_col = data.schema.get_field_index("offset")
    offset_type = data.schema.field(offset_col).type
    return data.set_column(
        batch_col, data.schema.field(batch_col), pa.array([batch_id] * data.num_rows, pa.int64())
    ).set_column(
        offset_col,
        data.schema.field(offset_col),
        pc.add(data.column(offset_col), pa.scalar(batch_id * rows, offset_type)),
    )


def prefill_parquet(sink: str, start: int, stop: int, rows: int) -> None:
    """Batches ``start`` … ``stop - 1`` of the Parquet directory: copies of batch 0's committed
    folder, each with its own manifest (batch id, ranges)."""
    import json

    root = Path(sink)
    template = root / batch_dir_name(0)
    manifest = json.loads((template / "_manifest.json").read_text())
    for batch_id in range(start, stop):
        target = root / batch_dir_name(batch_id)
        shutil.copytree(template, target)
        manifest.update(batch_id=batch_id, ranges=[r.to_dict() for r in batch_ranges(batch_id, rows)])
        (target / "_manifest.json").write_text(json.dumps(manifest))


def prefill_delta(sink: str, start: int, stop: int, rows: int) -> None:
    """Batches ``start`` … ``stop - 1`` of the Delta table, one log entry (table version) each with
    what the product's commit of the batch holds, copied from batch 0's (the first, written by
    Spark): for each of its data files a Parquet file of the batch's rows (batch 0's with the batch's
    id and offsets) and its ``add`` action with the file's statistics, the batch's
    ``txn`` (``txnAppId`` of the batch, ``txnVersion`` 1) and a ``commitInfo`` with its
    ``userMetadata``; then one checkpoint (delta-rs) at the last version, as Spark keeps one every 10
    commits. Written straight into ``_delta_log`` (one file per version, as Delta commits): a writer
    that goes through a Delta library pays for the table's state at every commit (delta-rs took
    30 ms a commit at 500 versions and 220 ms at 2,000, growing on)."""
    import json
    import uuid

    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from airflow_kafka_backpressure.sinks.delta import BATCH_COLUMN, app_id

    log_dir = Path(sink) / "_delta_log"
    versions = sorted(int(f.name.split(".")[0]) for f in log_dir.glob("*.json"))
    first = [json.loads(line) for line in (log_dir / f"{0:020d}.json").read_text().splitlines() if line]
    adds = [a["add"] for a in first if "add" in a]
    commit_info = next(a["commitInfo"] for a in first if "commitInfo" in a)
    templates = [(pq.read_table(Path(sink) / a["path"]), json.loads(a["stats"])) for a in adds]
    version = versions[-1]
    for batch_id in range(start, stop):
        version += 1
        now_ms = int(time.time() * 1000)
        shift = batch_id * rows
        actions: list[dict[str, Any]] = []
        for data, stats in templates:
            out = as_batch(data, batch_id, rows)
            name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            # INT96 timestamps, as Spark's writer left the template (pyarrow reads them as
            # nanoseconds, and INT64 nanoseconds are a type Spark's reader refuses)
            pq.write_table(out, Path(sink) / name, compression="snappy", use_deprecated_int96_timestamps=True)
            file_stats = json.loads(json.dumps(stats))
            for bound in ("minValues", "maxValues"):
                file_stats[bound][BATCH_COLUMN] = batch_id
                file_stats[bound]["offset"] = stats[bound]["offset"] + shift
            add = {
                "path": name,
                "partitionValues": {},
                "size": (Path(sink) / name).stat().st_size,
                "modificationTime": now_ms,
                "dataChange": True,
                "stats": json.dumps(file_stats),
            }
            actions.append({"add": add})
        metadata = {
            "kbp": 1,
            "pipeline": PIPELINE,
            "batch_id": batch_id,
            "attempt": 1,
            "ranges": [r.to_dict() for r in batch_ranges(batch_id, rows)],
            "expected_records": rows,
            "details": {},
        }
        info = {
            **commit_info,
            "timestamp": now_ms,
            "readVersion": version - 1,
            "userMetadata": json.dumps(metadata, sort_keys=True),
            "txnId": str(uuid.uuid4()),
        }
        entries = [
            {"commitInfo": info},
            {"txn": {"appId": app_id(PIPELINE, batch_id), "version": 1, "lastUpdated": now_ms}},
            *actions,
        ]
        with open(log_dir / f"{version:020d}.json", "x") as f:  # "x": as Delta, never over an entry
            f.write("".join(json.dumps(e) + "\n" for e in entries))
    DeltaTable(sink).create_checkpoint()


def prefill_iceberg(sink: str, start: int, stop: int, rows: int, *, catalog_uri: str, kept: int) -> None:
    """Batches ``start`` … ``stop - 1`` of the Iceberg table as its maintenance keeps it: each batch its
    data files (batch 0's, as many as Spark wrote, with the batch's id and offsets, in a folder
    of the batch's own as the sink writes), committed through pyiceberg as the sink commits (no
    Spark); the newest ``kept`` batches one commit each with its ``kbp.batch`` property
    (the sink's commit without its checks, through its transaction), the older ones in commits of
    1,000 batches, and then every snapshot but the newest ``kept`` expired: the table a
    maintenance's snapshot expiry leaves at a retention of that many intervals (docs/sinks.md: 720
    is 12 h at a 60 s interval), before its compaction (``--compaction`` times that next). Without
    expiry a 10,000-batch history would be hours of commits here (each costs some 0.13 ms more per
    kept snapshot)."""
    import json
    import uuid

    import pyarrow.parquet as pq

    from airflow_kafka_backpressure.sinks.iceberg import BATCH_PROPERTY
    from airflow_kafka_backpressure.sinks.iceberg_transaction import MemoTransaction
    from airflow_kafka_backpressure.sinks.table import BATCH_COLUMN, batch_metadata

    fmt = sink_format_for("iceberg", {"iceberg_catalog_uri": catalog_uri})
    table = fmt.load(sink)
    templates = []  # batch 0's data files, as many as Spark wrote
    for task in table.scan(row_filter=f"{BATCH_COLUMN} == 0").plan_files():
        with table.io.new_input(task.file.file_path).open() as f:
            templates.append(pq.read_table(f))

    def data_files(batch_id: int) -> list[str]:
        folder = Path(sink) / "data" / f"{BATCH_COLUMN}={batch_id}" / f"1-{uuid.uuid4().hex}"
        folder.mkdir(parents=True)
        paths = []
        for i, data in enumerate(templates):
            paths.append(str(folder / f"part-{i:05d}.snappy.parquet"))
            pq.write_table(as_batch(data, batch_id, rows), paths[-1], compression="snappy")
        return paths

    t0 = time.perf_counter()
    one_by_one = max(start, stop - kept)
    for first in range(start, one_by_one, 1000):
        with MemoTransaction(table) as tx:
            files = [p for b in range(first, min(first + 1000, one_by_one)) for p in data_files(b)]
            tx.add_files(files, check_duplicate_files=False)
    for batch_id in range(one_by_one, stop):
        ranges = batch_ranges(batch_id, rows)
        metadata = batch_metadata(PIPELINE, batch_id, 1, ranges, rows, {})
        with MemoTransaction(table) as tx:
            tx.add_files(
                data_files(batch_id),
                snapshot_properties={BATCH_PROPERTY: json.dumps(metadata, sort_keys=True)},
                check_duplicate_files=False,
            )
    newest = {s.snapshot_id for s in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0)[-kept:]}
    expired = [s.snapshot_id for s in table.snapshots() if s.snapshot_id not in newest]
    if expired:
        table.maintenance.expire_snapshots().by_ids(expired).commit()
    print(
        f"    (iceberg prefill of batches {start}-{stop - 1}: {time.perf_counter() - t0:.0f} s; "
        f"{len(table.snapshots())} snapshots kept, {len(table.current_snapshot().manifests(table.io))} manifests)"
    )
