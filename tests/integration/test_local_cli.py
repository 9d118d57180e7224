"""The embedded broker and the demo producer from the command line, as the demo uses them."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from airflow_kafka_backpressure.local.broker import free_port


def test_broker_and_producer_command_lines(tmp_path):
    port = free_port()
    broker = subprocess.Popen(
        [sys.executable, "-m", "airflow_kafka_backpressure.local", "broker", "--port", str(port),
         "--work-dir", str(tmp_path / "kafka")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        line = broker.stdout.readline()
        assert re.search(rf"listening on 127\.0\.0\.1:{port}, pid \d+", line), line
        bootstrap = f"127.0.0.1:{port}"
        out = subprocess.run(
            [sys.executable, "-m", "airflow_kafka_backpressure.local", "produce", "--bootstrap", bootstrap,
             "--topic", "cli-demo", "--partitions", "3", "--count", "30", "--start-id", "100"],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout
        assert "created topic cli-demo with 3 partitions" in out
        assert "produced 30 records to cli-demo (ids 100..129)" in out
        with KafkaOffsets({"bootstrap.servers": bootstrap}) as k:
            tps = k.partitions(["cli-demo"])
            assert sorted(k.latest_offsets(tps).values()) == [10, 10, 10]
    finally:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=30) == 0
