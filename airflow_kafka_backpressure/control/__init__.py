"""The pure control core: Spark Streaming's backpressure and dynamic-allocation math.

Nothing in this package imports Airflow, Spark or Kafka; it works on plain numbers and the value
objects of :mod:`airflow_kafka_backpressure.batch.models`.
"""
