"""Issue 9, item 3: the sink's commit is fenced by the ledger's attempt number, and a replaced batch
is swapped in atomically — real Spark (the session-scoped local[2] fixture) writing a local sink,
read back with pyarrow."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.sinks.parquet import commit as parquet_commit
from airflow_kafka_backpressure.sinks.parquet import manifest as parquet_manifest
from airflow_kafka_backpressure.sinks.parquet import write as parquet_write
from airflow_kafka_backpressure.sinks.parquet.fencing import (
    clear_fence,
    fence_markers,
    raise_fence,
    read_fence,
)
from airflow_kafka_backpressure.storage import location

RANGES = (OffsetRange("t", 0, 0, 4),)
DESCRIBE = {"pipeline": "orders"}


def _rows(spark, ids):
    return spark.createDataFrame([(i, f"r{i}") for i in ids], "id long, name string")


def ids(sink: Path) -> list[int]:
    return sorted(
        pads.dataset(str(sink), format="parquet", partitioning="hive").to_table().column("id").to_pylist()
    )


def write(spark, sink: Path, rows, attempt: int, token: str, df=None):
    return parquet_write.write_batch(
        spark,
        df if df is not None else _rows(spark, rows),
        str(sink),
        1,
        RANGES,
        DESCRIBE,
        token=token,
        attempt=attempt,
    )


def test_an_older_attempt_cannot_commit_over_a_newer_one(spark, tmp_path):
    sink = tmp_path / "sink"
    m = write(spark, sink, range(4), attempt=2, token="b" * 32)
    assert (m["attempt"], m["token"]) == (2, "b" * 32)
    # the commit cleared its fence: the committed manifest's attempt fences older attempts from now on
    assert read_fence(location(str(sink)), 1) is None and not (sink / "_kbp_fence_1").exists()
    # the attempt before it (a retry's predecessor that lost its lease, still running) finishes late
    with pytest.raises(Exception, match="attempt 1 .* is older than the batch's newest attempt"):
        write(spark, sink, range(100, 104), attempt=1, token="a" * 32)
    assert ids(sink) == [0, 1, 2, 3]
    assert parquet_manifest.read_manifest(str(sink), 1)["token"] == "b" * 32
    assert parquet_commit.leftovers(str(sink), 1) == []
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
    assert ids(sink) == [0, 1, 2, 3] and parquet_manifest.read_manifest(root, 1)["token"] == "a" * 32
    assert parquet_commit.leftovers(root, 1) == []


class RenameWatch:
    """Every rename under one directory, as Linux inotify reports it (IN_MOVED_FROM / IN_MOVED_TO
    with the entry's name), read through ctypes."""

    IN_MOVED_FROM, IN_MOVED_TO, IN_NONBLOCK = 0x40, 0x80, 0o4000

    def __init__(self, path: Path) -> None:
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(self.IN_NONBLOCK)
        assert self.fd >= 0, ctypes.get_errno()
        wd = self.libc.inotify_add_watch(
            self.fd, os.fsencode(str(path)), self.IN_MOVED_FROM | self.IN_MOVED_TO
        )
        assert wd >= 0, ctypes.get_errno()

    def events(self) -> list[tuple[str, str]]:
        import struct

        out = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            i = 0
            while i < len(data):
                _, mask, _, n = struct.unpack_from("iIII", data, i)
                name = data[i + 16 : i + 16 + n].rstrip(b"\0").decode()
                out.append(("from" if mask & self.IN_MOVED_FROM else "to", name))
                i += 16 + n

    def close(self) -> None:
        os.close(self.fd)


def test_a_replaced_batch_is_swapped_in_one_step_never_missing_or_doubled(spark, tmp_path):
    """While a batch is replaced again and again: the committed version is never renamed away to
    wait for the new one (the two-rename fallback's window, seen as a move to ``_kbp_replaced_*``):
    on a local sink the swap is one renameat2(RENAME_EXCHANGE) with the staging directory. A reader
    polling the root meanwhile always finds the batch, and only one visible copy."""
    sink = tmp_path / "sink"
    write(spark, sink, range(4), attempt=1, token="a" * 32)
    final = sink / "batch_id=1"
    watch = RenameWatch(sink)
    stop = threading.Event()
    seen = {"polls": 0, "missing": 0, "visible_copies": set()}

    def reader():
        while not stop.is_set():
            visible = [n for n in os.listdir(sink) if not n.startswith(("_", "."))]
            seen["visible_copies"].add(len(visible))
            try:  # the committed batch's path always resolves to a directory
                fd = os.open(final, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                seen["missing"] += 1
            else:
                os.close(fd)
            seen["polls"] += 1

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        for attempt in range(2, 6):
            write(spark, sink, range(4), attempt=attempt, token=f"{attempt:032d}")
    finally:
        stop.set()
        t.join(10)
    events = watch.events()
    watch.close()
    moved_to = [name for kind, name in events if kind == "to"]
    assert moved_to.count("batch_id=1") == 4  # each replacement moved a new version in ...
    assert not [n for n in moved_to if n.startswith("_kbp_replaced_")], events  # ... never the old one aside
    # ... and the old version went where the new one came from (the exchange), to be deleted there
    assert sorted(n for n in moved_to if n.startswith("_kbp_staging_1_")) == [
        f"_kbp_staging_1_{a:032d}" for a in range(2, 6)
    ]
    assert seen["polls"] > 100
    assert seen["missing"] == 0 and seen["visible_copies"] == {1}
    assert ids(sink) == [0, 1, 2, 3] and parquet_commit.leftovers(str(sink), 1) == []


def test_racing_attempts_never_lower_the_fence(tmp_path):
    """Issue 22, item 5: the fence was one file read and then rewritten, so an older attempt racing a
    newer one could write its lower number last. Each attempt now adds its own marker: after any
    interleaving the fence is the highest attempt that raised it."""
    root = location(str(tmp_path / "sink"))
    for batch_id in range(1, 21):
        start = threading.Barrier(8)
        problems: dict[int, str | None] = {}
        errors: list[BaseException] = []

        def raise_(attempt: int, start=start, problems=problems, batch_id=batch_id, errors=errors) -> None:
            start.wait()
            try:
                problems[attempt] = raise_fence(root, batch_id, attempt, f"{attempt:032d}")
            except BaseException as e:  # noqa: BLE001 - a racing attempt must not fail: asserted below
                errors.append(e)

        threads = [threading.Thread(target=raise_, args=(a,)) for a in range(1, 9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # an attempt listing the fence while another renamed its marker into place failed once
        # ("cannot list .../_kbp_fence_3": the other's temporary file went between read and stat)
        assert not errors, errors
        assert read_fence(root, batch_id) == 8, batch_id
        assert problems[8] is None  # the newest is never refused


def test_a_commit_deletes_only_its_own_and_older_attempts_staging(tmp_path):
    """Issue 22, item 5: a commit deleted every staging directory of the batch, a newer attempt's
    write in progress included (that attempt's commit then found its files gone). The cleanup after
    attempt 2's commit: attempt 1's crash leftover, its own staging, an unfenced write's and the
    replaced version go; attempt 3's write in progress stays."""
    sink = tmp_path / "sink"
    root = location(str(sink))
    tokens = {1: "a" * 32, 2: "b" * 32, 3: "c" * 32}
    for attempt, token in tokens.items():
        assert raise_fence(root, 1, attempt, token) is None or attempt < 3
        (sink / parquet_commit.staging_dir_name(1, token)).mkdir(parents=True)
    (sink / parquet_commit.staging_dir_name(1, tokens[3]) / "part-0.parquet").write_bytes(b"in progress")
    (sink / parquet_commit.staging_dir_name(1, "e" * 32)).mkdir()  # a write without an attempt number
    (sink / f"{parquet_commit.REPLACED_PREFIX}1_{tokens[2]}").mkdir()
    (
        sink / parquet_commit.staging_dir_name(2, tokens[1])
    ).mkdir()  # another batch's: not this commit's business
    parquet_commit._delete_leftovers(root, 1, 2)
    assert parquet_commit.leftovers(str(sink), 1) == [parquet_commit.staging_dir_name(1, tokens[3])]
    assert (sink / parquet_commit.staging_dir_name(1, tokens[3]) / "part-0.parquet").exists()
    assert parquet_commit.leftovers(str(sink), 2) == [parquet_commit.staging_dir_name(2, tokens[1])]


def test_a_commit_of_fewer_rows_than_were_written_publishes_nothing(spark, tmp_path):
    """Issue 22, item 5: the commit published the Parquet files the committing side could see, so a
    batch whose files landed elsewhere (a local sink path with executors on other hosts) committed
    fewer rows, or none, as a success. The rows written now travel to the commit, which compares."""
    sink = tmp_path / "sink"

    def write_then_lose_a_file(staging: str) -> int:
        _rows(spark, range(6)).repartition(2).write.parquet(staging)
        parts = sorted(Path(location(staging).path).glob("part-*.parquet"))
        assert len(parts) == 2
        parts[0].unlink()  # what the driver sees of a file written on another host's local disk
        return 6

    with pytest.raises(
        Exception,
        match=r"(?s)batch 1: the writer wrote 6 rows but the committing side sees [0-5] .*nothing was published.*local sink path",
    ):
        parquet_write.write_batch(
            spark,
            _rows(spark, []),
            str(sink),
            1,
            RANGES,
            DESCRIBE,
            token="d" * 32,
            attempt=1,
            write_data=write_then_lose_a_file,
        )
    assert not (sink / parquet_commit.batch_dir_name(1)).exists()
    assert parquet_commit.leftovers(str(sink), 1) == []
    # Spark's own writer: the rows it wrote are counted as they pass, and the commit agrees
    m = write(spark, sink, range(5), attempt=2, token="e" * 32)
    assert m["rows"] == 5 and ids(sink) == [0, 1, 2, 3, 4]


def test_a_commit_clears_its_own_and_older_fence_markers_and_keeps_a_newer_attempts(spark, tmp_path):
    """Issue 22, item 6: every batch left a ``_kbp_fence_<N>/`` directory in the sink root for ever.
    A commit now removes the markers of its attempt and older ones, and the directory once empty;
    a newer attempt's marker (its write in progress) stays and still fences the attempts between."""
    sink = tmp_path / "sink"
    root = location(str(sink))
    for batch_id in (1, 2, 3):
        parquet_write.write_batch(
            spark,
            _rows(spark, range(batch_id * 10, batch_id * 10 + 2)),
            str(sink),
            batch_id,
            RANGES,
            DESCRIBE,
            token=f"{batch_id:032d}",
            attempt=1,
        )
    assert sorted(p.name for p in sink.iterdir()) == ["batch_id=1", "batch_id=2", "batch_id=3"]

    # batch 1 again: attempt 4 starts writing while attempt 3 commits
    assert raise_fence(root, 1, 3, "c" * 32) is None
    assert raise_fence(root, 1, 4, "d" * 32) is None
    clear_fence(root, 1, 3)
    assert fence_markers(root, 1) == {"d" * 32: 4}
    with pytest.raises(Exception, match="attempt 3 .* attempt 4 started writing it"):
        write(spark, sink, range(4), attempt=3, token="c" * 32)  # a zombie between: still refused
    write(spark, sink, range(4), attempt=4, token="d" * 32)
    assert not (sink / "_kbp_fence_1").exists() and ids(sink) == [0, 1, 2, 3, 20, 21, 30, 31]
    with pytest.raises(Exception, match="attempt 2 .* attempt 4 .* committed it"):
        write(spark, sink, range(4), attempt=2, token="b" * 32)  # fenced by the manifest alone
    assert sorted(p.name for p in sink.iterdir()) == ["batch_id=1", "batch_id=2", "batch_id=3"]


def test_clearing_a_fence_never_loses_a_newer_attempts_marker_raised_meanwhile(tmp_path):
    """The fence directory is removed only while empty (rmdir), and a marker write that finds its
    directory gone creates it again: over many races of a commit's cleanup (attempt 1) against a
    newer attempt raising the fence (attempt 2), the newer marker always survives and no call fails.
    2,000 races (a few seconds): the directory removed between Arrow's create and its check failed
    about 1 race in 3,000 before ``Location.mkdirs`` created it again (200 races failed once in CI)."""
    root = location(str(tmp_path / "sink"))
    for batch_id in range(1, 2001):
        race_clear_against_raise(root, batch_id)


def race_clear_against_raise(root, batch_id: int) -> None:
    """Attempt 1 of ``batch_id`` raises the fence; then its commit's cleanup and attempt 2 raising
    the fence run together, released at once. Asserts that no call failed and attempt 2's marker
    is the fence's one marker."""
    errors: list[BaseException] = []
    assert raise_fence(root, batch_id, 1, "a" * 32) is None
    start = threading.Barrier(2)

    def run(fn, *args) -> None:
        start.wait()
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    threads = [
        threading.Thread(target=run, args=(clear_fence, root, batch_id, 1)),
        threading.Thread(target=run, args=(raise_fence, root, batch_id, 2, "b" * 32)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert fence_markers(root, batch_id) == {"b" * 32: 2}, batch_id
