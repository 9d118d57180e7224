"""Issue 9, item 3: the sink's commit is fenced by the ledger's attempt number, and a replaced batch
is swapped in atomically — real Spark (the session-scoped local[2] fixture) writing a local sink,
read back with pyarrow."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from airflow_kafka_backpressure.models import OffsetRange
from airflow_kafka_backpressure.spark import sink as sink_mod
from airflow_kafka_backpressure.spark.fencing import raise_fence, read_fence
from airflow_kafka_backpressure.storage import location

RANGES = (OffsetRange("t", 0, 0, 4),)
DESCRIBE = {"pipeline": "orders"}


def _rows(spark, ids):
    return spark.createDataFrame([(i, f"r{i}") for i in ids], "id long, name string")


def ids(sink: Path) -> list[int]:
    return sorted(pads.dataset(str(sink), format="parquet", partitioning="hive").to_table().column("id").to_pylist())


def write(spark, sink: Path, rows, attempt: int, token: str, df=None):
    return sink_mod.write_batch(
        spark, df if df is not None else _rows(spark, rows), str(sink), 1, RANGES, DESCRIBE, token=token, attempt=attempt
    )


def test_an_older_attempt_cannot_commit_over_a_newer_one(spark, tmp_path):
    sink = tmp_path / "sink"
    m = write(spark, sink, range(4), attempt=2, token="b" * 32)
    assert (m["attempt"], m["token"]) == (2, "b" * 32) and read_fence(location(str(sink)), 1) == 2
    # the attempt before it (a retry's predecessor that lost its lease, still running) finishes late
    with pytest.raises(Exception, match="attempt 1 .* is older than the batch's newest attempt"):
        write(spark, sink, range(100, 104), attempt=1, token="a" * 32)
    assert ids(sink) == [0, 1, 2, 3]
    assert sink_mod.read_manifest(str(sink), 1)["token"] == "b" * 32
    assert sink_mod.leftovers(str(sink), 1) == []
    # a newer attempt replaces it
    m = write(spark, sink, range(4), attempt=3, token="c" * 32)
    assert (m["attempt"], ids(sink)) == (3, [0, 1, 2, 3])


def test_a_newer_attempt_that_starts_while_an_older_one_writes_wins_at_commit(spark, tmp_path):
    """Attempt 4 raises the fence while attempt 3's write tasks run (from inside a task, after the
    writer was created): attempt 3's commit is refused and its output discarded."""
    from pyspark.sql import functions as F

    sink = tmp_path / "sink"
    write(spark, sink, range(4), attempt=1, token="a" * 32)
    root = str(sink)

    @F.udf("long")
    def newer_attempt_starts(i):
        raise_fence(location(root), 1, 4, "d" * 32)
        return i

    df = _rows(spark, range(200, 204)).withColumn("id", newer_attempt_starts("id"))
    with pytest.raises(Exception, match="attempt 3 .* attempt 4 started writing it"):
        write(spark, sink, None, attempt=3, token="c" * 32, df=df)
    assert ids(sink) == [0, 1, 2, 3] and sink_mod.read_manifest(root, 1)["token"] == "a" * 32
    assert sink_mod.leftovers(root, 1) == []


def test_a_reader_never_finds_a_replaced_batch_missing_or_doubled(spark, tmp_path):
    """While a batch is replaced again and again, a reader polling the sink root sees exactly one
    complete copy every time (the local swap is one renameat2(RENAME_EXCHANGE))."""
    sink = tmp_path / "sink"
    write(spark, sink, range(4), attempt=1, token="a" * 32)
    final = sink / "batch_id=1"
    stop = threading.Event()
    seen = {"polls": 0, "missing": 0, "visible_copies": set()}

    def reader():
        while not stop.is_set():
            visible = [n for n in os.listdir(sink) if not n.startswith(("_", "."))]
            seen["visible_copies"].add(len(visible))
            try:  # the committed batch's path always resolves to a directory with a manifest
                fd = os.open(final, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                seen["missing"] += 1
            else:
                os.close(fd)
            seen["polls"] += 1

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        for attempt in range(2, 8):
            write(spark, sink, range(4), attempt=attempt, token=f"{attempt:032d}")
    finally:
        stop.set()
        t.join(10)
    assert seen["polls"] > 100
    assert seen["missing"] == 0 and seen["visible_copies"] == {1}
    assert ids(sink) == [0, 1, 2, 3] and sink_mod.leftovers(str(sink), 1) == []
