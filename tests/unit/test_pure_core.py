"""The control core and the value objects import no Airflow, Spark or Kafka (checked in a fresh
interpreter, so nothing imported by other tests can hide an import)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE_MODULES = [
    "airflow_kafka_backpressure.control.pid",
    "airflow_kafka_backpressure.control.allocation",
    "airflow_kafka_backpressure.control.scaling",
    "airflow_kafka_backpressure.control.scala",
    "airflow_kafka_backpressure.control.cost",
    "airflow_kafka_backpressure.control.cost_mode",
    "airflow_kafka_backpressure.control.controller",
    "airflow_kafka_backpressure.control.modes",
    "airflow_kafka_backpressure.control.modes.base",
    "airflow_kafka_backpressure.control.modes.spark",
    "airflow_kafka_backpressure.control.modes.cost",
    "airflow_kafka_backpressure.sim.simulate",
    "airflow_kafka_backpressure.sim.scenarios",
    "airflow_kafka_backpressure.sim.plot",
    "airflow_kafka_backpressure.sim.history",
    "airflow_kafka_backpressure.batch.models",
    "airflow_kafka_backpressure.config.settings",
    "airflow_kafka_backpressure.config.pipeline",
    "airflow_kafka_backpressure.config.reference",
    "airflow_kafka_backpressure.kafka.config",
    # the range reader runs in plain Python too (the bench); Kafka clients are imported per read
    "airflow_kafka_backpressure.spark.range_split",
    "airflow_kafka_backpressure.spark.range_reader",
]
FORBIDDEN = ("airflow", "pyspark", "py4j", "kafka", "sqlalchemy")


@pytest.mark.parametrize("module", PURE_MODULES)
def test_module_imports_no_airflow_spark_or_kafka(module):
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        f"print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"{module} pulls in {out}"


def test_the_control_core_does_not_import_the_simulator():
    """The simulator (``sim/``) uses the control core, never the reverse (DESIGN.md's layout)."""
    core = [m for m in PURE_MODULES if m.startswith("airflow_kafka_backpressure.control.")]
    code = (
        "import sys, importlib\n"
        f"for m in {core!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.startswith('airflow_kafka_backpressure.sim')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]", out
