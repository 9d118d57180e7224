"""An Iceberg commit's cost against the snapshots the table keeps, in one run: pyiceberg alone.

The Iceberg sink commits each batch through pyiceberg (``IcebergSink.write_batch``: ``add_files``
of the files Spark wrote, without pyiceberg's duplicate-file check, the batch's identity in the
snapshot's summary). This script makes the same commits without Spark or Kafka (one small Parquet
file each, the sink's ``kbp.batch`` summary property) into a table of pyiceberg's SQL catalog on
SQLite, and prints the median time of the last 10 commits at each checkpoint, for pyiceberg's
default fast append and for merge append (``commit.manifest-merge.enabled``) through pyiceberg's
own ``Transaction``, and for the fast append through the sink's (``sinks.iceberg_transaction``:
the metadata view built once per staged update), then the share of the last commit spent
deep-copying the table's metadata (``cProfile``). Flat would be a ratio near 1.

    .venv/bin/python bench/iceberg_commit_growth.py                  # 10, 100, 300, 1000 snapshots
    .venv/bin/python bench/iceberg_commit_growth.py --checkpoints 10,300

What it showed (docs/benchmarks.md): through pyiceberg's own transaction the time grows with the
snapshots kept, whichever append: each read of the transaction's metadata (some 17 a commit)
applies the staged updates and deep-copies the whole table metadata, which lists every kept
snapshot. The sink's transaction builds it once per update; what is left grows far less (the
metadata file is still read, validated and written whole), and snapshot expiry (the maintenance's
``retention_hours``) bounds that.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


#: The variants timed: (name, merge append, the sink's transaction)
VARIANTS = (("fast", False, False), ("merge", True, False), ("sink's", False, True))


def run(
    name: str, merge: bool, memo: bool, checkpoints: list[int], work: Path
) -> tuple[dict[int, float], float]:
    """Median ms of the last 10 commits at each checkpoint, and the share of the last commit's
    time spent in pydantic's deep copies of the table metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.catalog.sql import SqlCatalog

    from airflow_kafka_backpressure.sinks.iceberg_transaction import MemoTransaction

    root = work / name.replace("'", "")
    root.mkdir()
    catalog = SqlCatalog("kbp", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}")
    catalog.create_namespace("kbp")
    schema = pa.schema([("id", pa.int64()), ("value", pa.string())])
    properties = {"commit.retry.num-retries": "0"}  # the sink's OWN_RETRIES
    if merge:
        properties["commit.manifest-merge.enabled"] = "true"
    catalog.create_table("kbp.events", schema=schema, location=f"{root}/events", properties=properties)
    (root / "events" / "data").mkdir(parents=True, exist_ok=True)
    times: list[float] = []
    medians: dict[int, float] = {}
    share = 0.0
    last = checkpoints[-1]
    for i in range(last):
        path = f"{root}/events/data/{i}.parquet"
        pq.write_table(pa.table({"id": range(i * 10, i * 10 + 10), "value": ["x"] * 10}, schema=schema), path)
        batch = {
            "pipeline": "bench",
            "batch_id": i + 1,
            "attempt": 1,
            "ranges": [
                {"topic": "events", "partition": q, "from_offset": i * 10, "until_offset": i * 10 + 10}
                for q in range(4)
            ],
        }
        profile = cProfile.Profile() if i == last - 1 else None
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        table = catalog.load_table("kbp.events")
        with MemoTransaction(table) if memo else table.transaction() as tx:
            tx.add_files(
                [path],
                snapshot_properties={"kbp.batch": json.dumps(batch, sort_keys=True)},
                check_duplicate_files=False,
            )
        if profile is not None:
            profile.disable()
        times.append(time.perf_counter() - started)
        if profile is not None:
            stats = pstats.Stats(profile).stats
            copies = sum(v[3] for k, v in stats.items() if k[2] == "model_copy")
            share = copies / times[-1]
        if i + 1 in checkpoints:
            medians[i + 1] = statistics.median(times[-10:]) * 1000
            print(
                f"{name:>6} append, {i + 1:>5} snapshots: "
                f"{medians[i + 1]:7.0f} ms per commit (median of the last 10)",
                flush=True,
            )
    return medians, share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoints", default="10,100,300,1000", help="snapshot counts to time at")
    args = ap.parse_args()
    checkpoints = sorted({int(x) for x in args.checkpoints.split(",")})
    if checkpoints[0] < 10:
        ap.error("--checkpoints must be >= 10 (each is the median of the last 10 commits)")
    (REPO / ".tmp").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-iceberg-", dir=REPO / ".tmp"))
    try:
        results = {name: run(name, merge, memo, checkpoints, work) for name, merge, memo in VARIANTS}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first, last = checkpoints[0], checkpoints[-1]
    for name, (medians, share) in results.items():
        print(
            f"{name} append: {last} / {first} snapshots = {medians[last] / medians[first]:.1f}x; "
            f"{(medians[last] - medians[first]) / (last - first):.2f} ms more per kept snapshot; "
            f"{share:.0%} of the last commit deep-copying the table metadata"
        )


if __name__ == "__main__":
    main()
