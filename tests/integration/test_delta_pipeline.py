"""The shipped DAGs writing a Delta Lake table (``sink_format="delta"``) under real Airflow
(``dag.test()``), the real broker and real ``spark-submit`` with Delta's jars and SQL extension in
the pipeline's ``spark_conf``: ingest, a failed batch and its replay, a cleared run rewriting its
batch, each record once.

The table is read back without Spark and without the product's code: the Delta log's JSON commits
replayed (``add`` minus ``remove``) and the live Parquet files read with pyarrow.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from . import airflow_harness as af


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


def delta_conf() -> dict[str, str]:
    """Delta's SQL extension and jars for each batch, beside the Kafka connector the session's
    spark-defaults name (``spark.jars`` given to spark-submit replaces the defaults' value)."""
    from airflow_kafka_backpressure.local.jars import spark_delta_conf, spark_kafka_conf

    delta = spark_delta_conf()
    return {**delta, "spark.jars": f"{spark_kafka_conf()['spark.jars']},{delta['spark.jars']}"}


def delta_log(table: Path) -> list[dict]:
    """Every commit of the table's log, oldest first: its actions."""
    log = table / "_delta_log"
    assert not list(log.glob("*.checkpoint.parquet")), "the reader below replays JSON commits only"
    return [
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for path in sorted(log.glob("*.json"))
    ]


def table_rows(table: Path) -> list[dict]:
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
        rows += pq.read_table(table / path).to_pylist()
    return rows


def batch_commits(table: Path) -> list[dict]:
    """The product's metadata of every commit, oldest first."""
    out = []
    for commit in delta_log(table):
        for action in commit:
            meta = action.get("commitInfo", {}).get("userMetadata")
            if meta:
                out.append(json.loads(meta))
    return out


def test_a_delta_pipeline_ingests_fails_replays_and_rewrites_each_record_once(
    kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db
):
    flag = tmp_path / "fail-now"
    monkeypatch.setenv("KBP_TEST_FAIL_FLAG", str(flag))
    make = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path, engine="submit")
    p, ledger = make(
        sink=str(tmp_path / "table"),
        sink_format="delta",
        spark_conf=delta_conf(),
        transform="tests.integration.e2e_transforms:fail_while_flagged",
        replay_interval_s=20,
    )
    table = Path(p.sink)

    def nothing_committed(failed) -> None:
        assert not (table / "_delta_log").exists() or table_rows(table) == []

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
