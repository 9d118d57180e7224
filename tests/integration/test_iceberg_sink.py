"""The Iceberg sink (``sinks/iceberg.py``) against the session's real SparkSession (local[2]) writing
the files and a real pyiceberg SQL catalog committing them: SQLite on a local path, and PostgreSQL
(the session's server) for the catalog workers on several hosts would share.

Every read-back goes through pyiceberg (the catalog, the table's current snapshot, its data files),
never through Spark or the sink's own read-back. What stands in: no REST catalog server can be
installed here; pyiceberg's SQL catalog is the JDBC catalog's schema, the one the issue names.
"""

from __future__ import annotations

import json
from collections import Counter
from urllib.parse import urlsplit

import pytest

from airflow_kafka_backpressure import sinks
from airflow_kafka_backpressure.batch.models import Adoption, JobSpec, OffsetRange
from airflow_kafka_backpressure.sinks import BatchCommit, IcebergSink, SinkFenced, SinkFormatError
from airflow_kafka_backpressure.sinks.iceberg import BATCH_PROPERTY
from airflow_kafka_backpressure.sinks.table import BATCH_COLUMN, PIPELINE_COLUMN
from airflow_kafka_backpressure.spark.job import run_batch
from kbp_local.producer import ensure_topic, produce

from .test_delta_sink import ranges
from .test_spark_job import make_spec

PIPELINE = "orders"


def rows(spark, batch_id: int, n: int, attempt: int):
    return spark.range(n).selectExpr(
        "id AS offset",
        f"{attempt} AS written_by",
        f"'b{batch_id}' AS value",
        "current_timestamp() AS timestamp",
    )


@pytest.fixture
def catalog_uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/catalog.db"


def write(spark, uri: str, table: str, batch_id: int, attempt: int, n: int, planned=None) -> BatchCommit:
    return IcebergSink(uri).write_batch(
        spark,
        rows(spark, batch_id, n, attempt),
        table,
        pipeline=PIPELINE,
        batch_id=batch_id,
        attempt=attempt,
        ranges=ranges(batch_id, n) if planned is None else planned,
        expected_records=n,
    )


def loaded(uri: str, name: str = "kbp.t"):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("kbp", uri=uri).load_table(name)


def contents(uri: str, name: str = "kbp.t") -> dict[int, tuple[int, set[int]]]:
    """batch id -> (rows, attempts that wrote them), as pyiceberg reads the table's current snapshot."""
    table = loaded(uri, name).scan().to_arrow()
    batches = table.column(BATCH_COLUMN).to_pylist()
    attempts = table.column("written_by").to_pylist()
    assert set(table.column(PIPELINE_COLUMN).to_pylist()) <= {PIPELINE}
    out: dict[int, tuple[int, set[int]]] = {}
    for b, n in Counter(batches).items():
        out[b] = (n, {a for bb, a in zip(batches, attempts) if bb == b})
    return out


def snapshots(uri: str, name: str = "kbp.t") -> list[dict]:
    """Each snapshot's kbp.batch JSON (None where the snapshot has none), oldest first."""
    out = []
    for s in loaded(uri, name).snapshots():
        raw = s.summary.additional_properties.get(BATCH_PROPERTY) if s.summary else None
        out.append(None if raw is None else json.loads(raw))
    return out


def test_the_registry_names_iceberg_and_it_takes_its_sink_options():
    assert sinks.SINK_FORMATS["iceberg"] is IcebergSink
    fmt = sinks.sink_format_for(
        "iceberg", {"iceberg_catalog_uri": "sqlite:////x.db", "iceberg_namespace": "lake"}
    )
    assert (fmt.catalog_uri, fmt.namespace, fmt.identifier("/data/orders")) == (
        "sqlite:////x.db",
        "lake",
        "lake.orders",
    )
    assert fmt.identifier("/data/my-orders") == "lake.my-orders"
    with pytest.raises(
        SinkFormatError, match="last path segment 'my.orders'.*a dot would be read as a namespace"
    ):
        fmt.identifier("/data/my.orders")


def test_a_batch_lands_once_and_a_retry_of_the_same_attempt_adds_nothing(spark, tmp_path, catalog_uri):
    table = str(tmp_path / "t")
    first = write(spark, catalog_uri, table, 1, attempt=1, n=10)
    assert (first.batch_id, first.attempt, first.record_count, first.ranges) == (1, 1, 10, ranges(1, 10))
    assert contents(catalog_uri) == {1: (10, {1})}
    again = write(spark, catalog_uri, table, 1, attempt=1, n=10)  # the task's retry after its commit
    assert again == first
    assert contents(catalog_uri) == {1: (10, {1})}
    assert len(snapshots(catalog_uri)) == 1  # nothing committed again
    schema = loaded(catalog_uri).schema()
    assert [f.name for f in schema.fields][:2] == [PIPELINE_COLUMN, BATCH_COLUMN]
    assert str(schema.find_field("timestamp").field_type) == "timestamptz"  # microseconds, Iceberg's
    assert not any(f.required for f in schema.fields)  # later batches may hold nulls


