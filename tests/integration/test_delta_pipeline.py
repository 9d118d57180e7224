"""The shipped DAGs writing a Delta Lake table (``sink_format="delta"``) under real Airflow
(``dag.test()``), the real broker and real ``spark-submit`` with Delta's jars and SQL extension in
the pipeline's ``spark_conf``: ingest, a failed batch and its replay, a cleared run rewriting its
batch, each record once; a batch committed by a worker that died before the ledger's mark,
adopted; on a local path and on the real S3 server (``s3a://``, hadoop-aws).

Which table each test runs on: the whole life of a pipeline on both (S3 through spark-submit, a
local path through the connect engine); the adoption, the kill and the zombie attempt on S3, the
store whose commits are the hardest (no rename, the ledger's lock per table); the timeout on a local
path (its stop is the kill's path). Each of these took 1-3 minutes per table under load, and their
local-path copies repeated what the S3 ones show (2026-11-29: seven minutes of the suite's
foreground).

The table is read back without Spark and without the product's code: the Delta log's JSON commits
replayed (``add`` minus ``remove``) and the live Parquet files read with pyarrow.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.operators.assets import batch_dataset
from kbp_local.producer import produce

from . import airflow_harness as af
from .test_pipeline_e2e import committed


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


def delta_conf() -> dict[str, str]:
    """Delta's SQL extension and jars for each batch, beside the Kafka connector the session's
    spark-defaults name (``spark.jars`` given to spark-submit replaces the defaults' value)."""
    from kbp_local.jars import combined_spark_conf, spark_delta_conf, spark_kafka_conf

    return combined_spark_conf(spark_kafka_conf(), spark_delta_conf())


def delta_s3a_conf(server: Any) -> dict[str, str]:
    """Delta and Hadoop's S3A for each batch, both on the JVMs' class path (``extraClassPath``:
    the ~650 MB AWS SDK bundle is not copied into every application's scratch folder), as a
    cluster's image would carry them; the Kafka connector stays in the session's spark-defaults."""
    from kbp_local.jars import combined_spark_conf, spark_delta_conf, spark_s3a_conf

    return combined_spark_conf(
        spark_delta_conf(jars="extraClassPath"), spark_s3a_conf(server, jars="extraClassPath")
    )


@dataclass(frozen=True)
class Table:
    """Where the test's table is: the pipeline's ``sink``, and the same place for pyarrow."""

    sink: str
    fs: pafs.FileSystem
    root: str
    spark_conf: dict[str, str]

    def exists(self, relative: str) -> bool:
        return self.fs.get_file_info(f"{self.root}/{relative}").type != pafs.FileType.NotFound


@pytest.fixture(params=["local", "s3"])
def table(request, tmp_path, monkeypatch) -> Table:
    if request.param == "local":
        root = str(tmp_path / "table")
        return Table(root, pafs.LocalFileSystem(), root, delta_conf())
    server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
    # the task's own side of the sink (the hand-off of each batch's spec) goes through pyarrow,
    # configured as a user's environment would (the AWS_* variables); Spark through s3a's settings
    for key, value in server.aws_environment().items():
        monkeypatch.setenv(key, value)
    return Table(f"s3a://{bucket}/table", server.filesystem(), f"{bucket}/table", delta_s3a_conf(server))


def delta_log(table: Table) -> list[list[dict]]:
    """Every commit of the table's log, oldest first: its actions (none while no commit created the
    table: a batch stopped before its write leaves no log)."""
    if not table.exists("_delta_log"):
        return []
    entries = table.fs.get_file_info(pafs.FileSelector(f"{table.root}/_delta_log"))
    names = sorted(e.path for e in entries if e.type == pafs.FileType.File)
    assert not [n for n in names if n.endswith(".checkpoint.parquet")], (
        "the reader below replays JSON commits only"
    )
    commits = []
    for path in (n for n in names if n.endswith(".json")):
        with table.fs.open_input_stream(path) as f:
            text = f.read().decode()
        commits.append([json.loads(line) for line in text.splitlines() if line.strip()])
    return commits


def table_rows(table: Table) -> list[dict]:
    """The table's rows as a Delta reader sees them: the files added and not removed since."""
    live: set[str] = set()
    for commit in delta_log(table):
        for action in commit:
            if "add" in action:
                live.add(action["add"]["path"])
            elif "remove" in action:
                live.discard(action["remove"]["path"])
    rows = []
    for path in sorted(live):
        rows += pq.read_table(f"{table.root}/{path}", filesystem=table.fs).to_pylist()
    return rows


def batch_commits(table: Table) -> list[dict]:
    """The product's metadata of every commit, oldest first."""
    out = []
    for commit in delta_log(table):
        for action in commit:
            meta = action.get("commitInfo", {}).get("userMetadata")
            if meta:
                out.append(json.loads(meta))
    return out


@pytest.mark.parametrize("engine, table", [("submit", "s3"), ("connect", "local")], indirect=["table"])
def test_a_delta_pipeline_ingests_fails_replays_and_rewrites_each_record_once(
    request, engine, kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db, table
):
    """A failed batch, its replay, the next batch and a cleared run's rewrite, each record once in the
    table; the commits' metadata; a downstream read of each batch. On the connect engine the Spark
    Connect server carries Delta's jars and SQL extension (``local spark-connect --delta``), so the
    pipeline sets no Spark settings of its own."""
    flag = tmp_path / "fail-now"
    monkeypatch.setenv("KBP_TEST_FAIL_FLAG", str(flag))
    make = af.engine_pipeline_maker(
        request, engine, monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path
    )
    p, ledger = make(
        sink=table.sink,
        sink_format="delta",
        spark_conf=table.spark_conf if engine == "submit" else {},
        transform="tests.integration.e2e_transforms:fail_while_flagged",
        replay_interval_s=20,
    )

    def nothing_committed(failed) -> None:
        assert not table.exists("_delta_log") or table_rows(table) == []

    _, _, ok = af.fail_replay_then_ingest(p, kafka_broker.bootstrap, flag, after_failure=nothing_committed)
    assert ok.xcoms["ingest"]["records"] == 20

    def ids() -> Counter:
        return Counter(json.loads(r["value"])["id"] for r in table_rows(table))

    assert ids() == Counter(range(60))
    assert {r["kbp_pipeline"] for r in table_rows(table)} == {p.name}
    assert Counter(r["kbp_batch_id"] for r in table_rows(table)) == {1: 40, 2: 20}

    # clearing the finished run: a newer attempt of batch 2 replaces its rows in one transaction
    again = af.run_dag(p.ingest_dag_id, 1)
    assert again.state == "success", again.task_states
    assert ledger.batch(2).attempts == 2
    assert ids() == Counter(range(60))
    commits = batch_commits(table)
    assert [(c["batch_id"], c["attempt"]) for c in commits] == [(1, 2), (2, 1), (2, 2)]
    # each commit names the batch's ranges and per-partition counts, as the ledger has them
    assert [tuple(sorted(json.dumps(r, sort_keys=True) for r in c["ranges"])) for c in commits][-1] == tuple(
        sorted(json.dumps(r.to_dict(), sort_keys=True) for r in ledger.batch(2).plan.ranges)
    )
    assert sum(x["records"] for x in commits[-1]["details"]["partitions"]) == 20

    # a downstream task reads a batch's rows without Spark (assets.batch_dataset: deltalake), as the
    # example DAG does with the batch its sink Asset event names
    for batch_id, ids in ((1, range(40)), (2, range(40, 60))):
        event = {"batch_id": batch_id, "output_path": table.sink, "sink_format": "delta"}
        rows = batch_dataset(event, p.name).to_table(columns=["value"]).column("value").to_pylist()
        assert sorted(json.loads(v)["id"] for v in rows) == list(ids)


@pytest.mark.parametrize("table", ["s3"], indirect=True)
def test_a_delta_batch_written_but_not_marked_is_adopted_without_writing_again(
    kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db, table
):
    """The worker's Spark job committed the batch's Delta transaction and the worker died before the
    ledger's mark: the replay finds the commit (its metadata names the batch and the planned ranges)
    and adopts it. No second transaction, no record read again."""
    from .test_replay_reliability import adopted_by_the_replay_dag, write_without_mark

    make = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path, engine="submit")
    p, ledger = make(sink=table.sink, sink_format="delta", spark_conf=table.spark_conf, replay_interval_s=20)
    dead = "deadbeef" * 4
    plan, metrics = write_without_mark(p, ledger, kafka_broker.bootstrap, dead)
    assert metrics.records == 40
    written = batch_commits(table)
    assert [(c["batch_id"], c["attempt"]) for c in written] == [(plan.batch_id, 1)]

    adopted_by_the_replay_dag(p, ledger, plan, dead)  # ... and the worker died: its lease runs out
    assert batch_commits(table) == written  # the dead attempt's transaction, and no other
    assert Counter(json.loads(r["value"])["id"] for r in table_rows(table)) == Counter(range(40))
    assert committed(kafka_broker.bootstrap, p) == {TopicPartition(topic_name, q): 10 for q in range(4)}
    assert ledger.losses(p.name) == []


