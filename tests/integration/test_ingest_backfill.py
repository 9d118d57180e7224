"""A backfill of the ingest DAG is refused: Airflow's backfill creates runs of run type ``backfill``
that run beside the scheduled ones (``max_active_runs`` does not bound them), and an ingest run plans
the next offsets, not its date's. Real Airflow (SQLite metadata DB): the backfill is created by
Airflow's own backfill code and its first run's plan task is executed by the same in-process
runner ``dag.test()`` uses; nothing is planned, and the failure points at the replay DAG."""

from __future__ import annotations

from datetime import timedelta

import pytest

from . import airflow_harness as af


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


def _sync_dags_to_db() -> None:
    """Parse the DAGs folder into the metadata DB, as the DAG processor does."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
        sync_bag_to_db(bag, bundle.name, bundle.version)


def _run_first_task(dag, dag_run_id: str, task_id: str):
    """Schedule the run's first task and run it in process (Airflow's own dag.test runner)."""
    from airflow.models import DagRun
    from airflow.sdk.definitions.dag import _run_task
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    with create_session() as session:
        dr = session.query(DagRun).filter_by(dag_id=dag.dag_id, run_id=dag_run_id).one()
        dr.state = DagRunState.RUNNING
        dr.dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
        session.commit()
        schedulable, _ = dr.update_state(session=session)
        (ti,) = [t for t in schedulable if t.task_id == task_id]
        ti.try_number += 1
        ti.state = TaskInstanceState.SCHEDULED
        session.commit()
        session.refresh(ti)
        session.expunge(ti)
    _run_task(ti=ti, task=dag.get_task(task_id))
    return ti


def test_a_backfill_of_the_ingest_dag_is_refused_pointing_at_the_replay_dag(
    kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db, capfd
):
    from airflow.models import DagRun
    from airflow.models.backfill import _create_backfill
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType

    p, ledger = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path)()
    _sync_dags_to_db()
    dag = af.load_dag(p.ingest_dag_id)
    start = af.BASE_DATE
    _create_backfill(
        dag_id=p.ingest_dag_id,
        from_date=start,
        to_date=start + timedelta(seconds=2 * p.batch_interval_s),
        max_active_runs=2,
        reverse=False,
        dag_run_conf=None,
        triggering_user_name="test",
    )
    with create_session() as session:
        runs = session.query(DagRun).filter_by(dag_id=p.ingest_dag_id).order_by(DagRun.logical_date).all()
        assert runs and all(r.run_type == DagRunType.BACKFILL_JOB for r in runs)
        run_id = runs[0].run_id

    capfd.readouterr()
    ti = _run_first_task(dag, run_id, "plan")
    out, err = capfd.readouterr()  # the task's log: the runner writes it to the process's output
    assert str(ti.state) in ("failed", "TaskInstanceState.FAILED"), ti.state
    ledger.create_all()
    assert ledger.get_plan(p.name, run_id) is None and ledger.recent_batches(p.name) == []  # nothing planned
    logged = out + err
    assert "does not take backfills" in logged and p.replay_dag_id in logged, logged[-3000:]
