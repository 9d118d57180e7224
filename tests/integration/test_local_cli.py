"""The embedded broker and the demo producer from the command line, as the demo uses them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from airflow_kafka_backpressure.local.broker import free_port


def test_broker_and_producer_command_lines(tmp_path):
    port = free_port()
    broker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "airflow_kafka_backpressure.local",
            "broker",
            "--port",
            str(port),
            "--work-dir",
            str(tmp_path / "kafka"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = broker.stdout.readline()
        assert re.search(rf"listening on 127\.0\.0\.1:{port}, pid \d+", line), line
        bootstrap = f"127.0.0.1:{port}"
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "airflow_kafka_backpressure.local",
                "produce",
                "--bootstrap",
                bootstrap,
                "--topic",
                "cli-demo",
                "--partitions",
                "3",
                "--count",
                "30",
                "--start-id",
                "100",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        assert "created topic cli-demo with 3 partitions" in out
        assert "produced 30 records to cli-demo (ids 100..129)" in out
        with KafkaOffsets({"bootstrap.servers": bootstrap}) as k:
            tps = k.partitions(["cli-demo"])
            assert sorted(k.latest_offsets(tps).values()) == [10, 10, 10]
    finally:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=30) == 0


def test_the_tansu_broker_can_still_be_chosen(tmp_path):
    """``broker --tansu``: the in-memory Kafka-protocol broker, for those who choose it on purpose."""
    port = free_port()
    broker = subprocess.Popen(
        [sys.executable, "-m", "airflow_kafka_backpressure.local", "broker", "--tansu", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = broker.stdout.readline()
        assert re.search(rf"\(Tansu\) listening on 127\.0\.0\.1:{port}, pid \d+", line), line
        with KafkaOffsets({"bootstrap.servers": f"127.0.0.1:{port}"}) as k:
            assert isinstance(k.topics(), (list, set, tuple, frozenset))
    finally:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=30) == 0


def test_spark_conf_writes_the_connector_jars_into_spark_defaults(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_kafka_backpressure.local",
            "spark-conf",
            "--dir",
            str(tmp_path / "conf"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert f"SPARK_CONF_DIR={tmp_path / 'conf'}" in out
    (line,) = (tmp_path / "conf" / "spark-defaults.conf").read_text().splitlines()
    key, jars = line.split(" ", 1)
    names = sorted(os.path.basename(j) for j in jars.split(","))
    assert key == "spark.jars" and all(os.path.exists(j) for j in jars.split(","))
    assert [n for n in names if n.startswith(("spark-sql-kafka-0-10_2.13-", "kafka-clients-"))], names
    assert not [n for n in names if n.startswith(("scala-library", "hadoop-client"))], (
        names
    )  # pyspark ships those
