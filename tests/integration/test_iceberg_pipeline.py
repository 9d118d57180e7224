"""The shipped DAGs writing an Iceberg table (``sink_format="iceberg"``) under real Airflow
(``dag.test()``), the real broker and both engines (spark-submit on ``local[2]``; the session's
Spark Connect server): a failed batch and its replay, the next batch, and a cleared run rewriting
its batch, each record once, with pyiceberg's SQL catalog on SQLite: spark-submit into a bucket of
the session's S3 server (``s3a://``), the connect engine into a local path. A batch committed by a
worker that died before the ledger's mark, adopted by the replay DAG; a zombie attempt whose job
commits after the replay DAG committed the batch, refused.

The table is read back with pyiceberg only (the catalog's current snapshot and its data files),
never with Spark or the sink's own read-back.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from airflow_kafka_backpressure.sinks.iceberg import BATCH_PROPERTY

from . import airflow_harness as af


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


def table(uri: str, name: str):
    """The table as pyiceberg's catalog has it (S3 settings from the AWS_* environment)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from airflow_kafka_backpressure.sinks.iceberg import s3_properties

    return SqlCatalog("kbp", uri=uri, **s3_properties()).load_table(name)


def batch_commits(uri: str) -> list[tuple[int, int]]:
    """(batch id, attempt) of each of the table's snapshots that a batch's commit made, oldest first."""
    return [
        (d["batch_id"], d["attempt"])
        for s in table(uri, "kbp.events").snapshots()
        if s.summary and BATCH_PROPERTY in s.summary.additional_properties
        for d in [json.loads(s.summary.additional_properties[BATCH_PROPERTY])]
    ]


def where(request, store: str, tmp_path, monkeypatch) -> tuple[str, dict[str, str]]:
    """The table's location and the pipeline's Spark settings: a local path, or a bucket of the
    session's S3 server through ``s3a://`` (hadoop-aws on the JVMs' class path; pyiceberg in the
    job's driver reads the same server through the AWS_* environment, as a worker's would be set)."""
    if store == "local":
        return str(tmp_path / "events"), {}
    from kbp_local.jars import spark_s3a_conf

    server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
    for key, value in server.aws_environment().items():
        monkeypatch.setenv(key, value)
    return f"s3a://{bucket}/events", spark_s3a_conf(server, jars="extraClassPath")


