"""The provider is discoverable by Airflow and its metadata matches Airflow's own schema."""

from __future__ import annotations

import importlib
import json
from importlib.metadata import distribution, entry_points
from pathlib import Path

import jsonschema
import pytest

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


def _yaml_schema() -> dict:
    import airflow

    return json.loads((Path(airflow.__file__).parent / "provider.yaml.schema.json").read_text())


@pytest.mark.parametrize("official_kafka", [False, True])
def test_both_variants_validate_and_declare_forms_airflow_accepts(official_kafka):
    from airflow_kafka_backpressure.get_provider_info import provider_info, ui_field_behaviour

    info = provider_info(official_kafka)
    jsonschema.validate(info, _schema())
    # The stricter provider.yaml schema describes the form keys (conn-fields, ui-field-behaviour).
    connection_schema = {
        **_yaml_schema()["properties"]["connection-types"],
        "definitions": _yaml_schema().get("definitions", {}),
    }
    jsonschema.validate(info["connection-types"], connection_schema)
    declared = [c["connection-type"] for c in info["connection-types"]]
    ours = ["kbp_ledger", "schema_registry"]
    assert declared == (ours if official_kafka else [*ours, "kafka"])
    import airflow

    behaviour_schema = json.loads(
        (Path(airflow.__file__).parent / "customized_form_field_behaviours.schema.json").read_text()
    )
    for conn_type in declared:
        jsonschema.validate(ui_field_behaviour(conn_type), behaviour_schema)


def test_each_declared_hook_has_the_declared_type_and_form():
    from airflow_kafka_backpressure.get_provider_info import provider_info

    for entry in provider_info(official_kafka=False)["connection-types"]:
        module, _, name = entry["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), name)
        assert hook.conn_type == entry["connection-type"]
        assert hook.hook_name == entry["hook-name"]
        declared = entry["ui-field-behaviour"]
        assert hook.get_ui_field_behaviour() == {
            "hidden_fields": declared["hidden-fields"],
            "relabeling": declared["relabeling"],
            "placeholders": declared["placeholders"],
        }
        assert callable(getattr(hook, "test_connection", None))


def test_kafka_is_left_to_the_official_provider_exactly_when_it_is_installed():
    from importlib.metadata import PackageNotFoundError

    from airflow_kafka_backpressure.get_provider_info import OFFICIAL_KAFKA_PROVIDER

    try:
        distribution(OFFICIAL_KAFKA_PROVIDER)
        installed = True
    except PackageNotFoundError:
        installed = False
    declared = [c["connection-type"] for c in get_provider_info()["connection-types"]]
    assert ("kafka" in declared) is not installed
