"""Consumer-group commits from the ledger against the real broker: forward only, never past an
unfinished range."""

from __future__ import annotations

from airflow_kafka_backpressure.kafka_offsets import KafkaOffsets
from airflow_kafka_backpressure.ledger import Ledger
from airflow_kafka_backpressure.local.producer import ensure_topic, produce
from airflow_kafka_backpressure.models import OffsetRange, TopicPartition
from airflow_kafka_backpressure.operators.common import commit_progress
from airflow_kafka_backpressure.pipeline import PipelineConfig


def test_commits_move_forward_only_and_stop_at_unfinished_ranges(kafka_broker, topic_name, tmp_path):
    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    produce(kafka_broker.bootstrap, topic_name, count=30, partitions=1)
    p = PipelineConfig(name="commits", topics=(topic_name,), sink=str(tmp_path / "sink"))
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.create_all()
    tp = TopicPartition(topic_name, 0)
    ids = []
    for i, (a, b) in enumerate([(0, 10), (10, 20), (20, 30)]):
        batch = ledger.record_plan(p.name, f"run{i}", [OffsetRange(topic_name, 0, a, b)], p.sink, 1000, 0).batch_id
        ids.append(batch)
        ledger.mark_running(batch)
    ledger.mark_succeeded(ids[0], 10, 1)
    ledger.mark_failed(ids[1], "boom")
    ledger.mark_succeeded(ids[2], 10, 1)

    with KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap}) as kafka:
        assert commit_progress(p, ledger, kafka) == {str(tp): 10}  # stops at the failed range
        ledger.mark_replaying(ids[1])
        ledger.mark_replayed(ids[1], 10, 1)
        assert commit_progress(p, ledger, kafka) == {str(tp): 30}
        # a user clears the first run: its batch is rewritten, the commit does not go back
        ledger.mark_running(ids[0])
        assert commit_progress(p, ledger, kafka) == {}
        assert kafka.committed_offsets(p.group, [tp]) == {tp: 30}