@pytest.mark.parametrize("engine, store", [("submit", "s3"), ("connect", "local")])
def test_an_iceberg_pipeline_ingests_fails_replays_and_rewrites_each_record_once(
    request, engine, store, kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db
):
    flag = tmp_path / "fail-now"
    monkeypatch.setenv("KBP_TEST_FAIL_FLAG", str(flag))
    uri = f"sqlite:///{tmp_path}/catalog.db"
    sink, spark_conf = where(request, store, tmp_path, monkeypatch)
    make = af.engine_pipeline_maker(
        request, engine, monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path
    )
    p, ledger = make(
        sink=sink,
        sink_format="iceberg",
        # the local table partitioned by the UTC day of Kafka's timestamp (sink_options to the job)
        sink_options={
            "iceberg_catalog_uri": uri,
            **({"partition_by": "day(timestamp)"} if store == "local" else {}),
        },
        spark_conf=spark_conf,
        transform="tests.integration.e2e_transforms:fail_while_flagged",
        replay_interval_s=20,
    )

    def nothing_committed(failed) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        assert not SqlCatalog("kbp", uri=uri).table_exists("kbp.events")  # the first batch failed

    _, _, ok = af.fail_replay_then_ingest(p, kafka_broker.bootstrap, flag, after_failure=nothing_committed)
    assert ok.xcoms["ingest"]["records"] == 20

    def rows() -> list[dict]:
        return table(uri, "kbp.events").scan().to_arrow().to_pylist()

    def ids() -> Counter:
        return Counter(json.loads(r["value"])["id"] for r in rows())

    assert ids() == Counter(range(60))
    assert {r["kbp_pipeline"] for r in rows()} == {p.name}
    spec = [(f.name, str(f.transform)) for f in table(uri, "kbp.events").spec().fields]
    assert spec == ([("timestamp_day", "day")] if store == "local" else [])
    assert Counter(r["kbp_batch_id"] for r in rows()) == {1: 40, 2: 20}

    # clearing the finished run: a newer attempt of batch 2 replaces its rows in one commit
    again = af.run_dag(p.ingest_dag_id, 1)
    assert again.state == "success", again.task_states
    assert ledger.batch(2).attempts == 2
    assert ids() == Counter(range(60))
    commits = [
        json.loads(s.summary.additional_properties[BATCH_PROPERTY])
        for s in table(uri, "kbp.events").snapshots()
        if s.summary and BATCH_PROPERTY in s.summary.additional_properties
    ]
    assert [(c["batch_id"], c["attempt"]) for c in commits] == [(1, 2), (2, 1), (2, 2)]
    assert sorted(json.dumps(r, sort_keys=True) for r in commits[-1]["ranges"]) == sorted(
        json.dumps(r.to_dict(), sort_keys=True) for r in ledger.batch(2).plan.ranges
    )
    assert sum(x["records"] for x in commits[-1]["details"]["partitions"]) == 20

    # a downstream task reads the snapshot the batch's commit created, without the catalog
    # (assets.batch_dataset with the read_at of the batch's metrics and Asset event)
    from airflow_kafka_backpressure.operators.assets import batch_dataset

    read_at = again.xcoms["ingest"]["read_at"]
    assert read_at["snapshot_id"] == table(uri, "kbp.events").current_snapshot().snapshot_id
    event = {"batch_id": 2, "output_path": sink, "sink_format": "iceberg", "read_at": read_at}
    values = batch_dataset(event, p.name).to_table(columns=["value"]).column("value").to_pylist()
    assert sorted(json.loads(v)["id"] for v in values) == list(range(40, 60))


def sink_event_batches(p) -> dict[str, dict]:
    """Every batch the pipeline's sink Asset events name (their extra's ``batches``), by batch id."""
    out: dict[str, dict] = {}
    for _, extra in af.sink_asset_events(p):
        out.update(extra.get("batches") or {})
    return out


def test_a_batch_after_a_maintenance_names_it_and_the_snapshot_it_created(
    request, kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db
):
    """The connect engine into a local, partitioned table with a maintenance DAG: a batch, the
    shipped ``kbp_maintain_<name>`` (compaction), the next batch. The second batch's sink Asset
    event names that maintenance (its run, the snapshot it left, what its compaction replaced)
    beside the snapshot the batch's own commit created, which a downstream task reads without the
    catalog; the first batch's names none. Read back with pyiceberg."""
    from airflow_kafka_backpressure.operators.assets import batch_dataset
    from kbp_local.producer import produce

    uri = f"sqlite:///{tmp_path}/catalog.db"
    sink = str(tmp_path / "events")
    make = af.engine_pipeline_maker(
        request, "connect", monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path
    )
    p, _ledger = make(
        sink=sink,
        sink_format="iceberg",
        sink_options={"iceberg_catalog_uri": uri, "partition_by": "day(timestamp)"},
        maintenance={"schedule": "@daily", "retention_hours": 24},
    )
    produce(kafka_broker.bootstrap, p.topics[0], count=40, partitions=4)
    first = af.run_dag(p.ingest_dag_id, 0)
    assert first.state == "success", first.task_states
    maintained = af.run_dag(p.maintain_dag_id, 0)
    assert maintained.state == "success", maintained.task_states
    (report,) = maintained.xcoms["maintain"]
    assert report["files_removed"] > report["files_added"] == 1  # the first batch's 4 files, merged
    produce(kafka_broker.bootstrap, p.topics[0], count=20, partitions=4, start_id=40)
    second = af.run_dag(p.ingest_dag_id, 1)
    assert second.state == "success", second.task_states

    events = sink_event_batches(p)
    assert events["1"]["last_maintenance"] is None
    named = events["2"]["last_maintenance"]
    assert named == {
        "run_id": maintained.run_id,
        "at": af.variable(p.maintenance_variable)["at"],
        "version": report["version"],
        "files_removed": report["files_removed"],
        "files_added": 1,
    }
    snapshots = [s.snapshot_id for s in table(uri, "kbp.events").snapshots()]
    # the maintenance's snapshot comes between the two batches' commits
    assert str(snapshots[-2]) == str(report["version"])
    assert events["2"]["read_at"]["snapshot_id"] == snapshots[-1]
    values = batch_dataset(events["2"], p.name).to_table(columns=["value"]).column("value").to_pylist()
    assert sorted(json.loads(v)["id"] for v in values) == list(range(40, 60))


