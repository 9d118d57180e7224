"""Processes killed mid-batch under a real scheduler: the Spark driver, the Airflow task after its
batch's output was swapped into the sink but before the ledger marked it, the plan task after it
recorded its plan, and the scheduler."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from .conftest import STEP_TIMEOUT_S
from .dags.kbp_faults_lag_watch import DAG_ID as LAG_WATCH_DAG_ID
from .dags.kbp_faults_lag_watch import LAG_WATCH_TIMEOUT_S
from .harness import command_lines_holding, files_holding, wait_for


def test_sigkill_of_the_spark_driver_mid_batch_is_replayed_exactly_once(rig):
    """Also issue 20's search under a real scheduler: the pipelines read Kafka through SASL_SSL as a
    user whose password is planted (tests/faults/conftest.py). It is on no command line while the
    batch runs, and after the kill and the replay in no file of the installation: the logs of the
    scheduler, triggerer, DAG processor and API server (standalone.log), the task logs, Airflow's
    database, the ledger, the sink and its hand-off folders, Spark's local folders. Meanwhile a
    deferrable lag sensor on the pipeline (tests/faults/dags/) reads Kafka as that user in the
    triggerer: it must end skipped at its timeout, not failed, so its trigger authenticated."""
    p = rig.pipeline("driver_kill")
    rig.produce(p, 300, 0)
    lag_watch = rig.standalone.trigger_run(LAG_WATCH_DAG_ID)
    rig.start(p)
    app = f"kbp-{p.name}-batch-"
    driver = rig.wait_for_spark(p)[0]
    on_command_lines: set[str] = set()
    deadline = time.monotonic() + 4  # the JVM is up and running the job
    while time.monotonic() < deadline:
        on_command_lines.update(command_lines_holding(rig.kafka_password))
        time.sleep(0.2)
    killed_batch = int(" ".join(driver.cmdline()).split(app, 1)[1].split()[0])
    driver.send_signal(signal.SIGKILL)
    rig.produce(p, 100, 300)

    rig.assert_recovered(p, 400, "driver kill")
    watched = wait_for(
        "the lag sensor to end",
        lambda: (
            rig.standalone.task_state(LAG_WATCH_DAG_ID, lag_watch, "lag") in ("skipped", "failed", "success")
            and rig.standalone.task_state(LAG_WATCH_DAG_ID, lag_watch, "lag")
        ),
        LAG_WATCH_TIMEOUT_S + STEP_TIMEOUT_S,
        every_s=2,
    )
    assert watched == "skipped", rig.standalone.task_log(LAG_WATCH_DAG_ID, lag_watch, "lag")[-3000:]
    killed = rig.ledger(p).batch(killed_batch)
    assert killed.status in ("replayed", "succeeded"), killed
    assert killed.attempts >= 2, killed  # the killed attempt, then the one that wrote it
    assert not on_command_lines, on_command_lines
    # the broker's and PostgreSQL's own storage aside (the broker keeps the user's salted SCRAM keys)
    holding = files_holding(rig.root, rig.kafka_password, skip=(rig.root / "kafka", rig.root / "pg"))
    assert not holding, f"the planted Kafka password is in {holding}"
    assert (rig.standalone.home / "standalone.log").stat().st_size > 0  # searched: the components' logs


def test_sigkill_of_the_task_after_the_sink_swap_leaves_one_copy(rig):
    p = rig.pipeline("swap_kill")
    ledger = rig.ledger(p)

    def written_not_marked(batch_id: int) -> None:
        assert ledger.batch(batch_id).status == "running"  # written, not marked
        assert (Path(p.sink) / f"batch_id={batch_id}" / "_manifest.json").exists()  # swapped in

    batch_id = kill_at_seam(rig, p, p.name, "a batch paused after its sink commit", written_not_marked)

    rig.assert_recovered(p, 400, "task kill after swap")
    assert ledger.batch(batch_id).status == "replayed", ledger.batch(batch_id)


def test_sigkill_of_the_scheduler_mid_batch_costs_no_record(rig):
    """Airflow's scheduler dies while a batch's Spark job runs (``airflow standalone`` does not
    restart it); a new scheduler takes over, its executor launches the next batches, and every
    record is in the sink once."""
    p = rig.pipeline("scheduler_kill")
    rig.produce(p, 300, 0)
    rig.start(p)
    app = f"kbp-{p.name}-batch-"
    in_flight = rig.wait_for_spark(p)
    assert rig.standalone.kill_schedulers(), "no airflow scheduler process found"
    assert rig.standalone.revive_scheduler(), "the killed scheduler still counts as running"
    rig.produce(p, 100, 300)
    # the new scheduler's tasks run in its own session: the harness must still see their drivers
    wait_for(
        "a Spark driver launched under the new scheduler",
        lambda: [d for d in rig.standalone.spark_drivers(app) if d.pid not in {x.pid for x in in_flight}],
        STEP_TIMEOUT_S,
        every_s=0.5,
    )

    rig.assert_recovered(p, 400, "scheduler kill")


def test_sigkill_of_the_plan_task_after_it_recorded_the_plan_costs_no_record(rig):
    """Issue 21, item 4 under a real scheduler: the plan task dies right after recording its batch, so
    no ingest task claims it. Its planned lease expires and the replay DAG takes it over (it waited
    24 hours before); later batches go on meanwhile and the group commits once it is written."""
    p = rig.pipeline("plan_kill")
    ledger = rig.ledger(p)

    def planned(batch_id: int) -> None:
        assert ledger.batch(batch_id).status == "planned"

    batch_id = kill_at_seam(
        rig, p, f"{p.name}.after_plan", "a plan task paused after recording its plan", planned
    )

    rig.assert_recovered(p, 400, "plan task kill")
    assert ledger.batch(batch_id).status == "replayed", ledger.batch(batch_id)


def kill_at_seam(rig, p, name: str, what: str, check) -> int:
    """Arm the suite's pause ``name`` (tests/faults/pause_point.py), let 300 records in, wait until a
    task pauses there, ``check(batch_id)``, SIGKILL that task and produce 100 more; the batch id."""
    (rig.pause_dir / f"{name}.arm").touch()
    rig.produce(p, 300, 0)
    rig.start(p)
    paused = rig.pause_dir / f"{name}.paused"
    wait_for(what, paused.exists, STEP_TIMEOUT_S, every_s=0.5)
    pid, batch_id = (int(x) for x in paused.read_text().split())
    check(batch_id)
    os.kill(pid, signal.SIGKILL)
    rig.produce(p, 100, 300)
    return batch_id
