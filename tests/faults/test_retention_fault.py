"""Retention deletes a failed batch's offsets before its replay, under a real scheduler.

The records are really deleted: Kafka's DeleteRecords moves the partition's log start offset, as
retention does when it removes old segments. The batch fails in its Spark job (its transform raises
while a flag file exists), the replay DAG finds the lost offsets, records them (the pipeline's
``on_data_loss`` is ``skip``) and writes the rest exactly once.
"""

from __future__ import annotations

from airflow_kafka_backpressure.batch.models import TopicPartition

from ..integration.kafka_samples import delete_records
from .conftest import PARTITIONS, STEP_TIMEOUT_S
from .harness import wait_for

LOST_PER_PARTITION0 = 10  # offsets 0..9 of partition 0, deleted


def test_retention_deleting_a_failed_batchs_offsets_is_recorded_as_lost_and_the_rest_replayed(rig):
    p = rig.pipeline("retention")
    assert p.on_data_loss == "skip"
    rig.fail_flag.touch()
    rig.produce(p, 200, 0)
    rig.start(p, replay=False)
    ledger = rig.ledger(p)
    failed = wait_for(
        "the first batch to fail in its Spark job",
        lambda: ledger.recent_batches(p.name, 10, ["failed"]),
        STEP_TIMEOUT_S,
        every_s=2,
        transient=(Exception,),  # the ledger is created by the first task
    )
    first = ledger.batch(min(b.batch_id for b in failed))  # batch ids are the shared ledger's
    assert "injected failure" in (first.error or ""), first.error
    assert {r.partition: r.until_offset - r.from_offset for r in first.ranges} == {
        q: 100 for q in range(PARTITIONS)
    }

    topic = p.topics[0]
    delete_records(rig.broker.bootstrap, {TopicPartition(topic, 0): LOST_PER_PARTITION0})
    rig.fail_flag.unlink()
    rig.produce(p, 100, 200)
    rig.start(p)  # the replay DAG too

    outcome, took = rig.recover(p)
    assert outcome.ok, outcome.summary()
    assert outcome.lost == [(0, o) for o in range(LOST_PER_PARTITION0)], outcome.summary()
    assert outcome.written == 300 - LOST_PER_PARTITION0 and not outcome.duplicated, outcome.summary()
    batch = ledger.batch(first.batch_id)
    assert batch.status == "replayed" and batch.records == 200 - LOST_PER_PARTITION0, batch
    (loss,) = [x for x in ledger.losses(p.name, 100) if x.batch_id == first.batch_id]
    assert loss.lost == LOST_PER_PARTITION0
    assert [(s.partition, s.from_offset, s.until_offset) for s in loss.spans] == [(0, 0, LOST_PER_PARTITION0)]
    print(f"retention: recovered in {took:.0f}s; batches {dict(outcome.statuses)}")