@pytest.mark.parametrize("table", ["s3"], indirect=True)
def test_killing_a_delta_batchs_task_commits_nothing_and_the_replay_lands_it_once(
    kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db, table
):
    """The ingest task killed (SIGTERM: the operator's on_kill) while its Spark job holds the batch
    in a UDF: the job is stopped, no transaction reaches the table, the batch is failed; the replay
    DAG lands it in one transaction, each record once."""
    from .test_batch_stop import HOLD, ProcessWatch, check_stopped, held_pids, kill_task_when_held

    make, fields, flag = held_delta_pipeline(kafka_broker, topic_name, tmp_path, monkeypatch, table)
    p, ledger = make(transform=HOLD, **fields)
    produce(kafka_broker.bootstrap, topic_name, count=120, partitions=4)
    flag.touch()

    result: dict = {}
    with ProcessWatch() as watch:
        killer = kill_task_when_held(flag, result)
        run = af.run_dag(p.ingest_dag_id, 0)
        killer.join(5)
    assert result.get("killed_at"), "the batch's UDF never started: nothing was killed"
    assert run.task_states["ingest"] == "failed", run.task_states
    check_stopped("submit", None, watch, held_pids(flag))
    replayed_once_after_the_stop(make, fields, flag, kafka_broker, table, "killed")


