"""This provider's connection types as Airflow lists them (``airflow providers hooks`` /
``behaviours`` / ``widgets``, what the connection form uses), with and without the official
Kafka provider installed next to it.

Each check runs the real ``airflow`` CLI in a subprocess (a fresh providers manager). The official
provider (apache-airflow-providers-apache-kafka, pinned in constraints.txt) is installed by pip into
a folder under ``.tmp/`` that only the second subprocess sees on its PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
OFFICIAL = "apache-airflow-providers-apache-kafka"


def _constraint(name: str) -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.lower().startswith(name.lower() + "=="):
            return line
    raise AssertionError(f"{name} is not pinned in constraints.txt")


@pytest.fixture(scope="session")
def official_kafka_overlay() -> Path:
    """A folder holding the official Kafka provider and confluent-kafka (as pinned), for PYTHONPATH."""
    folder = REPO / ".tmp" / ("overlay-" + _constraint(OFFICIAL).replace("==", "-"))
    if not (folder / "airflow" / "providers" / "apache" / "kafka").is_dir():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
                str(folder),
                _constraint(OFFICIAL),
                _constraint("confluent-kafka"),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (
            f"pip could not install the official Kafka provider: {done.stderr[-2000:]}"
        )
    return folder


def _airflow(
    *args: str, overlay: Path | None = None, env: dict[str, str] | None = None
) -> tuple[object, str]:
    environ = {**os.environ, **(env or {})}
    if overlay is not None:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(overlay), environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [AIRFLOW, *args], capture_output=True, text=True, env=environ, cwd=REPO / ".tmp", timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # unit-test mode logs a line to stdout first: the JSON document is the last line
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout + done.stderr


def _by_type(hooks: list[dict]) -> dict[str, dict]:
    return {h["connection_type"]: h for h in hooks}


def test_without_the_official_provider_both_types_are_ours_with_their_forms():
    hooks, log = _airflow("providers", "hooks", "-o", "json")
    by_type = _by_type(hooks)
    assert by_type["kbp_ledger"]["class"] == "airflow_kafka_backpressure.hooks.ledger.LedgerHook"
    assert by_type["kbp_ledger"]["hook_name"] == "Kafka Backpressure ledger (SQL database)"
    assert by_type["kafka"]["class"] == "airflow_kafka_backpressure.hooks.kafka_offsets.KafkaOffsetsHook"
    assert by_type["kafka"]["package_name"] == "airflow-provider-kafka-backpressure"
    behaviours, _ = _airflow("providers", "behaviours", "-o", "json")
    assert {"kafka", "kbp_ledger", "schema_registry"} <= {b["field_behaviours"] for b in behaviours}
    widgets, _ = _airflow("providers", "widgets", "-o", "json")
    ours = {
        w["connection_parameter_name"]
        for w in widgets
        if w["package_name"] == "airflow-provider-kafka-backpressure"
    }
    assert ours == {
        "extra__kbp_ledger__sqlalchemy_url",
        "extra__kbp_ledger__driver",
        *(
            f"extra__schema_registry__{f}"
            for f in ("ca_location", "certificate_location", "key_location", "timeout_s")
        ),
    }
    registry = by_type["schema_registry"]
    assert registry["class"] == "airflow_kafka_backpressure.hooks.schema_registry.SchemaRegistryHook"
    assert registry["package_name"] == "airflow-provider-kafka-backpressure"
    listed, _ = _airflow("providers", "list", "-o", "json")
    assert "airflow-provider-kafka-backpressure" in {p["package_name"] for p in listed}
    assert "already registered" not in log


def test_with_the_official_provider_kafka_stays_its_own(official_kafka_overlay: Path):
    hooks, log = _airflow("providers", "hooks", "-o", "json", overlay=official_kafka_overlay)
    by_type = _by_type(hooks)
    assert by_type["kafka"]["package_name"] == OFFICIAL
    assert by_type["kafka"]["class"] == "airflow.providers.apache.kafka.hooks.base.KafkaBaseHook"
    assert by_type["kbp_ledger"]["class"] == "airflow_kafka_backpressure.hooks.ledger.LedgerHook"
    assert "already registered" not in log  # neither provider steps on the other


_COMPAT = """
import json, sys
from airflow.sdk import BaseHook
from airflow_kafka_backpressure.hooks.kafka_offsets import KafkaOffsetsHook
official = BaseHook.get_connection("kafka_compat").get_hook()
print(json.dumps({"official": [type(official).__name__, *official.test_connection()],
                  "ours": list(KafkaOffsetsHook("kafka_compat", timeout_s=5).test_connection())}))
"""


def test_one_kafka_connection_serves_the_official_hook_and_ours(official_kafka_overlay: Path, kafka_broker):
    env = {
        "AIRFLOW_CONN_KAFKA_COMPAT": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_broker.bootstrap}}
        ),
        "PYTHONPATH": str(official_kafka_overlay),
    }
    done = subprocess.run(
        [sys.executable, "-c", _COMPAT],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=REPO / ".tmp",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["official"][:2] == ["KafkaBaseHook", True]
    assert result["ours"][0] is True and kafka_broker.bootstrap in result["ours"][1]
