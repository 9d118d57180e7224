"""The controller simulator: a queue model of the pipeline under Airflow (simulate), the shipped
scenarios and the bench's criteria (scenarios), scenarios rebuilt from a pipeline's ledger
(history) and the SVG plot (plot). It uses the pure control core (``control/``), never the reverse.

Pure: no Airflow, Spark or Kafka import.
"""