@pytest.mark.parametrize("table", ["local"], indirect=True)
def test_a_delta_batch_over_its_timeout_commits_nothing_and_the_replay_lands_it_once(
    kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db, table
):
    """The batch's Spark job held in a UDF past the pipeline's ``batch_timeout_s``: the job is
    stopped, no transaction reaches the table, the batch is failed as timed out; the replay lands it
    once. (On the local table only: the stop is the kill's path, tested on both above.)"""
    from .test_batch_stop import HOLD, ProcessWatch, check_stopped, held_pids

    make, fields, flag = held_delta_pipeline(kafka_broker, topic_name, tmp_path, monkeypatch, table)
    p, ledger = make(transform=HOLD, batch_timeout_s=45, **fields)
    produce(kafka_broker.bootstrap, topic_name, count=120, partitions=4)
    flag.touch()

    with ProcessWatch() as watch:
        run = af.run_dag(p.ingest_dag_id, 0)
    assert run.task_states["ingest"] == "failed", run.task_states
    # the timeout may come before the job reaches the UDF on a loaded machine: the stop is checked either way
    check_stopped("submit", None, watch, held_pids(flag), require_held=False)
    replayed_once_after_the_stop(make, fields, flag, kafka_broker, table, "timed out after 45 s")


def held_delta_pipeline(kafka_broker, topic_name, tmp_path, monkeypatch, table: Table):
    """For the tests that hold a batch's job in a UDF (``test_batch_stop.HOLD``) while the file
    ``flag`` exists: the pipeline maker (submit engine), the Delta pipeline's fields and ``flag``."""
    flag = tmp_path / "hold"
    monkeypatch.setenv("KBP_TEST_HOLD_FLAG", str(flag))
    make = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path, engine="submit")
    fields = dict(sink=table.sink, sink_format="delta", spark_conf=table.spark_conf, replay_interval_s=20)
    return make, fields, flag


def replayed_once_after_the_stop(make, fields: dict, flag, kafka_broker, table: Table, reason: str) -> None:
    """Batch 1, stopped (``reason`` in its error), committed nothing; once ``flag`` is gone the replay
    DAG (default timeout) lands it in one transaction, each of the 120 records once."""
    from .test_batch_stop import HOLD

    p, ledger = make(transform=HOLD, **fields)
    batch = ledger.batch(1)
    assert batch.status == "failed" and reason in batch.error, (batch.status, batch.error)
    assert batch_commits(table) == []  # no transaction of the stopped attempt

    flag.unlink()
    replay = af.run_dag(p.replay_dag_id, 0)
    assert replay.state == "success", replay.task_states
    assert ledger.batch(1).status == "replayed"
    assert [(c["batch_id"], c["attempt"]) for c in batch_commits(table)] == [(1, 2)]
    assert Counter(json.loads(r["value"])["id"] for r in table_rows(table)) == Counter(range(120))
    assert sum(committed(kafka_broker.bootstrap, p).values()) == 120


@pytest.mark.parametrize("table", ["s3"], indirect=True)
def test_a_zombie_attempt_of_a_delta_batch_is_refused_after_the_replay_committed_it(
    kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db, table
):
    """Attempt fencing through the DAGs: attempt 1 of a batch (a worker that stopped heartbeating, so
    its lease ran out) still runs its Spark job, held in a UDF, when the replay DAG takes the batch
    over and commits it as attempt 2. Attempt 1's job then goes on to its commit: Delta's conflict
    check refuses it (the winner set the batch's app id, whose version attempt 1 read, to 2; attempt
    1 appends) and the sink reports it as fenced. The table keeps batch 1's and attempt
    2's transactions only, each record once; the ledger keeps the replay's mark; the group is
    committed. (It also passed with the zombie's batch as the table's first commit, where Delta's
    refusal is the table created meanwhile.)"""
    from .test_replay_reliability import zombie_refused_after_the_replay

    make, fields, flag = held_delta_pipeline(kafka_broker, topic_name, tmp_path, monkeypatch, table)
    zombie_refused_after_the_replay(
        make,
        fields,
        flag,
        kafka_broker.bootstrap,
        lambda: [(c["batch_id"], c["attempt"]) for c in batch_commits(table)],
    )
    assert Counter(json.loads(r["value"])["id"] for r in table_rows(table)) == Counter(range(80))