def test_a_newer_attempt_replaces_the_batch_and_an_older_one_is_refused(spark, tmp_path, catalog_uri):
    table = str(tmp_path / "t")
    write(spark, catalog_uri, table, 1, attempt=1, n=10)
    write(spark, catalog_uri, table, 2, attempt=1, n=4)
    write(spark, catalog_uri, table, 1, attempt=3, n=10)  # a replay: replaces batch 1's rows, not 2's
    assert contents(catalog_uri) == {1: (10, {3}), 2: (4, {1})}
    held = len(snapshots(catalog_uri))
    with pytest.raises(SinkFenced, match="attempt 2 was refused, attempt 3 has committed the batch"):
        write(spark, catalog_uri, table, 1, attempt=2, n=10)  # the zombie
    assert contents(catalog_uri) == {1: (10, {3}), 2: (4, {1})}
    assert len(snapshots(catalog_uri)) == held


def test_a_replay_of_batch_5_after_batches_6_and_7_lands(spark, tmp_path, catalog_uri):
    table = str(tmp_path / "t")
    for b in (6, 7):
        write(spark, catalog_uri, table, b, attempt=1, n=3)
    write(spark, catalog_uri, table, 5, attempt=2, n=5)
    assert contents(catalog_uri) == {5: (5, {2}), 6: (3, {1}), 7: (3, {1})}
    assert [s["batch_id"] for s in snapshots(catalog_uri) if s] == [6, 7, 5]


def test_a_commit_of_another_row_count_than_was_read_is_not_made(spark, tmp_path, catalog_uri):
    table = str(tmp_path / "t")
    write(spark, catalog_uri, table, 1, attempt=1, n=4)
    with pytest.raises(
        SinkFormatError, match="wrote 3 rows but the batch must publish 5; nothing was committed"
    ):
        IcebergSink(catalog_uri).write_batch(
            spark, rows(spark, 2, 3, 1), table, pipeline=PIPELINE, batch_id=2, attempt=1,
            ranges=ranges(2, 5), expected_records=5,
        )  # fmt: skip
    assert contents(catalog_uri) == {1: (4, {1})}
    assert IcebergSink(catalog_uri).committed(spark, table, pipeline=PIPELINE, batch_id=2) is None


def test_a_batch_id_the_table_holds_for_other_offsets_is_refused_before_anything_is_deleted(
    spark, tmp_path, catalog_uri
):
    table = str(tmp_path / "t")
    write(spark, catalog_uri, table, 3, attempt=1, n=6)
    other = (OffsetRange("orders", 0, 50_000, 50_006),)  # the ledger started its ids again
    for attempt in (1, 2):
        with pytest.raises(
            SinkFormatError, match="already holds this batch id with ranges.*Nothing was written"
        ):
            write(spark, catalog_uri, table, 3, attempt=attempt, n=6, planned=other)
    assert contents(catalog_uri) == {3: (6, {1})}


def test_a_sink_whose_name_the_catalog_holds_elsewhere_is_refused(spark, tmp_path, catalog_uri):
    write(spark, catalog_uri, str(tmp_path / "a" / "t"), 1, attempt=1, n=2)
    with pytest.raises(SinkFormatError, match=r"kbp\.t in the catalog is at .*/a/t, not at the sink .*/b/t"):
        write(spark, catalog_uri, str(tmp_path / "b" / "t"), 1, attempt=1, n=2)


def test_the_catalog_on_postgresql(spark, tmp_path, postgres_schema_url, monkeypatch):
    """The catalog workers on several hosts would share, with the password out of the URL (the sink
    refuses one in it): PostgreSQL's client reads PGPASSWORD."""
    parts = urlsplit(postgres_schema_url)
    if parts.password:
        monkeypatch.setenv("PGPASSWORD", parts.password)
    uri = postgres_schema_url.replace(f":{parts.password}@", "@") if parts.password else postgres_schema_url
    table = str(tmp_path / "t")
    write(spark, uri, table, 1, attempt=1, n=5)
    write(spark, uri, table, 1, attempt=2, n=5)
    assert contents(uri) == {1: (5, {2})}
    with pytest.raises(SinkFormatError, match=r"'postgresql://kbp:\*\*\*@db/lake'.*holds a password") as e:
        IcebergSink("postgresql://kbp:s3cret@db/lake").catalog()
    assert "s3cret" not in str(e.value)


