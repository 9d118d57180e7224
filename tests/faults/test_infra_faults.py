"""The pipeline's services fail or change under a real scheduler: the broker frozen (SIGSTOP) for
longer than every timeout, the ledger's PostgreSQL stopped and restarted, each while a batch is in
flight, the S3 server under a Delta sink stopped and restarted mid-batch, the topic given more
partitions while the pipeline runs, and the topic deleted and created again while a batch reads it."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from datetime import datetime, timezone

import pytest

from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from kbp_local.producer import ensure_topic, produce

from .conftest import PARTITIONS, RECOVER_TIMEOUT_S, STEP_TIMEOUT_S
from .harness import IN_FLIGHT, HarnessError, lost_offsets, wait_for

FREEZE_S = 45  # longer than the Kafka client timeouts (10 s) and the reader's stall timeout (20 s)
#: The broker stays frozen until the tasks that were running when it froze have ended (bounded
#: waits), at most this long: spark-submit alone takes minutes on a loaded 2-core machine.
FREEZE_MAX_S = 300
LEDGER_DOWN_S = 30
S3_DOWN_S = 20


def test_a_broker_frozen_longer_than_the_timeouts_costs_no_record(rig):
    p = rig.pipeline("broker_freeze")
    rig.produce(p, 300, 0)
    rig.start(p)
    rig.wait_for_spark(p)
    time.sleep(2)
    frozen_at = datetime.now(timezone.utc)
    os.kill(rig.broker.pid, signal.SIGSTOP)
    try:
        time.sleep(FREEZE_S)
        # every wait is bounded: the tasks in flight when the broker froze end while it is frozen
        in_flight = rig.standalone.tasks_running_since(p, frozen_at)
        wait_for(
            f"the tasks in flight when the broker froze ({in_flight}) to end while it is frozen",
            lambda: not rig.standalone.tasks_running_since(p, frozen_at),
            FREEZE_MAX_S,
            every_s=2,
        )
    finally:
        os.kill(rig.broker.pid, signal.SIGCONT)
    rig.produce(p, 100, 300)

    rig.assert_recovered(p, 400, f"broker frozen {FREEZE_S}s")


def down_mid_batch(rig, p, stop, start, down_s: float, service: str) -> None:
    """300 records, the pipeline started, ``stop()`` two seconds into its first batch's Spark job,
    ``start()`` ``down_s`` later, 100 more records: every record once, nothing unfinished."""
    rig.produce(p, 300, 0)
    rig.start(p)
    rig.wait_for_spark(p)
    time.sleep(2)
    stop()
    try:
        time.sleep(down_s)
    finally:
        start()
    rig.produce(p, 100, 300)

    rig.assert_recovered(p, 400, f"{service} down {down_s}s")


def test_the_ledger_database_stopped_and_restarted_mid_batch(rig):
    p = rig.pipeline("pg_outage")
    if not rig.ledger_urls[p.name].startswith("postgresql"):
        pytest.skip("no local PostgreSQL server (KBP_SKIP_POSTGRES=1)")
    down_mid_batch(rig, p, rig.postgres.shutdown, rig.postgres.restart, LEDGER_DOWN_S, "ledger")


def test_the_s3_server_restarted_mid_batch_costs_no_record(rig):
    """Issue 21's S3 scenario: the pipeline writes a Delta table on the rig's S3 server (s3a://,
    hadoop-aws); the server is stopped while a batch's Spark job runs and started again
    S3_DOWN_S later, on its data. The batch commits or fails and is replayed: every record in the
    table once (read from the Delta log with pyarrow), the group at the end, nothing unfinished."""
    p = rig.pipeline("s3_restart")
    assert rig.s3 is not None and p.sink.startswith("s3a://")
    down_mid_batch(rig, p, rig.s3.stop, rig.s3.start, S3_DOWN_S, "S3 server")


def test_partitions_added_mid_run_are_read_from_their_first_record(rig):
    """Issue 21, item 2 under a real scheduler: the topic grows from 2 to 4 partitions while the
    pipeline runs; records produced into the new partitions before a plan sees them are read too."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewPartitions

    p = rig.pipeline("partitions_added")
    rig.produce(p, 300, 0)
    rig.start(p)
    ledger = rig.ledger(p)
    wait_for(
        "a first batch written",
        lambda: any(b.status == "succeeded" for b in ledger.recent_batches(p.name, 10)),
        STEP_TIMEOUT_S,
        every_s=1,
    )
    admin = KafkaAdminClient(bootstrap_servers=rig.broker.bootstrap)
    try:
        admin.create_partitions({p.topics[0]: NewPartitions(total_count=4)})
    finally:
        admin.close()
    produce(rig.broker.bootstrap, p.topics[0], count=100, partitions=4, start_id=300)  # 50 into the new ones

    outcome = rig.assert_recovered(p, 400, "partitions added")
    assert outcome.produced == 400


