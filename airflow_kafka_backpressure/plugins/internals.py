"""The only Airflow internals this package uses, each with the reason no public API does the job.

``tests/unit/test_airflow_internals.py`` imports every one of them and checks its behaviour, so an
Airflow upgrade that moves or changes one fails that test (not a user's page), and it checks that no
other module of the package imports an ``airflow._*`` module.
"""

from __future__ import annotations

from typing import Any


def redact_variable(value: Any, key: str) -> Any:
    """``value`` with secrets hidden exactly as Airflow's Variables API hides them (by the key's name,
    ``[core] sensitive_var_conn_names``, and every value registered with the secrets masker).

    PINNED INTERNAL: ``airflow._shared.secrets_masker.redact``. Airflow 3.3 has no public redaction
    API for server-side code: ``airflow.sdk.log.mask_secret`` only *registers* secrets, and the
    SDK's ``redact`` lives in ``airflow.sdk._shared`` (internal as well, and the task-side masker, not
    the API server's). This is the function Airflow's own REST API applies to Variable values
    (``airflow.api_fastapi.core_api.datamodels.variables.VariableResponse``); the page shows
    Variables, so it must hide the same things. It moved once already (3.0:
    ``airflow.sdk.execution_time.secrets_masker``, now a deprecated shim).
    """
    from airflow._shared.secrets_masker import redact

    return redact(value, key)
