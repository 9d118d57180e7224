"""End to end: the shipped DAGs under real Airflow (dag.test), the real broker, real Spark and a
SQLite ledger, with both batch engines: ``submit`` (spark-submit, local[2]) and ``connect`` (a local
Spark Connect server). The sink is read back independently of the job."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.control.allocation import RateLimits, max_messages_per_partition
from airflow_kafka_backpressure.control.pid import PIDRateEstimator
from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from airflow_kafka_backpressure.ledger import Ledger
from kbp_local.producer import produce

from . import airflow_harness as af
from .kafka_samples import consumer_group_offsets

REPO = Path(__file__).resolve().parents[2]


def sink_ids(sink: str | Path) -> Counter:
    """Every record id in the sink, read with pyarrow (not Spark, not the job's code)."""
    import pyarrow.dataset as ds

    if not Path(sink).exists():
        return Counter()
    table = ds.dataset(str(sink), format="parquet", partitioning="hive").to_table(columns=["value"])
    return Counter(json.loads(v.as_py())["id"] for v in table.column("value"))


def expected_controller(ledger: Ledger, pipeline: PipelineConfig, gains_per_batch: list[tuple[float, ...]]):
    """What Spark's estimator gives for the metrics recorded in the ledger, batch by batch."""
    batches = sorted(ledger.recent_batches(pipeline.name, 1000, ["succeeded"]), key=lambda b: b.batch_id)
    rate_limit = -1
    state = None
    for batch, gains in zip(batches, gains_per_batch):
        est = PIDRateEstimator(pipeline.batch_interval_ms, *gains)
        if state is not None:
            est.load_state(state)
        new = est.compute(batch.ended_at_ms, batch.records, batch.processing_ms, batch.scheduling_delay_ms)
        if new is not None:
            rate_limit = int(new)
        state = est.state()
    return state, rate_limit


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


#: Tests of what is engine-agnostic above the hook (Variables, the ledger, the replay DAG) run on the
#: connect engine only, whose batches cost a fraction of spark-submit's; the submit engine keeps the
#: three-runs and partition tests here, and the batch stop and fault suites (the arrow writer under
#: spark-submit, through the DAG: tests/integration/test_arrow_batch_stop.py's ingest, kill and replay).
CONNECT_ONLY = pytest.mark.parametrize("make_pipeline", ["connect"], indirect=True)


@pytest.fixture(params=["submit", "connect"])
def make_pipeline(request, kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db):
    return af.engine_pipeline_maker(
        request, request.param, monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path
    )


def committed(bootstrap: str, p: PipelineConfig) -> dict[TopicPartition, int]:
    with KafkaOffsets({"bootstrap.servers": bootstrap}) as k:
        return k.committed_offsets(p.group, k.partitions(p.topics))


def test_three_runs_ingest_everything_exactly_once_and_the_controller_follows_spark(
    make_pipeline, kafka_broker
):
    p, ledger = make_pipeline()
    topic = p.topics[0]
    produced = 0
    gains = (1.0, 0.2, 0.0, 100.0)  # Spark's defaults: the settings Variable starts with them
    for n, count in enumerate([240, 160, 200]):
        produce(kafka_broker.bootstrap, topic, count=count, partitions=4, start_id=produced)
        produced += count
        r = af.run_dag(p.ingest_dag_id, n)
        assert r.state == "success", r.task_states
        # each run's plan, metrics and rate are visible as XCom
        assert r.xcoms["plan"]["batch_id"] == n + 1
        assert (
            r.xcoms["ingest"]["records"]
            == count
            == sum(x["until_offset"] - x["from_offset"] for x in r.xcoms["plan"]["ranges"])
        )
        assert sink_ids(p.sink) == Counter(range(produced))  # every record exactly once so far
        manifest = json.loads((Path(p.sink) / f"batch_id={n + 1}" / "_manifest.json").read_text())
        assert (
            manifest["reader"] == "native" and manifest["unread"] == []
        )  # Spark's reader, counted as it wrote
        state, rate_limit = expected_controller(ledger, p, [gains] * (n + 1))
        stored = af.variable(p.controller_variable)["spark"]  # the spark mode's part of the state
        assert stored["estimator"]["state"] == state
        assert stored["rate_limit"] == rate_limit == r.xcoms["record"]["rate_limit"]
    assert af.variable(p.controller_variable)["spark"]["rate_limit"] > 0  # the third batch got an estimate
    # the group is committed to the end of everything ingested, as Kafka's own tool sees it too
    assert sum(committed(kafka_broker.bootstrap, p).values()) == produced
    described = consumer_group_offsets(kafka_broker.bootstrap, p.group)
    assert sorted(described) == [(topic, q) for q in range(4)]
    assert all(current == end for current, end in described.values()), described
    assert sum(current for current, _ in described.values()) == produced
    assert af.variable(p.executors_variable)["executors"] >= 1

    # clearing a finished run (same run id) reuses its range: same batch, same sink path, no duplicates
    before = ledger.batch(2).plan
    again = af.run_dag(p.ingest_dag_id, 1)
    assert again.state == "success"
    second = ledger.batch(2)
    assert again.xcoms["plan"] == second.plan.to_dict()
    assert second.attempts == 2
    assert sink_ids(p.sink) == Counter(range(produced))
    assert second.plan == before
    assert sum(committed(kafka_broker.bootstrap, p).values()) == produced  # never moved back

    # an idle topic: the batch is empty and no Spark application is launched for it
    idle = af.run_dag(p.ingest_dag_id, 3)
    assert idle.state == "success"
    assert idle.xcoms["ingest"]["records"] == 0 and idle.xcoms["ingest"]["executors"] == 0
    assert ledger.batch(4).status == "succeeded" and not (Path(p.sink) / "batch_id=4").exists()


@CONNECT_ONLY
def test_settings_variable_tunes_the_next_plan_and_an_invalid_edit_changes_nothing(
    make_pipeline, kafka_broker
):
    p, ledger = make_pipeline(batch_interval_s=5)
    topic = p.topics[0]
    # two batches of very different sizes: their processing rates differ, so the gains matter
    produce(kafka_broker.bootstrap, topic, count=40, partitions=4)
    assert af.run_dag(p.ingest_dag_id, 0, 5).state == "success"  # seeds the estimator
    produce(kafka_broker.bootstrap, topic, count=400, partitions=4, start_id=40)
    # Spark's mode (the default is the cost mode); min_rate 1 so the estimate is the measured
    # processing rate, not Spark's 100 records/s floor
    af.set_variable(p.settings_variable, json.dumps({"mode": "spark", "min_rate": 1}))
    assert af.run_dag(p.ingest_dag_id, 1, 5).state == "success"  # first estimate
    rate_limit = af.variable(p.controller_variable)["spark"]["rate_limit"]
    # the next backlog is far more than a batch at the estimated rate can take (a batch of 400
    # records runs at a few hundred records/s here, start-up included; faster with connect)
    backlog = 40_000
    assert 0 < rate_limit * 5 < backlog / 4

    produce(kafka_broker.bootstrap, topic, count=backlog, partitions=4, start_id=440)
    # an invalid edit fails the plan task with the key and range, and changes no state
    state_before = af.variable(p.controller_variable)
    af.set_variable(p.settings_variable, json.dumps({"mode": "spark", "min_rate": 1, "integral": -0.5}))
    bad = af.run_dag(p.ingest_dag_id, 2, 5)
    assert bad.task_states["plan"] == "failed" and bad.state == "failed"
    assert ledger.get_plan(p.name, bad.run_id) is None
    assert len(ledger.recent_batches(p.name)) == 2
    assert af.variable(p.controller_variable) == state_before

    # edited gains take effect on the very next plan: the last batch is re-applied under them
    af.set_variable(p.settings_variable, json.dumps({"mode": "spark", "min_rate": 1, "proportional": 0.5}))
    with KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap}) as k:
        tps = k.partitions([topic])
        latest = k.latest_offsets(tps)
    heads = ledger.heads(p.name)
    r = af.run_dag(p.ingest_dag_id, 3, 5)
    assert r.state == "success"
    _, expected_rate = expected_controller(ledger, p, [(1.0, 0.2, 0.0, 100.0), (0.5, 0.2, 0.0, 1.0)])
    assert r.xcoms["plan"]["rate"] == expected_rate != rate_limit
    spark_mmp = max_messages_per_partition(heads, latest, 5000, RateLimits(), expected_rate)
    planned = {
        TopicPartition(x["topic"], x["partition"]): x["until_offset"] - x["from_offset"]
        for x in r.xcoms["plan"]["ranges"]
    }
    assert planned == {tp: min(spark_mmp[tp], latest[tp] - heads[tp]) for tp in tps}
    assert sum(planned.values()) < backlog  # backpressure held the batch below the backlog

    # backpressure off: the next plan reads everything that is left
    af.set_variable(p.settings_variable, json.dumps({"backpressure_enabled": False}))
    assert af.run_dag(p.ingest_dag_id, 4, 5).state == "success"
    assert sink_ids(p.sink) == Counter(range(440 + backlog))


