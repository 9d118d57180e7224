"""The embedded broker and the demo producer from the command line, as the demo uses them."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys

from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from kbp_local.process import free_port


def test_broker_and_producer_command_lines(tmp_path):
    port = free_port()
    broker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kbp_local",
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
                "kbp_local",
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
        [sys.executable, "-m", "kbp_local", "broker", "--tansu", "--port", str(port)],
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
            "kbp_local",
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


def _local(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbp_local", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_scram_user_and_its_properties_file_as_the_compose_stack_makes_them(kafka_broker, tmp_path):
    """docker/compose.yaml's kafka-users and demo-producer: a SCRAM user created through the Admin
    API, its client properties written to a 0600 file (the password never on a command line), the
    producer reading through SASL_SSL with that file; a re-run keeps the password."""
    client = tmp_path / "client" / "client.json"
    user = [
        "kafka-user",
        "--admin-bootstrap",
        kafka_broker.bootstrap,
        "--bootstrap",
        kafka_broker.secured_bootstrap,
        "--ca",
        str(kafka_broker.ca_path),
        "--username",
        "cli-user",
        "--properties-file",
        str(client),
    ]
    first = _local(*user)
    assert first.returncode == 0, first.stderr
    props = json.loads(client.read_text())
    assert stat.S_IMODE(client.stat().st_mode) == 0o600
    assert props["security.protocol"] == "SASL_SSL" and props["sasl.username"] == "cli-user"
    assert props["sasl.password"] not in first.stdout + first.stderr

    again = _local(*user)
    assert again.returncode == 0, again.stderr
    assert json.loads(client.read_text())["sasl.password"] == props["sasl.password"]

    out = _local(
        "produce",
        "--properties-file",
        str(client),
        "--topic",
        "cli-secured",
        "--partitions",
        "2",
        "--count",
        "20",
    )
    assert out.returncode == 0, out.stderr
    assert "produced 20 records to cli-secured (ids 0..19)" in out.stdout
    with KafkaOffsets(props) as k:
        ends = k.latest_offsets(k.partitions(["cli-secured"]))
    assert sum(ends.values()) == 20

    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({**props, "sasl.password": "not-the-password"}))
    refused = _local(
        "produce",
        "--properties-file",
        str(wrong),
        "--topic",
        "cli-secured",
        "--partitions",
        "2",
        "--count",
        "1",
    )
    assert refused.returncode != 0
    assert "produced" not in refused.stdout
