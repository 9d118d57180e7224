"""Airflow operations on a live pipeline under a real scheduler: an old, finished ingest run
cleared (re-run) while newer batches were written after it, and an ingest backfill."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from .conftest import STEP_TIMEOUT_S
from .harness import wait_for


def test_a_cleared_old_run_rewrites_its_batch_once(rig):
    p = rig.pipeline("cleared_run")
    rig.produce(p, 300, 0)
    rig.start(p)
    ledger = rig.ledger(p)
    wait_for("a first batch", lambda: ledger.recent_batches(p.name, 10, ["succeeded"]), STEP_TIMEOUT_S, every_s=2,
             transient=(Exception,))  # the ledger is created by the first task
    rig.produce(p, 100, 300)
    outcome, _ = rig.recover(p)  # batches written, then the pipeline stopped
    assert outcome.ok, outcome.summary()
    first = min((b for b in ledger.recent_batches(p.name, 100) if b.records), key=lambda b: b.batch_id)
    newer = [b.batch_id for b in ledger.recent_batches(p.name, 100) if b.batch_id > first.batch_id and b.records]
    assert newer, "the scenario needs batches after the cleared one"

    rig.start(p)
    rig.standalone.clear_run(p.ingest_dag_id, first.run_id)
    wait_for(
        f"batch {first.batch_id} to be rewritten",
        lambda: ledger.batch(first.batch_id).attempts > first.attempts and ledger.batch(first.batch_id).status == "succeeded",
        STEP_TIMEOUT_S, every_s=2,
    )
    rig.assert_recovered(p, 400, "cleared run")


def test_an_ingest_backfill_writes_nothing_twice(rig):
    p = rig.pipeline("backfill")
    rig.produce(p, 300, 0)
    rig.start(p)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    created = rig.standalone.airflow(
        "backfill", "create", "--dag-id", p.ingest_dag_id,
        "--from-date", start.isoformat(), "--to-date", (start + timedelta(seconds=4 * p.batch_interval_s)).isoformat(),
    )
    output = created.stdout + created.stderr
    if created.returncode != 0:  # refused: it must say why and point at the replay DAG
        assert p.replay_dag_id in output, output[-2000:]
    rig.produce(p, 100, 300)
    rig.assert_recovered(p, 400, f"backfill ({'refused' if created.returncode else 'ran'})")
