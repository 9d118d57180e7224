"""Alembic environment of the ledger: runs on the connection (and inside the transaction) that
:func:`airflow_kafka_backpressure.ledger.migrate.upgrade` opened and locked."""

from alembic import context

from airflow_kafka_backpressure.ledger.migrate import VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "The ledger migrations run through `python -m airflow_kafka_backpressure.ledger upgrade`, "
        "not the alembic command line."
    )
context.configure(connection=connection, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
