"""Issue 9, items 1 and 2: the replay never stalls, handles retention loss per ``on_data_loss`` (the
records are deleted on the broker, as retention deletes them), and
adopts a batch that was written but not marked — the shipped DAGs under real Airflow (dag.test), the
real broker, real Spark (spark-submit, local[2]) and a SQLite ledger. The sink is read back with
pyarrow, independently of the job."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange, TopicPartition
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.ledger import Ledger
from kbp_local.producer import produce

from . import airflow_harness as af
from .kafka_samples import delete_records
from .test_pipeline_e2e import committed, sink_ids

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


@pytest.fixture
def make_pipeline(request, kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db):
    # the connect engine: replay and adoption are the same above the hook, and its batches cost a
    # fraction of spark-submit's (the submit engine's replays are in test_batch_stop and the fault suite)
    return af.engine_pipeline_maker(
        request, "connect", monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path
    )


def failed_batches(
    make_pipeline, kafka_broker, n: int, per_batch: int, **overrides
) -> tuple[PipelineConfig, Ledger]:
    """``n`` failed batches of ``per_batch`` records each (ids in production order), failed before
    Spark ran: the executors Variable is broken while they are ingested, then repaired."""
    p, ledger = make_pipeline(replay_interval_s=20, **overrides)
    af.set_variable(p.executors_variable, "{not json")
    for i in range(n):
        produce(kafka_broker.bootstrap, p.topics[0], count=per_batch, partitions=4, start_id=i * per_batch)
        r = af.run_dag(p.ingest_dag_id, i)
        assert r.task_states["ingest"] == "failed", r.task_states
    af.set_variable(p.executors_variable, json.dumps({"executors": 1}))
    for b in range(1, n + 1):  # each batch holds exactly its run's records: per_batch / 4 per partition
        batch = ledger.batch(b)
        assert batch.status == "failed"
        assert sorted((r.partition, r.from_offset, r.until_offset) for r in batch.ranges) == [
            (q, (b - 1) * per_batch // 4, b * per_batch // 4) for q in range(4)
        ]
    return p, ledger


def wait_until_due(ledger: Ledger, batch_id: int, p: PipelineConfig) -> None:
    """Sleep until the failed batch ``batch_id`` is due for a replay (the replay queue's backoff)."""
    from airflow_kafka_backpressure.ledger.replay_queue import due_at_ms
    from airflow_kafka_backpressure.operators.replay import replay_backoff_base_ms

    due_ms = due_at_ms(ledger.batch(batch_id), replay_backoff_base_ms(p))
    time.sleep(max(0.0, due_ms / 1000 - time.time()) + 0.1)


def ids_at(partition: int, offsets: range) -> set[int]:
    """Ids at ``offsets`` of ``partition`` (id i went to partition i % 4, in order)."""
    return {partition + 4 * o for o in offsets}


def test_a_failing_batch_does_not_block_later_ones_and_skip_records_retention_losses(
    make_pipeline, kafka_broker, tmp_path, monkeypatch
):
    poison = tmp_path / "poison.json"
    monkeypatch.setenv("KBP_TEST_POISON_FILE", str(poison))
    p, ledger = failed_batches(
        make_pipeline,
        kafka_broker,
        3,
        40,
        transform="tests.integration.e2e_transforms:fail_on_poison",
        on_data_loss="skip",
    )
    topic = p.topics[0]
    poison.write_text(json.dumps(list(range(40, 80))))  # batch 2's records make its replay fail
    delete_records(kafka_broker.bootstrap, {TopicPartition(topic, 0): 4})  # offsets 0..3 of partition 0 gone

    r = af.run_dag(p.replay_dag_id, 0)
    assert r.task_states["failed_ranges"] == "success" and r.xcoms["failed_ranges"] == [1, 2, 3]
    # the replay task succeeds (its replayed batches' Asset events are sent); the check task fails
    # naming the batch that failed, and so does the run ...
    assert (r.state, r.task_states["replay"], r.task_states["check"]) == ("failed", "success", "failed")
    assert r.xcoms["check"] is None and [x["batch_id"] for x in r.xcoms["replay"]] == [1, 3]
    assert [ledger.batch(b).status for b in (1, 2, 3)] == [
        "replayed",
        "failed",
        "replayed",
    ]  # ... not stalled
    assert "poison ids" in ledger.batch(2).error
    lost = ids_at(0, range(0, 4))
    assert sink_ids(p.sink) == Counter(set(range(40)) - lost | set(range(80, 120)))  # never read: not written
    assert ledger.batch(1).records == 36
    # the loss is recorded with its count (what the monitoring page's API lists)
    (losses,) = ledger.losses(p.name)
    assert losses.batch_id == 1 and losses.lost == 4
    assert [(s.topic, s.partition, s.from_offset, s.until_offset, s.kind) for s in losses.spans] == [
        (topic, 0, 0, 4, "replay")
    ]
    from airflow_kafka_backpressure.plugins import views

    assert views.losses(ledger, p.name, 10) == [losses.to_dict()]
    # commits pass batch 1 (written or recorded as lost) and stop at the failed batch 2
    assert committed(kafka_broker.bootstrap, p) == {TopicPartition(topic, q): 10 for q in range(4)}

    poison.unlink()
    # the next replay run as the scheduler would start it, once batch 2's backoff after its failed
    # replay (one replay interval) has passed. Started at once, its sensor's window (0.9 of the
    # interval, polled every quarter) could close before the batch was due: on a fast machine the
    # first run ended 2 s after batch 2's replay failed and the second run was skipped (2026-12-01)
    wait_until_due(ledger, 2, p)
    again = af.run_dag(p.replay_dag_id, 1)
    assert again.state == "success", again.task_states
    assert [x["batch_id"] for x in again.xcoms["replay"]] == [2]
    assert ledger.batch(2).status == "replayed"
    assert sink_ids(p.sink) == Counter(set(range(120)) - lost)
    assert committed(kafka_broker.bootstrap, p) == {TopicPartition(topic, q): 30 for q in range(4)}


def test_fail_mode_names_the_batch_and_the_abandon_command_and_later_batches_are_still_replayed(
    make_pipeline, kafka_broker
):
    p, ledger = failed_batches(make_pipeline, kafka_broker, 2, 40, on_data_loss="fail")
    topic = p.topics[0]
    delete_records(kafka_broker.bootstrap, {TopicPartition(topic, 1): 3})

    r = af.run_dag(p.replay_dag_id, 0)
    assert (r.state, r.task_states["replay"], r.task_states["check"]) == ("failed", "success", "failed")
    first, second = ledger.batch(1), ledger.batch(2)
    assert first.status == "failed" and second.status == "replayed"
    assert f"Batch 1 of pipeline {p.name!r} cannot be replayed" in first.error
    assert f"{topic}-1[0, 3) (3 records)" in first.error
    command = first.error.split("run: ", 1)[1].split(" (or set on_data_loss", 1)[0]
    assert command.startswith(
        "python -m airflow_kafka_backpressure.ledger abandon --conn-id kbp_ledger_test --batch 1 "
    )
    assert sink_ids(p.sink) == Counter(range(40, 80))  # batch 2 written ...
    assert committed(kafka_broker.bootstrap, p) == {}  # ... but nothing committed past batch 1

    # the exact command from the message gives batch 1 up
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-m"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ledger.batch(1).status == "abandoned"
    assert sum(x.lost for x in ledger.losses(p.name)) == 40
    # the next run commits past the abandoned batch (its offsets are recorded as lost)
    assert af.run_dag(p.ingest_dag_id, 2).state == "success"  # nothing new: an empty batch, no Spark
    assert committed(kafka_broker.bootstrap, p) == {TopicPartition(topic, q): 20 for q in range(4)}
    assert ledger.replayable_batches(p.name) == []


def write_without_mark(
    p: PipelineConfig,
    ledger: Ledger,
    bootstrap: str,
    token: str,
    start_id: int = 0,
    offsets: tuple[int, int] = (0, 10),
):
    """40 records produced (ids from ``start_id``) and planned as one batch (``offsets`` of each
    partition), which attempt ``token`` runs through the sink's commit; the ledger is not told (the
    worker died before its mark): the row stays ``running`` under ``token``. Returns the plan and
    the job's metrics."""
    from airflow_kafka_backpressure.hooks.spark_batch import SparkBatchHook

    ledger.upgrade()  # what the DAG's tasks do on first use
    produce(bootstrap, p.topics[0], count=40, partitions=4, start_id=start_id)
    plan = running_by_hand(p, ledger, token, *offsets)
    metrics = SparkBatchHook.for_pipeline(p).run(
        plan, 1, {"bootstrap.servers": bootstrap}, token=token, attempt=ledger.batch(plan.batch_id).attempts
    )
    return plan, metrics


def running_by_hand(p: PipelineConfig, ledger: Ledger, token: str, start: int, end: int):
    """A batch of offsets [start, end) of each of the 4 partitions of the pipeline's topic,
    planned and marked running under attempt ``token`` (attempt 1, an hour's lease) as a worker's
    plan and ingest tasks would; the plan."""
    plan = ledger.record_plan(
        p.name,
        f"manual__{token[:8]}",
        [OffsetRange(p.topics[0], q, start, end) for q in range(4)],
        p.sink,
        p.batch_interval_ms,
        int(time.time() * 1000),
    )
    ledger.mark_running(plan.batch_id, executors=1, token=token, lease_ms=3_600_000)
    return plan


def zombie_refused_after_the_replay(
    make, fields: dict, flag: Path, bootstrap: str, commits: Callable[[], list[tuple[int, int]]]
) -> None:
    """Attempt fencing through the DAGs, for a sink format whose batch commits ``commits()`` lists
    as ``(batch id, attempt)``: batch 1 through the ingest DAG (the table exists, as it mostly does);
    attempt 1 of batch 2 (a worker that stopped heartbeating, so its lease ran out) still runs its
    Spark job, held in a UDF while ``flag`` exists (``make``'s pipeline has test_batch_stop.HOLD as
    its transform), when the replay DAG takes the batch over and commits it as attempt 2; then
    attempt 1's job goes on to its commit and the sink refuses it, committing nothing. Checks the
    ledger's mark and the committed group; the caller checks its table's rows (80 records)."""
    import threading

    from airflow_kafka_backpressure.hooks.spark_batch import SparkBatchHook

    from .test_batch_stop import HOLD, wait_for_held_udf

    p, ledger = make(transform=HOLD, **fields)
    produce(bootstrap, p.topics[0], count=40, partitions=4)
    first = af.run_dag(p.ingest_dag_id, 0)
    assert first.state == "success", first.task_states
    produce(bootstrap, p.topics[0], count=40, partitions=4, start_id=40)
    zombie = "0badf00d" * 4
    plan = running_by_hand(p, ledger, zombie, 10, 20)
    assert (plan.batch_id, ledger.batch(plan.batch_id).attempts) == (2, 1)
    flag.touch()

    outcome: dict = {}

    def attempt_1() -> None:
        try:
            outcome["metrics"] = SparkBatchHook.for_pipeline(p).run(
                plan, 1, {"bootstrap.servers": bootstrap}, token=zombie, attempt=1
            )
        except Exception as e:  # what the operator would see
            outcome["error"] = e

    worker = threading.Thread(target=attempt_1, daemon=True)
    worker.start()
    assert wait_for_held_udf(flag), "attempt 1's job never reached the batch's rows"
    ledger.renew_lease(plan.batch_id, zombie, 1)  # ... and its worker stopped heartbeating
    time.sleep(0.05)

    p, ledger = make(name=p.name, **fields)  # the replay's job is not held
    r = af.run_dag(p.replay_dag_id, 0)
    assert r.state == "success", r.task_states
    assert [(x["batch_id"], x["records"], x["adopted"]) for x in r.xcoms["replay"]] == [
        (plan.batch_id, 40, False)
    ]
    assert commits() == [(1, 1), (2, 2)]

    flag.unlink()  # attempt 1's job goes on to its commit
    worker.join(600)
    assert not worker.is_alive(), "attempt 1's job did not end"
    assert "metrics" not in outcome, f"the stale attempt succeeded: {outcome.get('metrics')}"
    error = str(outcome["error"])
    assert "attempt 1 was refused, attempt 2 has committed the batch" in error, error
    assert commits() == [(1, 1), (2, 2)]
    batch = ledger.batch(plan.batch_id)
    assert (batch.status, batch.attempts, batch.records) == ("replayed", 2, 40)
    assert committed(bootstrap, p) == {TopicPartition(p.topics[0], q): 20 for q in range(4)}


def adopted_by_the_replay_dag(p: PipelineConfig, ledger: Ledger, plan, token: str, records: int = 40):
    """The dead attempt ``token``'s lease runs out, then the shipped replay DAG runs: it succeeds,
    reports the batch of ``plan`` adopted with its ``records`` and nothing lost, and the ledger has
    it replayed by a second attempt. Returns the replay run."""
    ledger.renew_lease(plan.batch_id, token, 1)
    time.sleep(0.05)  # the lease expired
    r = af.run_dag(p.replay_dag_id, 0)
    assert r.state == "success", r.task_states
    assert [(x["batch_id"], x["records"], x["adopted"], x["lost"]) for x in r.xcoms["replay"]] == [
        (plan.batch_id, records, True, 0)
    ]
    batch = ledger.batch(plan.batch_id)
    assert (batch.status, batch.records, batch.attempts) == ("replayed", records, 2)
    return r


def written_not_marked(make_pipeline, kafka_broker, token: str, **fields):
    """A batch of 40 records whose attempt ``token`` ran the job (the sink swap committed) and died
    before the ledger's mark: the row stays ``running`` under ``token``. Returns the pipeline, its
    ledger, the plan and the committed manifest."""
    p, ledger = make_pipeline(**fields)
    plan, metrics = write_without_mark(p, ledger, kafka_broker.bootstrap, token)
    assert metrics.records == 40 and sink_ids(p.sink) == Counter(range(40))
    manifest = json.loads((Path(plan.output_path) / "_manifest.json").read_text())
    assert manifest["token"] == token and manifest["attempt"] == 1
    return p, ledger, plan, manifest


def test_a_batch_written_but_not_marked_is_adopted_without_reading_again(
    make_pipeline, kafka_broker, monkeypatch
):
    """The worker ran the job (the sink swap committed) and died before mark_succeeded: the ledger row
    stays ``running`` under the dead attempt's token until its lease expires."""
    dead = "deadbeef" * 4
    p, ledger, plan, manifest = written_not_marked(make_pipeline, kafka_broker, dead, replay_interval_s=20)
    topic = p.topics[0]
    assert ledger.batch(plan.batch_id).status == "running"  # ... and the worker died here
    assert ledger.replayable_batches(p.name) == []  # its lease still runs: not abandoned yet

    r = adopted_by_the_replay_dag(p, ledger, plan, dead)
    assert r.xcoms["replay"] == [
        {
            "batch_id": plan.batch_id,
            "records": 40,
            "processing_ms": r.xcoms["replay"][0]["processing_ms"],
            "adopted": True,
            "lost": 0,
        }
    ]
    # the committed version is the dead attempt's, untouched: nothing was read or written again
    assert json.loads((Path(plan.output_path) / "_manifest.json").read_text()) == manifest
    assert sink_ids(p.sink) == Counter(range(40))
    assert committed(kafka_broker.bootstrap, p) == {TopicPartition(topic, q): 10 for q in range(4)}
    assert ledger.losses(p.name) == []


def test_a_written_batch_is_adopted_after_a_replay_that_died_before_its_check_and_retention(
    make_pipeline, kafka_broker
):
    """Issue 21, item 3: attempt A commits and dies before the mark; replay R1 claims the batch and
    fails before its adoption check; retention then deletes some of the batch's offsets. Before, R2
    could neither adopt A's output (not the last owner's) nor read again, and with on_data_loss
    'fail' it advised abandoning offsets whose data was in the sink. Now R2 adopts A's version."""
    a = "a" * 32
    p, ledger, plan, manifest = written_not_marked(
        make_pipeline, kafka_broker, a, replay_interval_s=20, on_data_loss="fail"
    )
    topic = p.topics[0]
    # two minutes ago A's lease expired (A is dead), R1 claimed the batch and failed: a replay
    # interval (20 s) has passed since, so R1's failed replay no longer holds it back (issue 39, item 4)
    now = int(time.time() * 1000)
    ledger.renew_lease(plan.batch_id, a, 1, at_ms=now - 120_000)
    r1 = "b" * 32
    ledger.mark_replaying(plan.batch_id, at_ms=now - 110_000, token=r1, lease_ms=60_000)
    # before its adoption check
    ledger.mark_failed(plan.batch_id, "spark-submit could not start", token=r1, at_ms=now - 100_000)
    delete_records(kafka_broker.bootstrap, {TopicPartition(topic, 1): 3})  # retention moves on

    r = af.run_dag(p.replay_dag_id, 0)
    assert r.state == "success", r.task_states
    assert [(x["batch_id"], x["records"], x["adopted"], x["lost"]) for x in r.xcoms["replay"]] == [
        (plan.batch_id, 40, True, 0)
    ]
    batch = ledger.batch(plan.batch_id)
    assert batch.status == "replayed" and batch.records == 40
    assert json.loads((Path(plan.output_path) / "_manifest.json").read_text()) == manifest  # A's, untouched
    assert ledger.losses(p.name) == []  # nothing recorded as lost: every offset is in the sink
    assert sink_ids(p.sink) == Counter(range(40))
    assert committed(kafka_broker.bootstrap, p) == {TopicPartition(topic, q): 10 for q in range(4)}


def failed_by_hand(p: PipelineConfig, ledger: Ledger, ranges_per_batch) -> list[int]:
    """Batches planned with the given ranges (``[(partition, from, until), ...]`` each) and failed on
    the main line, as a worker's plan and ingest tasks leave them when the sink was down."""
    ledger.upgrade()  # what the DAG's tasks do on first use
    ids = []
    for i, ranges in enumerate(ranges_per_batch):
        plan = ledger.record_plan(
            p.name,
            f"manual__{i}",
            [OffsetRange(p.topics[0], q, a, b) for q, a, b in ranges],
            p.sink,
            p.batch_interval_ms,
            int(time.time() * 1000),
        )
        ledger.mark_running(plan.batch_id, executors=1)
        ledger.mark_failed(plan.batch_id, "the sink was down")
        ids.append(plan.batch_id)
    return ids


def test_batches_refused_every_time_do_not_hold_back_the_ones_after_them(
    make_pipeline, kafka_broker, monkeypatch
):
    """Issue 39, item 4, through the shipped replay DAG: each run took the N earliest failed batches,
    so N batches that are refused every time (here retention under on_data_loss='fail'; N = 2 runs
    per batch instead of 10, to keep the test short) blocked every later batch for good. Now the
    next run replays the batch behind them, and the consumer group still does not pass them."""
    from airflow_kafka_backpressure import dag_factory

    monkeypatch.setattr(dag_factory, "REPLAY_BATCHES_PER_RUN", 2)
    p, ledger = make_pipeline(replay_interval_s=600, on_data_loss="fail")
    topic = p.topics[0]
    produce(kafka_broker.bootstrap, topic, count=12, partitions=4)  # 3 records per partition
    first, second, third = failed_by_hand(
        p, ledger, [[(0, 0, 1)], [(0, 1, 2)], [(0, 2, 3), (1, 0, 3), (2, 0, 3), (3, 0, 3)]]
    )
    delete_records(kafka_broker.bootstrap, {TopicPartition(topic, 0): 2})  # batches 1 and 2: gone

    r = af.run_dag(p.replay_dag_id, 0)
    assert r.state == "failed", r.task_states
    for b in (first, second):
        assert ledger.batch(b).status == "failed" and "cannot be replayed" in ledger.batch(b).error
    assert ledger.batch(third).status == "failed" and ledger.batch(third).attempts == 1  # not tried

    again = af.run_dag(p.replay_dag_id, 1)
    assert [x["batch_id"] for x in again.xcoms["replay"]] == [third]  # before: batches 1 and 2 again
    assert ledger.batch(third).status == "replayed"
    assert sink_ids(p.sink) == Counter([8, *(i for i in range(12) if i % 4)])  # batch 3's records
    assert [(b.status, b.replay_failures) for b in map(ledger.batch, (first, second))] == [("failed", 1)] * 2
    # partition 0 stays before failed batch 1; the others are committed past batch 3
    assert committed(kafka_broker.bootstrap, p) == {TopicPartition(topic, q): 3 for q in (1, 2, 3)}