def test_an_iceberg_batch_written_but_not_marked_is_adopted_without_writing_again(
    request, kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db
):
    """The connect engine into a local table: an attempt's job committed the batch's snapshot and
    its worker died before the ledger's mark (its lease then ran out). The shipped replay DAG finds
    the commit (its summary names the batch and the planned ranges) and adopts it: no second
    snapshot, no record read again, each record once, the group committed. Read back with pyiceberg."""
    from airflow_kafka_backpressure.batch.models import TopicPartition

    from .test_pipeline_e2e import committed
    from .test_replay_reliability import adopted_by_the_replay_dag, write_without_mark

    uri = f"sqlite:///{tmp_path}/catalog.db"
    make = af.engine_pipeline_maker(
        request, "connect", monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path
    )
    p, ledger = make(
        sink=str(tmp_path / "events"),
        sink_format="iceberg",
        sink_options={"iceberg_catalog_uri": uri},
        replay_interval_s=20,
    )
    dead = "deadbeef" * 4
    plan, metrics = write_without_mark(p, ledger, kafka_broker.bootstrap, dead)
    assert (metrics.records, metrics.adopted) == (40, False)

    assert batch_commits(uri) == [(plan.batch_id, 1)]

    adopted_by_the_replay_dag(p, ledger, plan, dead)  # ... and the worker died: its lease runs out
    assert batch_commits(uri) == [(plan.batch_id, 1)]  # the dead attempt's snapshot, and no other
    rows = table(uri, "kbp.events").scan().to_arrow().to_pylist()
    assert Counter(json.loads(r["value"])["id"] for r in rows) == Counter(range(40))
    assert committed(kafka_broker.bootstrap, p) == {TopicPartition(topic_name, q): 10 for q in range(4)}
    assert ledger.losses(p.name) == []


def test_a_zombie_attempt_of_an_iceberg_batch_is_refused_after_the_replay_committed_it(
    kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db
):
    """Attempt fencing through the DAGs, as for Delta (test_replay_reliability's
    zombie_refused_after_the_replay): attempt 1 of batch 2, its lease run out, commits after the
    replay DAG committed the batch as attempt 2; the table names attempt 2 for the batch, so the
    sink refuses attempt 1 and commits nothing. The table keeps batch 1's and attempt 2's snapshots
    only, each record once (read with pyiceberg). spark-submit (each attempt its own driver) into a
    local table."""
    from .test_replay_reliability import zombie_refused_after_the_replay

    uri = f"sqlite:///{tmp_path}/catalog.db"
    flag = tmp_path / "hold"
    monkeypatch.setenv("KBP_TEST_HOLD_FLAG", str(flag))
    make = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path, engine="submit")
    fields = dict(
        sink=str(tmp_path / "events"),
        sink_format="iceberg",
        sink_options={"iceberg_catalog_uri": uri},
        replay_interval_s=20,
    )
    zombie_refused_after_the_replay(make, fields, flag, kafka_broker.bootstrap, lambda: batch_commits(uri))
    rows = table(uri, "kbp.events").scan().to_arrow().to_pylist()
    assert Counter(json.loads(r["value"])["id"] for r in rows) == Counter(range(80))
