"""The provider is discoverable by Airflow and its metadata matches Airflow's own schema."""

from __future__ import annotations

import importlib
import json
from importlib.metadata import distribution, entry_points
from pathlib import Path

import jsonschema

from airflow_kafka_backpressure.get_provider_info import get_provider_info


def _schema() -> dict:
    import airflow

    return json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())


def test_provider_info_validates_against_airflows_schema():
    jsonschema.validate(get_provider_info(), _schema())


def test_package_name_equals_the_distribution_and_the_entry_point_is_registered():
    info = get_provider_info()
    dist = distribution(info["package-name"])
    assert dist.metadata["Name"] == info["package-name"]
    eps = [ep for ep in entry_points(group="apache_airflow_provider") if ep.dist.name == dist.name]
    assert [ep.value for ep in eps] == ["airflow_kafka_backpressure.get_provider_info:get_provider_info"]


def test_every_listed_module_imports():
    info = get_provider_info()
    modules = [
        m
        for section in ("operators", "sensors", "hooks", "triggers")
        for entry in info.get(section, [])
        for m in entry["python-modules"]
    ]
    assert modules
    for m in modules:
        importlib.import_module(m)


def test_airflows_providers_manager_lists_the_provider():
    from airflow.providers_manager import ProvidersManager

    assert "airflow-provider-kafka-backpressure" in ProvidersManager().providers
