"""Provider metadata, read by Airflow's providers manager (entry point ``apache_airflow_provider``).

Keep this module free of imports: Airflow loads it while starting up.
"""

from __future__ import annotations


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-kafka-backpressure",
        "name": "Kafka Backpressure",
        "description": (
            "Micro-batch Kafka ingestion on Spark, orchestrated by Airflow, with Spark Streaming's "
            "PID backpressure and streaming dynamic allocation moved into the orchestrator."
        ),
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": "Kafka Backpressure",
                "external-doc-url": "https://github.com/airflow-provider-kafka-backpressure",
                "tags": ["apache", "kafka", "spark"],
            }
        ],
        "operators": [
            {
                "integration-name": "Kafka Backpressure",
                "python-modules": [
                    "airflow_kafka_backpressure.operators.plan",
                    "airflow_kafka_backpressure.operators.ingest",
                    "airflow_kafka_backpressure.operators.record",
                    "airflow_kafka_backpressure.operators.scale",
                    "airflow_kafka_backpressure.operators.replay",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Kafka Backpressure",
                "python-modules": ["airflow_kafka_backpressure.sensors.failed_ranges"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Kafka Backpressure",
                "python-modules": [
                    "airflow_kafka_backpressure.hooks.kafka_offsets",
                    "airflow_kafka_backpressure.hooks.ledger",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": "Kafka Backpressure",
                "python-modules": ["airflow_kafka_backpressure.triggers.failed_ranges"],
            }
        ],
    }
