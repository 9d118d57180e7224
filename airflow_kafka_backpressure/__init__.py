"""Micro-batch Kafka ingestion on Spark, orchestrated by Airflow, with PID backpressure.

The pure control core lives in :mod:`airflow_kafka_backpressure.control`; everything that talks to
Airflow, Spark or Kafka is thin glue around it.
"""

__version__ = "0.1.0"
