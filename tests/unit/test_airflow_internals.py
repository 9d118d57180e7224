"""The Airflow internals the package uses are pinned: each still exists and behaves as relied on,
and no other module imports an ``airflow._*`` module (see ``plugins/internals.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import airflow_kafka_backpressure
from airflow_kafka_backpressure.plugins.internals import redact_variable

PACKAGE = Path(airflow_kafka_backpressure.__file__).parent
REPO = PACKAGE.parent
INTERNAL = re.compile(r"^\s*(from|import)\s+airflow\._\w+", re.M)


def test_variable_redaction_hides_secrets_by_key_name_as_the_variables_api_does():
    assert redact_variable("hunter22", "kbp.demo.api_password") == "***"
    nested = redact_variable(
        {"gains": {"proportional": 1.0}, "sasl": {"password": "hunter22"}}, "kbp.demo.settings"
    )
    assert nested == {"gains": {"proportional": 1.0}, "sasl": {"password": "***"}}
    assert redact_variable({"rate_limit": 321}, "kbp.demo.controller_state") == {"rate_limit": 321}


def test_no_other_module_imports_airflow_internals():
    offenders = [
        str(path.relative_to(REPO))
        for root in (PACKAGE, REPO / "dags")
        for path in root.rglob("*.py")
        if path.name != "internals.py" and INTERNAL.search(path.read_text())
    ]
    assert offenders == []