@CONNECT_ONLY
def test_a_failed_batch_is_replayed_by_the_replay_dag_and_commits_wait_for_it(
    make_pipeline, kafka_broker, tmp_path, monkeypatch
):
    flag = tmp_path / "fail-now"
    monkeypatch.setenv("KBP_TEST_FAIL_FLAG", str(flag))
    p, ledger = make_pipeline(
        transform="tests.integration.e2e_transforms:fail_while_flagged", replay_interval_s=20
    )
    topic = p.topics[0]

    produce(kafka_broker.bootstrap, topic, count=120, partitions=4)
    assert af.run_dag(p.ingest_dag_id, 0).state == "success"
    produce(kafka_broker.bootstrap, topic, count=80, partitions=4, start_id=120)
    flag.touch()
    failed = af.run_dag(p.ingest_dag_id, 1)
    assert failed.task_states["ingest"] == "failed"
    batch = ledger.batch(2)
    assert batch.status == "failed" and "injected failure" in batch.error
    flag.unlink()

    # the main line is not blocked: the next run plans after the failed range
    produce(kafka_broker.bootstrap, topic, count=40, partitions=4, start_id=200)
    assert af.run_dag(p.ingest_dag_id, 2).state == "success"
    assert sink_ids(p.sink) == Counter(list(range(120)) + list(range(200, 240)))
    # ... but the consumer group never passes the failed range
    assert committed(kafka_broker.bootstrap, p) == {r.tp: r.from_offset for r in batch.ranges}

    replay = af.run_dag(p.replay_dag_id, 0)
    assert replay.state == "success", replay.task_states
    assert replay.xcoms["failed_ranges"] == [2]
    assert [x["batch_id"] for x in replay.xcoms["replay"]] == [2]
    assert ledger.batch(2).status == "replayed"
    assert sink_ids(p.sink) == Counter(range(240))
    assert sum(committed(kafka_broker.bootstrap, p).values()) == 240

    # nothing left: the sensor soft-fails (skipped), nothing is replayed twice
    quiet = af.run_dag(p.replay_dag_id, 1)
    assert quiet.task_states["failed_ranges"] == "skipped"


