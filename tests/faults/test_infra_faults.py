"""The pipeline's services fail or change under a real scheduler: the broker frozen (SIGSTOP) for
longer than every timeout, the ledger's PostgreSQL stopped and restarted, each while a batch is in
flight, and the topic given more partitions while the pipeline runs."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timezone

import pytest

from airflow_kafka_backpressure.local.producer import produce

from .conftest import STEP_TIMEOUT_S
from .harness import wait_for

FREEZE_S = 45  # longer than the Kafka client timeouts (10 s) and the reader's stall timeout (20 s)
#: The broker stays frozen until the tasks that were running when it froze have ended (bounded
#: waits), at most this long: spark-submit alone takes minutes on a loaded 2-core machine.
FREEZE_MAX_S = 300
LEDGER_DOWN_S = 30


def test_a_broker_frozen_longer_than_the_timeouts_costs_no_record(rig):
    p = rig.pipeline("broker_freeze")
    rig.produce(p, 300, 0)
    rig.start(p)
    wait_for(
        "a Spark driver of the pipeline",
        lambda: rig.standalone.spark_drivers(f"kbp-{p.name}-batch-"),
        STEP_TIMEOUT_S,
        every_s=0.5,
    )
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


def test_the_ledger_database_stopped_and_restarted_mid_batch(rig):
    p = rig.pipeline("pg_outage")
    if not rig.ledger_urls[p.name].startswith("postgresql"):
        pytest.skip("no local PostgreSQL server (KBP_SKIP_POSTGRES=1)")
    rig.produce(p, 300, 0)
    rig.start(p)
    wait_for(
        "a Spark driver of the pipeline",
        lambda: rig.standalone.spark_drivers(f"kbp-{p.name}-batch-"),
        STEP_TIMEOUT_S,
        every_s=0.5,
    )
    time.sleep(2)
    rig.postgres.shutdown()
    try:
        time.sleep(LEDGER_DOWN_S)
    finally:
        rig.postgres.restart()
    rig.produce(p, 100, 300)

    rig.assert_recovered(p, 400, f"ledger down {LEDGER_DOWN_S}s")


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