def test_the_job_commits_a_batch_and_a_replay_adopts_it(
    spark, kafka_broker, topic_name, tmp_path, catalog_uri
):
    """Through ``run_batch``, Kafka read by the session's broker: the batch's Kafka columns land typed,
    and the worker that died after the commit is replaced by a replay that adopts it."""
    ensure_topic(kafka_broker.bootstrap, topic_name, 2)
    produce(kafka_broker.bootstrap, topic_name, count=30, partitions=2)
    planned = {(topic_name, 0): (0, 5), (topic_name, 1): (10, 13)}
    sink = tmp_path / "events"
    spec = make_spec(
        tmp_path, kafka_broker.bootstrap, 1, planned, sink=sink, options={"iceberg_catalog_uri": catalog_uri}
    )
    spec = JobSpec.from_dict({**spec.to_dict(), "sink_format": "iceberg", "attempt": 1})

    metrics = run_batch(spark, spec)
    assert (metrics.records, metrics.adopted) == (8, False)
    table = loaded(catalog_uri, "kbp.events").scan().to_arrow()
    assert sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist())) == [
        (0, o) for o in range(5)
    ] + [(1, o) for o in range(10, 13)]
    assert str(loaded(catalog_uri, "kbp.events").schema().find_field("timestamp").field_type) == "timestamptz"

    replay = JobSpec.from_dict(
        {**spec.to_dict(), "attempt": 2, "adopt": Adoption("a" * 32, spec.plan.ranges).to_dict()}
    )
    again = run_batch(spark, replay)
    assert (again.records, again.adopted) == (8, True)
    assert {(p.partition, p.records) for p in again.partitions} == {(0, 5), (1, 3)}
    assert [s["attempt"] for s in snapshots(catalog_uri, "kbp.events") if s] == [1]  # nothing rewritten


class CommitsBetween(IcebergSink):
    """Fault injection for the race below: after this writer's check of the table (the batch's
    newest commit) and before its transaction, ``meanwhile`` runs once (another writer commits)."""

    def __init__(self, uri: str, meanwhile) -> None:
        super().__init__(uri)
        self.meanwhile = meanwhile

    def io(self, sink: str):
        if self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            run()
        return super().io(sink)


@pytest.mark.parametrize("zombie, newer", [(1, 2), (2, 3)])
def test_a_zombie_whose_check_passed_before_a_newer_attempt_committed_loses_the_swap(
    spark, tmp_path, catalog_uri, zombie, newer
):
    """The zombie finds no newer commit and writes its files; meanwhile the newer attempt commits the
    batch. The catalog refuses the zombie's swap (the table changed since it read it); read again,
    the table names the newer attempt: the zombie is refused and nothing of it lands. A first
    attempt's zombie deletes nothing: without the sink's own retries (pyiceberg's are off) its
    append would land beside the newer attempt's rows."""
    table = str(tmp_path / "t")
    write(spark, catalog_uri, table, 7, attempt=1, n=2)  # another batch: the table exists
    if zombie > 1:
        write(spark, catalog_uri, table, 1, attempt=1, n=10)

    def commit_newer() -> None:
        write(spark, catalog_uri, table, 1, attempt=newer, n=10)

    stale = CommitsBetween(catalog_uri, commit_newer)
    with pytest.raises(SinkFenced, match=f"attempt {zombie} was refused, attempt {newer} has committed"):
        stale.write_batch(
            spark, rows(spark, 1, 10, zombie), table, pipeline=PIPELINE, batch_id=1, attempt=zombie,
            ranges=ranges(1, 10), expected_records=10,
        )  # fmt: skip
    assert contents(catalog_uri) == {1: (10, {newer}), 7: (2, {1})}


def test_a_writer_that_lost_the_swap_to_another_batch_commits_on_the_table_read_again(
    spark, tmp_path, catalog_uri
):
    """Two batches' writers at once (Iceberg needs no lock between them): batch 2's commit lands
    while batch 1's transaction is built; batch 1's swap is refused, read again, and lands on top."""
    table = str(tmp_path / "t")
    write(spark, catalog_uri, table, 1, attempt=1, n=3)

    def other() -> None:
        write(spark, catalog_uri, table, 2, attempt=1, n=4)

    CommitsBetween(catalog_uri, other).write_batch(
        spark, rows(spark, 3, 5, 1), table, pipeline=PIPELINE, batch_id=3, attempt=1,
        ranges=ranges(3, 5), expected_records=5,
    )  # fmt: skip
    assert contents(catalog_uri) == {1: (3, {1}), 2: (4, {1}), 3: (5, {1})}