@CONNECT_ONLY
def test_a_broken_state_variable_fails_the_batch_and_the_replay_completes_it(make_pipeline, kafka_broker):
    p, ledger = make_pipeline(replay_interval_s=20)
    produce(kafka_broker.bootstrap, p.topics[0], count=60, partitions=4)
    af.set_variable(p.executors_variable, "{not json")
    r = af.run_dag(p.ingest_dag_id, 0)
    assert r.task_states["plan"] == "success" and r.task_states["ingest"] == "failed"
    batch = ledger.batch(1)
    assert batch.status == "failed"  # replayable now, not stranded as 'planned'
    assert p.executors_variable in batch.error and "not valid JSON" in batch.error

    af.set_variable(p.executors_variable, json.dumps({"executors": 1}))
    replay = af.run_dag(p.replay_dag_id, 0)
    assert replay.state == "success"
    assert ledger.batch(1).status == "replayed"
    assert sink_ids(p.sink) == Counter(range(60))
    assert sum(committed(kafka_broker.bootstrap, p).values()) == 60


@CONNECT_ONLY
def test_the_arrow_writer_ingests_exactly_once_and_a_rerun_rewrites_the_same_batch(
    make_pipeline, kafka_broker
):
    """``sink_options.writer = "arrow"`` (the reading tasks write the Parquet files): over Spark
    Connect the task function reaches the server's Python workers with the package. (Under
    spark-submit the same writer runs in test_arrow_batch_stop.py: 137 s of CI for a second copy.)"""
    p, ledger = make_pipeline(
        sink_options={"writer": "arrow"}, reader_options={"max_records_per_partition": 10}
    )
    topic = p.topics[0]
    produce(kafka_broker.bootstrap, topic, count=80, partitions=4)
    first = af.run_dag(p.ingest_dag_id, 0)
    assert first.state == "success", first.task_states
    produce(kafka_broker.bootstrap, topic, count=40, partitions=4, start_id=80)
    assert af.run_dag(p.ingest_dag_id, 1).state == "success"
    assert sink_ids(p.sink) == Counter(range(120))
    manifest = json.loads((Path(p.sink) / "batch_id=1" / "_manifest.json").read_text())
    assert (
        manifest["writer"] == "arrow" and len(manifest["files"]) == 8
    )  # 4 partitions x 20 offsets, pieces of 10
    again = af.run_dag(p.ingest_dag_id, 0)  # a cleared run: same range, rewritten once
    assert again.state == "success" and ledger.batch(1).attempts == 2
    assert sink_ids(p.sink) == Counter(range(120))
    assert sum(committed(kafka_broker.bootstrap, p).values()) == 120


