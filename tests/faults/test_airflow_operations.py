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
    wait_for(
        "a first batch",
        lambda: ledger.recent_batches(p.name, 10, ["succeeded"]),
        STEP_TIMEOUT_S,
        every_s=2,
        transient=(Exception,),
    )  # the ledger is created by the first task
    rig.produce(p, 100, 300)
    outcome, _ = rig.recover(p)  # batches written, then the pipeline stopped
    assert outcome.ok, outcome.summary()
    first = min((b for b in ledger.recent_batches(p.name, 100) if b.records), key=lambda b: b.batch_id)
    newer = [
        b.batch_id for b in ledger.recent_batches(p.name, 100) if b.batch_id > first.batch_id and b.records
    ]
    assert newer, "the scenario needs batches after the cleared one"

    rig.start(p)
    rig.standalone.clear_run(p.ingest_dag_id, first.run_id)
    wait_for(
        f"batch {first.batch_id} to be rewritten",
        lambda: (
            ledger.batch(first.batch_id).attempts > first.attempts
            and ledger.batch(first.batch_id).status == "succeeded"
        ),
        STEP_TIMEOUT_S,
        every_s=2,
    )
    rig.assert_recovered(p, 400, "cleared run")


def test_an_ingest_backfill_writes_nothing_twice(rig):
    """The backfill is accepted by Airflow; each of its runs fails at ``plan`` (before any offset is
    taken) with a message that points at the replay DAG, and the scheduled runs go on."""
    p = rig.pipeline("backfill")
    rig.produce(p, 300, 0)
    rig.start(p)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    created = rig.standalone.airflow(
        "backfill",
        "create",
        "--dag-id",
        p.ingest_dag_id,
        "--from-date",
        start.isoformat(),
        "--to-date",
        (start + timedelta(seconds=4 * p.batch_interval_s)).isoformat(),
    )
    assert created.returncode == 0, (created.stdout + created.stderr)[-2000:]

    def backfill_runs() -> list[dict]:
        rig.standalone.revive_scheduler()  # Airflow's scheduler can die of creating these runs (harness.py)
        return [r for r in rig.standalone.dag_runs(p.ingest_dag_id) if r.get("run_type") == "backfill"]

    wait_for(
        "the backfill's runs to end",
        lambda: backfill_runs() and all(r["state"] in ("success", "failed") for r in backfill_runs()),
        STEP_TIMEOUT_S,
        every_s=3,
    )
    for run in backfill_runs():
        assert run["state"] == "failed", run
        states = {
            ti["task_id"]: ti["state"]
            for ti in rig.standalone.task_instances(p.ingest_dag_id, run["dag_run_id"])
        }
        assert states["plan"] == "failed" and states["ingest"] in ("upstream_failed", None), states
        log = rig.standalone.task_log(p.ingest_dag_id, run["dag_run_id"], "plan")
        assert "does not take backfills" in log and p.replay_dag_id in log, log[-2000:]
    rig.produce(p, 100, 300)
    outcome = rig.assert_recovered(p, 400, "backfill (refused at plan)")
    assert all(b.run_id and "backfill" not in b.run_id for b in rig.ledger(p).recent_batches(p.name, 100)), (
        outcome
    )