def days_rows(spark, batch_id: int, n: int, attempt: int, first_day: int = 0):
    """``n`` rows of batch ``batch_id`` whose ``timestamp`` falls on three UTC days from
    2025-11-24 + ``first_day`` (row i on day i % 3), ``id`` = batch_id * 1000 + i."""
    base = 1_763_942_400 + first_day * 86_400  # 2025-11-24T00:00:00Z
    return spark.range(n).selectExpr(
        f"{batch_id} * 1000 + id AS id",
        f"{attempt} AS written_by",
        f"timestamp_seconds({base} + (id % 3) * 86400 + 3600) AS timestamp",
    )


def test_a_batch_spanning_three_days_lands_in_three_partitions_and_its_replay_rewrites_only_its_rows(
    spark, tmp_path, catalog_uri
):
    from pyiceberg.expressions import EqualTo

    from airflow_kafka_backpressure.sinks.table import PartitionBy

    table, day = str(tmp_path / "t"), PartitionBy("day", "timestamp")
    sink = IcebergSink(catalog_uri)

    def commit(batch_id: int, attempt: int, first_day: int) -> None:
        sink.write_batch(
            spark, days_rows(spark, batch_id, 9, attempt, first_day), table, pipeline=PIPELINE,
            batch_id=batch_id, attempt=attempt, ranges=ranges(batch_id, 9), expected_records=9,
            partition_by=day,
        )  # fmt: skip

    commit(1, 1, 0)  # 2025-11-24, 25, 26
    commit(2, 1, 1)  # 2025-11-25, 26, 27: two days shared with batch 1
    t = loaded(catalog_uri)
    assert [(f.name, str(f.transform)) for f in t.spec().fields] == [("timestamp_day", "day")]
    files = t.inspect.files().to_pylist()

    def days(batch_id: int) -> set[str]:
        held = [f for f in files if f"/kbp_batch_id={batch_id}/" in f["file_path"]]
        return {f["partition"]["timestamp_day"].isoformat() for f in held}

    assert days(1) == {"2025-11-24", "2025-11-25", "2025-11-26"}  # three partitions
    assert days(2) == {"2025-11-25", "2025-11-26", "2025-11-27"}
    before = {r["id"]: r for r in t.scan().to_arrow().to_pylist()}

    commit(1, 2, 0)  # the replay: batch 1's rows replaced in its three partitions, batch 2's untouched
    after = {r["id"]: r for r in loaded(catalog_uri).scan().to_arrow().to_pylist()}
    assert sorted(after) == sorted(before)
    assert {i: r["written_by"] for i, r in after.items() if i >= 2000} == {i: 1 for i in range(2000, 2009)}
    assert {r["written_by"] for i, r in after.items() if i < 2000} == {2}
    # a reader's filter on the partition prunes the other days' files
    one_day = loaded(catalog_uri).scan(row_filter=EqualTo("timestamp", "2025-11-24T01:00:00+00:00"))
    assert {t.file.partition[0] for t in one_day.plan_files()} == {20416}  # days since 1970-01-01

    with pytest.raises(
        SinkFormatError, match=r"partitioned by day\(timestamp\) but .*partition_by is hour\(timestamp\)"
    ):
        sink.write_batch(
            spark, days_rows(spark, 3, 3, 1), table, pipeline=PIPELINE, batch_id=3, attempt=1,
            ranges=ranges(3, 3), expected_records=3, partition_by=PartitionBy("hour", "timestamp"),
        )  # fmt: skip
    with pytest.raises(
        SinkFormatError,
        match=r"needs a timestamp column.*'created'.*Timestamp and date columns there: timestamp",
    ):
        IcebergSink(catalog_uri).write_batch(
            spark, days_rows(spark, 4, 3, 1), str(tmp_path / "u"), pipeline=PIPELINE, batch_id=4, attempt=1,
            ranges=ranges(4, 3), expected_records=3, partition_by=PartitionBy("day", "created"),
        )  # fmt: skip