@CONNECT_ONLY
def test_a_partition_added_later_is_read_from_its_first_record(make_pipeline, kafka_broker, topic_name):
    """``starting_offsets="latest"`` is for the topic's first plan: partitions added to it later
    (Kafka's CreatePartitions) are read from their earliest offset, as Spark does."""
    from kafka.admin import KafkaAdminClient, NewPartitions

    p, ledger = make_pipeline(starting_offsets="latest")
    produce(kafka_broker.bootstrap, topic_name, count=40, partitions=4)  # before the first plan: skipped
    assert af.run_dag(p.ingest_dag_id, 0).state == "success"
    produce(kafka_broker.bootstrap, topic_name, count=40, partitions=4, start_id=40)
    assert af.run_dag(p.ingest_dag_id, 1).state == "success"
    assert sink_ids(p.sink) == Counter(range(40, 80))

    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        admin.create_partitions({topic_name: NewPartitions(total_count=6)})
    finally:
        admin.close()
    produce(kafka_broker.bootstrap, topic_name, count=60, partitions=6, start_id=80)  # 10 to each of 6
    r = af.run_dag(p.ingest_dag_id, 2)
    assert r.state == "success", r.task_states
    new_ranges = {x["partition"]: x["from_offset"] for x in r.xcoms["plan"]["ranges"] if x["partition"] >= 4}
    assert new_ranges == {4: 0, 5: 0}
    assert sink_ids(p.sink) == Counter(range(40, 140))


@CONNECT_ONLY
def test_the_record_task_prunes_the_ledger_to_the_pipelines_retention(make_pipeline, kafka_broker):
    """``ledger_keep_batches`` is applied by the pipeline itself (it was a command run by hand):
    each record task prunes finished batches beyond the newest N, never a partition's head."""
    p, ledger = make_pipeline(ledger_keep_batches=2)
    produce(kafka_broker.bootstrap, p.topics[0], count=40, partitions=4)
    pruned = []
    for n in range(4):  # batch 1 reads everything, batches 2-4 are empty (no Spark job)
        r = af.run_dag(p.ingest_dag_id, n)
        assert r.state == "success", r.task_states
        pruned.append(r.xcoms["record"]["pruned_batches"])
    # batch 1's ranges end at every partition's head, which pruning never deletes; the empty batch 2
    # goes once it is older than the newest 2
    assert pruned == [0, 0, 0, 1]
    assert sorted(b.batch_id for b in ledger.recent_batches(p.name, 100)) == [1, 3, 4]
    assert sink_ids(p.sink) == Counter(range(40))
    assert sum(committed(kafka_broker.bootstrap, p).values()) == 40


