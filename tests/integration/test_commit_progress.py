"""Consumer-group commits from the ledger against the real broker: forward only, never past an
unfinished range."""

from __future__ import annotations

from airflow_kafka_backpressure.batch.models import OffsetRange, TopicPartition
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from airflow_kafka_backpressure.ledger import Ledger
from airflow_kafka_backpressure.operators.common import commit_progress
from kbp_local.producer import ensure_topic, produce


def test_commits_move_forward_only_and_stop_at_unfinished_ranges(kafka_broker, topic_name, tmp_path):
    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    produce(kafka_broker.bootstrap, topic_name, count=30, partitions=1)
    p = PipelineConfig(name="commits", topics=(topic_name,), sink=str(tmp_path / "sink"))
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.create_all()
    tp = TopicPartition(topic_name, 0)
    ids = []
    for i, (a, b) in enumerate([(0, 10), (10, 20), (20, 30)]):
        batch = ledger.record_plan(
            p.name, f"run{i}", [OffsetRange(topic_name, 0, a, b)], p.sink, 1000, 0
        ).batch_id
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


def running_batches(bootstrap: str, topic: str, tmp_path, name: str, sizes: list[int]):
    """A one-partition topic with ``sum(sizes)`` records and a SQLite ledger holding one running
    batch per size, back to back: ``(pipeline, ledger url, ledger, batch ids)``."""
    ensure_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, count=sum(sizes), partitions=1)
    p = PipelineConfig(name=name, topics=(topic,), sink=str(tmp_path / "sink"))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(url)
    ledger.create_all()
    ids, start = [], 0
    for i, size in enumerate(sizes):
        batch = ledger.record_plan(
            p.name, f"run{i}", [OffsetRange(topic, 0, start, start + size)], p.sink, 1000, 0
        ).batch_id
        ledger.mark_running(batch)
        ids.append(batch)
        start += size
    return p, url, ledger, ids


def test_concurrent_record_and_replay_commits_only_move_forward(kafka_broker, topic_name, tmp_path):
    """Two threads commit at once, as the record and the replay task can: "record" finishes batches
    one by one and commits after each, "replay" commits in a loop meanwhile. Each reads the group's
    position and commits past it; without one lock around read-compare-commit, a caller holding an
    older view commits after a newer one and the group moves back. A third thread watches the group."""
    import threading

    p, url, ledger, ids = running_batches(kafka_broker.bootstrap, topic_name, tmp_path, "race", [1] * 40)
    tp = TopicPartition(topic_name, 0)

    finished = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def record() -> None:
        try:
            with KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap}) as kafka:
                for batch in ids:
                    ledger.mark_succeeded(batch, 1, 1)
                    commit_progress(p, ledger, kafka)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            finished.set()

    def replay() -> None:
        try:
            with KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap}) as kafka:
                while not finished.is_set():
                    commit_progress(p, Ledger(url), kafka)
                commit_progress(p, Ledger(url), kafka)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def watch() -> None:
        with KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap}) as kafka:
            while not finished.is_set():
                seen.append(kafka.committed_offsets(p.group, [tp]).get(tp, 0))

    threads = [threading.Thread(target=f) for f in (record, replay, replay, watch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap}) as kafka:
        final = kafka.committed_offsets(p.group, [tp])[tp]
    seen.append(final)
    assert final == 40
    assert seen == sorted(seen), [(a, b) for a, b in zip(seen, seen[1:]) if b < a]


def test_a_commit_waits_for_the_pipelines_commit_lock(kafka_broker, topic_name, tmp_path):
    """While another task holds the pipeline's commit lock (it is between reading the group's
    position and committing), a commit does not read or commit; it goes ahead once the lock is free."""
    import threading

    from airflow_kafka_backpressure.operators.common import commit_lock

    p, url, ledger, (batch,) = running_batches(kafka_broker.bootstrap, topic_name, tmp_path, "held", [5])
    ledger.mark_succeeded(batch, 5, 1)
    tp = TopicPartition(topic_name, 0)

    result: dict = {}

    def commit() -> None:
        with KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap}) as kafka:
            result["committed"] = commit_progress(p, Ledger(url), kafka)

    with KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap}) as kafka:
        with commit_lock(p, ledger):
            t = threading.Thread(target=commit, daemon=True)
            t.start()
            t.join(10)  # far longer than a commit takes: it is waiting for the lock, not working
            assert t.is_alive() and "committed" not in result
            assert kafka.committed_offsets(p.group, [tp]) == {}
        t.join(60)
        assert result["committed"] == {str(tp): 5}
        assert kafka.committed_offsets(p.group, [tp]) == {tp: 5}
