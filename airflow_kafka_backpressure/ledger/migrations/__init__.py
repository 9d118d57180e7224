"""Alembic migrations of the ledger schema (run by :mod:`airflow_kafka_backpressure.ledger.migrate`).

Revisions are frozen snapshots: they never import the current schema or repository code. Their
version table is ``kbp_alembic_version``, so a ledger that lives in Airflow's own metadata database
never touches Airflow's ``alembic_version``.
"""
