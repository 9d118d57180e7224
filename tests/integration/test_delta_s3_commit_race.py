"""Two Spark drivers committing batches into one Delta table on S3 at the same time: an ingest
batch and a replay, each run by its operator's ``run_and_mark`` on the submit engine (each batch its
own ``spark-submit``, its own driver), against the real S3 server (SeaweedFS) with Delta's default
``S3SingleDriverLogStore``. No commit may be lost.

What makes the race happen every time rather than once in a while: the drivers reach the S3 server
through :class:`~.s3_put_barrier.PutBarrier`, which holds the PUT of the table's next log entry
(``_delta_log/00000000000000000001.json``) until a second PUT of that entry arrives. Each driver
writes it only after checking that it is absent, so without anything that keeps the drivers apart
both PUTs reach the server and the later one overwrites the earlier commit. With the ledger's lock
of the table, the second driver's job starts only after the first one committed: the barrier then
lets the first PUT go as soon as it finds the lock held (no second writer can come), and the second
driver commits the next version.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import pyarrow.fs as pafs
import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.ledger import Ledger
from airflow_kafka_backpressure.ledger.locks import ledger_lock
from airflow_kafka_backpressure.ledger.states import LedgerUnavailable
from kbp_local.producer import produce

from . import airflow_harness as af
from .s3_put_barrier import PutBarrier
from .test_delta_pipeline import Table, batch_commits, delta_log, delta_s3a_conf, table_rows


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


class Endpoint:
    """The S3 server's settings with another endpoint (the barrier's), for ``spark_s3a_conf``."""

    def __init__(self, server: Any, endpoint: str) -> None:
        self.endpoint, self.region = endpoint, server.region
        self.access_key, self.secret_key = server.access_key, server.secret_key


def table_lock_held(ledger_url: str, sink: str) -> bool:
    """Whether a task holds the ledger's lock of the table (the product's name for it; none before
    the lock existed)."""
    try:
        from airflow_kafka_backpressure.sinks import commit_lock_name
    except ImportError:
        return False
    name = commit_lock_name("delta", sink, {})
    if name is None:
        return False
    ledger = Ledger(ledger_url)
    try:
        with ledger_lock(ledger, name, timeout_s=0):
            return False
    except LedgerUnavailable:
        return True
    finally:
        ledger.dispose()


def planned(ledger: Ledger, p: Any, batch: int) -> Any:
    """Batch ``batch`` (1, 2, 3): offsets [10 (batch - 1), 10 batch) of each of the 4 partitions."""
    start = 10 * (batch - 1)
    return ledger.record_plan(
        p.name,
        f"manual__{batch}",
        [OffsetRange(p.topics[0], q, start, start + 10) for q in range(4)],
        p.sink,
        p.batch_interval_ms,
        int(time.time() * 1000),
    )


def test_an_ingest_and_a_replay_committing_one_s3_table_at_once_lose_no_commit(
    kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db, s3_server, s3_bucket
):
    from airflow_kafka_backpressure.operators import ReplayFailedRangesOperator, SparkKafkaBatchOperator

    sink = f"s3a://{s3_bucket}/table"
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    contested = rf"^/{s3_bucket}/table/_delta_log/{1:020d}\.json$"
    for key, value in s3_server.aws_environment().items():  # the task's side (the specs' hand-off)
        monkeypatch.setenv(key, value)
    with PutBarrier(
        s3_server.endpoint, contested, release_if=lambda: table_lock_held(ledger_url, sink)
    ) as s3:
        make = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path, engine="submit")
        p, ledger = make(
            sink=sink, sink_format="delta", spark_conf=delta_s3a_conf(Endpoint(s3_server, s3.endpoint))
        )
        ledger.upgrade()
        produce(kafka_broker.bootstrap, topic_name, count=120, partitions=4)
        kafka = {"bootstrap.servers": kafka_broker.bootstrap}
        ingest = SparkKafkaBatchOperator(task_id="ingest", pipeline=p)
        replay = ReplayFailedRangesOperator(task_id="replay", pipeline=p)

        # batch 1 creates the table (version 0); batch 2's first attempt failed before its job
        first = planned(ledger, p, 1)
        ingest.run_and_mark(
            ledger, first, 1, kafka, token=ingest.claim(ledger, 1, replay=False), replay=False
        )
        failed = planned(ledger, p, 2)
        ledger.mark_failed(2, "its worker died", token=ingest.claim(ledger, 2, replay=False))
        scheduled = planned(ledger, p, 3)

        # the replay of batch 2 and the scheduled run's batch 3, side by side: both would commit version 1
        jobs = [
            (replay, failed, replay.claim(ledger, 2, replay=True), True),
            (ingest, scheduled, ingest.claim(ledger, 3, replay=False), False),
        ]
        errors: dict[int, BaseException] = {}

        def run(op: Any, plan: Any, token: str, is_replay: bool) -> None:
            try:
                op.run_and_mark(ledger, plan, 1, kafka, token=token, replay=is_replay)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors[plan.batch_id] = e

        threads = [threading.Thread(target=run, args=job) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
        assert not any(t.is_alive() for t in threads), "a batch's job did not end"

    table = Table(sink, s3_server.filesystem(), f"{s3_bucket}/table", {})
    commits = batch_commits(table)
    # every commit kept: three log entries, one per batch, and every record of the three batches
    assert len(delta_log(table)) == 3, [(c["batch_id"], c["attempt"]) for c in commits]
    assert sorted(c["batch_id"] for c in commits) == [1, 2, 3]
    assert Counter(json.loads(r["value"])["id"] for r in table_rows(table)) == Counter(range(120))
    assert not errors, {b: f"{type(e).__name__}: {e}" for b, e in errors.items()}
    assert [ledger.batch(b).status for b in (1, 2, 3)] == ["succeeded", "replayed", "succeeded"]
    # one PUT of version 1's entry: the second driver's job waited for the first one's commit
    assert s3.puts == {f"/{s3_bucket}/table/_delta_log/{1:020d}.json": 1}
    assert s3.released_by == ["release_if"]
    assert table.fs.get_file_info(f"{s3_bucket}/table/_delta_log").type == pafs.FileType.Directory
