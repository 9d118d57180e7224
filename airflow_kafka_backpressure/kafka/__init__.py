"""Everything that talks to a Kafka broker from an Airflow worker, and the client settings shared
with the Spark job.

* :mod:`.config` — the ``kafka`` connection's properties, validated, translated for kafka-python,
  confluent-kafka and Spark's ``format("kafka")`` (``kafka.*`` options), redacted for messages;
* :mod:`.clients` — kafka-python clients that do not outlive a failed start;
* :mod:`.offsets` — topics, partitions, earliest/latest/committed offsets and the group commit,
  every call bounded in time;
* :mod:`.lag` — consumer lag against thresholds (the lag sensor, its trigger, the monitoring page).

No Airflow or Spark imports here: the Airflow hooks wrap these, and the Spark job imports
:mod:`.config`. (Absolute imports keep ``import kafka`` meaning kafka-python inside this package.)
"""
