"""Every module of the package imports. A name removed from one module but still read from it by
another at import time (the plugin's API did that once after a lint fix) fails here, in seconds,
rather than in the Airflow components that load the plugin."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import airflow_kafka_backpressure

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(airflow_kafka_backpressure.__path__, "airflow_kafka_backpressure.")
    # scripts run by a tool, not imported: ``python -m`` entry points, Alembic's environment
    if not m.name.endswith(("__main__", ".migrations.env"))
)


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports(module):
    importlib.import_module(module)