def sink_ids(sink: str) -> Counter:
    """How many times each record id (the demo producer's) is in the sink."""
    import pyarrow.dataset as ds

    table = ds.dataset(sink, format="parquet", partitioning="hive").to_table(columns=["value"])
    return Counter(json.loads(v)["id"] for v in table.column("value").to_pylist())


def test_a_topic_recreated_mid_batch_is_read_afresh_and_its_unread_records_recorded_lost(rig):
    """Issue 21, item 1 under a real scheduler: the topic is deleted while the first batch reads it and
    created again with new records (on_topic_reset="earliest"). Each old record is in the sink once
    or recorded as lost at its offset; each new one is in the sink once; the group is committed to
    the new topic's end; no batch is left unfinished. (An old record at the same offset as a new one
    must not pass for it: records are told apart by id, not position.)"""
    from kafka import KafkaAdminClient
    from kafka.admin import NewPartitions

    p = rig.pipeline("topic_recreated")
    topic = p.topics[0]
    rig.produce(p, 300, 0)  # id i at partition i % 2, offset i // 2; the first batch plans all of them
    rig.start(p)
    rig.wait_for_spark(p)
    admin = KafkaAdminClient(bootstrap_servers=rig.broker.bootstrap)

    def created_again() -> bool:
        """The topic back with its 2 partitions under a new id (a metadata request of the pipeline may
        have auto-created it first, with the broker's num.partitions=1: then it is grown to 2)."""
        ensure_topic(rig.broker.bootstrap, topic, PARTITIONS)
        described = admin.describe_topics([topic])[0]
        if len(described["partitions"]) < PARTITIONS:
            admin.create_partitions({topic: NewPartitions(total_count=PARTITIONS)})
            return False
        return described["topic_id"] != old_id and len(described["partitions"]) == PARTITIONS

    try:
        old_id = admin.describe_topics([topic])[0]["topic_id"]
        admin.delete_topics([topic])
        wait_for(
            "the topic deleted",
            lambda: (
                topic not in admin.list_topics() or admin.describe_topics([topic])[0]["topic_id"] != old_id
            ),
            60,
            every_s=0.5,
        )
        wait_for("the topic created again", created_again, 60, every_s=1, transient=(Exception,))
    finally:
        admin.close()
    rig.produce(p, 200, 1000)

    def state() -> tuple[Counter, dict, list, set]:
        """Ids in the sink; the group's commit vs the new topic's end per partition; batches not
        finished; offsets recorded as lost."""
        with KafkaOffsets({"bootstrap.servers": rig.broker.bootstrap}) as k:
            tps = k.partitions([topic])
            ends, committed = k.latest_offsets(tps), k.committed_offsets(p.group, tps)
        ledger = rig.ledger(p)
        try:
            unfinished = [
                (b.batch_id, b.status)
                for b in ledger.recent_batches(p.name, 1000)
                if b.status in (*IN_FLIGHT, "failed")
            ]
            lost = lost_offsets(ledger, p.name)
        finally:
            ledger.dispose()
        short = {str(tp): (committed.get(tp, -1), ends[tp]) for tp in tps if committed.get(tp, -1) < ends[tp]}
        return sink_ids(p.sink), short, unfinished, lost

    last: list = []

    def caught_up() -> bool:
        last[:] = [state()]
        ids, short, unfinished, _ = last[0]
        return ids.keys() >= set(range(1000, 1200)) and not short and not unfinished

    try:
        wait_for(
            f"{p.name} to read the new topic whole",
            caught_up,
            RECOVER_TIMEOUT_S,
            every_s=3,
            transient=(Exception,),
        )
    except HarnessError as e:
        ids, short, unfinished, _ = last[0] if last else (Counter(), {}, [], set())
        raise HarnessError(
            f"{e}: new ids missing {sorted(set(range(1000, 1200)) - ids.keys())[:10]}, group short {short}, "
            f"unfinished {unfinished}"
        ) from None
    finally:
        rig.stop(p)
    ids, _, _, lost = state()
    assert not [i for i, n in ids.items() if n > 1], f"records twice in the sink: {ids.most_common(5)}"
    assert set(ids) - set(range(300)) == set(range(1000, 1200)), sorted(
        set(ids) - set(range(300)) - set(range(1000, 1200))
    )[:10]
    unaccounted = [i for i in range(300) if i not in ids and (i % PARTITIONS, i // PARTITIONS) not in lost]
    assert not unaccounted, (
        f"old records neither in the sink nor recorded as lost: {unaccounted[:10]} ({len(unaccounted)})"
    )
    kept = len(set(range(300)) & set(ids))
    print(
        f"topic {topic} (id {old_id}) recreated mid-batch: {kept} old records in the sink, {300 - kept} recorded "
        f"as lost; the 200 new ones once"
    )