def test_a_downstream_task_reads_the_snapshot_a_batch_committed_without_the_catalog(
    spark, tmp_path, catalog_uri
):
    """The commit's ``read_at`` (its snapshot and a metadata file holding it: what the batch's Asset
    event carries) reads exactly the rows that commit left, with no catalog, even after a newer
    attempt replaced them; without it, the current snapshot through the catalog, or a message."""
    table = str(tmp_path / "t")
    first = write(spark, catalog_uri, table, 1, attempt=1, n=10)
    write(spark, catalog_uri, table, 2, attempt=1, n=5)
    second = write(spark, catalog_uri, table, 1, attempt=2, n=8, planned=ranges(1, 10))
    assert first.read_at["snapshot_id"] == first.version and first.read_at["metadata"].endswith(
        ".metadata.json"
    )

    def read(read_at, fmt=IcebergSink()) -> Counter:
        rows = fmt.batch_dataset(table, pipeline=PIPELINE, batch_id=1, read_at=read_at).to_table()
        assert set(rows.column(BATCH_COLUMN).to_pylist()) <= {1}
        return Counter(rows.column("written_by").to_pylist())

    assert read(first.read_at) == {1: 10}  # attempt 1's snapshot, though attempt 2 replaced it since
    # the whole table at that snapshot: batch 1 alone then (batch 2 came after)
    assert IcebergSink().table_dataset(table, read_at=first.read_at, columns=["offset"]).count_rows() == 10
    assert read(second.read_at) == {2: 8}
    assert read(None, IcebergSink(catalog_uri)) == {2: 8}  # the current snapshot, through the catalog
    with pytest.raises(SinkFormatError, match="names no snapshot .read_at. and no catalog"):
        read(None)


def test_the_sinks_transaction_sees_each_staged_update_and_commits_what_pyicebergs_own_would(tmp_path):
    """``iceberg_transaction.MemoTransaction`` (the sink's commit) against pyiceberg's own
    ``Transaction`` on twin tables of pyiceberg's SQL catalog (no Spark): its metadata view is the
    one pyiceberg builds from the same staged updates, after each of them, reused between them;
    and the two commits leave the same snapshots and rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table.update import update_table_metadata

    from airflow_kafka_backpressure.sinks.iceberg_transaction import MemoTransaction

    catalog = SqlCatalog("kbp", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("kbp")
    schema = pa.schema([("id", pa.int64())])
    tables = {}
    for name in ("own", "memo"):
        catalog.create_table(f"kbp.{name}", schema=schema, location=f"{tmp_path}/{name}")
        (tmp_path / name / "data").mkdir(parents=True)
        for i in range(3):  # a history of 3 snapshots
            path = f"{tmp_path}/{name}/data/{i}.parquet"
            pq.write_table(pa.table({"id": [i]}, schema=schema), path)
            catalog.load_table(f"kbp.{name}").add_files([path])
        tables[name] = catalog.load_table(f"kbp.{name}")

    def dump(metadata) -> dict:
        return metadata.model_dump(exclude={"last_updated_ms"})

    tx = MemoTransaction(tables["memo"])
    before = tx.table_metadata
    assert tx.table_metadata is before  # built once, until an update is staged
    assert dump(before) == dump(update_table_metadata(tables["memo"].metadata, ()))
    with tx:
        tx.set_properties(owner="kbp")
        staged = tx.table_metadata
        assert staged is not before and staged.properties["owner"] == "kbp"
        assert dump(staged) == dump(update_table_metadata(tables["memo"].metadata, tx._updates))
        path = f"{tmp_path}/memo/data/3.parquet"
        pq.write_table(pa.table({"id": [3]}, schema=schema), path)
        tx.add_files([path], snapshot_properties={BATCH_PROPERTY: "{}"}, check_duplicate_files=False)
        assert len(tx.table_metadata.snapshots) == 4
    with tables["own"].transaction() as own:
        own.set_properties(owner="kbp")
        path = f"{tmp_path}/own/data/3.parquet"
        pq.write_table(pa.table({"id": [3]}, schema=schema), path)
        own.add_files([path], snapshot_properties={BATCH_PROPERTY: "{}"}, check_duplicate_files=False)

    own_table, memo_table = catalog.load_table("kbp.own"), catalog.load_table("kbp.memo")
    assert [s.summary.operation for s in memo_table.snapshots()] == [
        s.summary.operation for s in own_table.snapshots()
    ]
    assert [s.parent_snapshot_id is None for s in memo_table.snapshots()] == [True, False, False, False]
    assert memo_table.current_snapshot().summary.additional_properties[BATCH_PROPERTY] == "{}"
    assert memo_table.properties["owner"] == own_table.properties["owner"] == "kbp"
    assert sorted(memo_table.scan().to_arrow().column("id").to_pylist()) == [0, 1, 2, 3]
    assert sorted(own_table.scan().to_arrow().column("id").to_pylist()) == [0, 1, 2, 3]