@CONNECT_ONLY
def test_a_recreated_topic_is_noticed_at_plan_replay_and_commit(
    make_pipeline, kafka_broker, tmp_path, monkeypatch
):
    """A topic deleted and created again restarts its offsets (issue 21, item 1). Before, the plan
    went on from the old head (skipping the new topic's first records), a replay of an old batch read
    the new topic's records at the old offsets, and the commit put old watermarks on the new topic."""
    from airflow_kafka_backpressure.hooks.kafka_offsets import KafkaOffsetsHook
    from airflow_kafka_backpressure.operators.common import commit_progress

    from .kafka_samples import recreate_topic

    bootstrap = kafka_broker.bootstrap
    flag = tmp_path / "fail.flag"
    monkeypatch.setenv("KBP_TEST_FAIL_FLAG", str(flag))
    fields = {"transform": "tests.integration.e2e_transforms:fail_while_flagged", "replay_interval_s": 20}
    p, ledger = make_pipeline(**fields)
    topic = p.topics[0]
    produce(bootstrap, topic, count=40, partitions=4)
    assert af.run_dag(p.ingest_dag_id, 0).state == "success"  # batch 1: 40 records
    produce(bootstrap, topic, count=20, partitions=4, start_id=40)
    flag.touch()
    assert af.run_dag(p.ingest_dag_id, 1).task_states["ingest"] == "failed"  # batch 2: 20 records, failed
    flag.unlink()
    old_id, new_id = recreate_topic(bootstrap, topic, 4)
    produce(bootstrap, topic, count=30, partitions=4, start_id=1000)
    assert ledger.batch(1).plan.topic_ids == {topic: old_id}

    # on_topic_reset="fail" (the default): nothing is planned, replayed or committed on the new topic
    r = af.run_dag(p.ingest_dag_id, 2)
    assert r.task_states["plan"] == "failed", r.task_states
    assert [b.batch_id for b in ledger.recent_batches(p.name, 10)] == [2, 1]
    replay = af.run_dag(p.replay_dag_id, 0)
    assert replay.state == "failed", replay.task_states
    b2 = ledger.batch(2)
    assert b2.status == "failed" and "deleted and created again" in b2.error and new_id in b2.error, b2.error
    assert "on_topic_reset" in b2.error and "abandon" in b2.error
    with KafkaOffsetsHook("kafka_default").get_conn() as kafka:
        assert commit_progress(p, ledger, kafka) == {}  # batch 1's watermarks stay off the new topic
    assert sum(committed(bootstrap, p).values()) == 0
    assert sink_ids(p.sink) == Counter(range(40))

    # on_topic_reset="earliest": batch 2's old offsets are recorded as lost, the new topic is read from 0.
    # (A batch the replay refused waits one replay interval before its next try, the replay queue's
    # backoff: the pipeline's replay interval is made short so that the next run takes it.)
    p, ledger = make_pipeline(on_topic_reset="earliest", **{**fields, "replay_interval_s": 1})
    replay = af.run_dag(p.replay_dag_id, 1)
    assert replay.state == "success", replay.task_states
    b2 = ledger.batch(2)
    assert b2.status == "replayed"
    assert [(x.batch_id, x.lost, {s.reason for s in x.spans}) for x in ledger.losses(p.name)] == [
        (2, 20, {"the topic was deleted and created again before these offsets were read"})
    ]
    r = af.run_dag(p.ingest_dag_id, 3)
    assert r.state == "success", r.task_states
    plan = r.xcoms["plan"]
    assert plan["topic_ids"] == {topic: new_id}
    assert sorted((x["from_offset"], x["until_offset"] - x["from_offset"]) for x in plan["ranges"]) == [
        (0, 7),
        (0, 7),
        (0, 8),
        (0, 8),
    ]
    assert sink_ids(p.sink) == Counter(range(40)) + Counter(
        range(1000, 1030)
    )  # nothing twice, nothing of the new topic skipped
    assert sum(committed(bootstrap, p).values()) == 30


@pytest.mark.parametrize("make_pipeline", ["submit"], indirect=True)
def test_a_sink_that_cannot_hold_its_guarantees_fails_the_plan_and_nothing_is_planned(
    make_pipeline, kafka_broker, monkeypatch
):
    """The plan task refuses an object-store sink (no directory rename) and a local sink under a
    Spark master with executors on other hosts (issue 22): no batch, no Spark job, nothing committed."""
    p, ledger = make_pipeline(sink="s3a://lake/orders")
    produce(kafka_broker.bootstrap, p.topics[0], count=8, partitions=4)
    r = af.run_dag(p.ingest_dag_id, 0)
    assert r.task_states["plan"] == "failed" and r.task_states["ingest"] != "success", r.task_states
    assert ledger.recent_batches(p.name, 10) == []

    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT",
        json.dumps({"conn_type": "spark", "host": "spark://10.1.2.3", "port": 7077}),
    )
    p, ledger = make_pipeline()
    r = af.run_dag(p.ingest_dag_id, 1)
    assert r.task_states["plan"] == "failed", r.task_states
    assert ledger.recent_batches(p.name, 10) == []
    assert sum(committed(kafka_broker.bootstrap, p).values()) == 0
