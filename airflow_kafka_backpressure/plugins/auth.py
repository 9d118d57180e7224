"""Who may see what on the monitoring page: Airflow's own authentication and auth manager.

A mounted FastAPI app gets no login check from Airflow, so every route of the app depends on
:func:`authenticated_user`: Airflow's ``get_user`` (bearer token, else the UI's ``_token`` cookie),
as Airflow's plugin documentation shows for plugin apps. A pipeline's data also needs read access
to the runs of its ingest DAG (``kbp_ingest_<pipeline>``, the auth manager's ``is_authorized_dag``),
and Variables are shown only to users the auth manager lets read them (``is_authorized_variable``).

Airflow modules are imported inside the functions: Airflow loads plugins in every component, and
only the API server serves this app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

if TYPE_CHECKING:
    from ..ledger import Ledger

_bearer = HTTPBearer(auto_error=False)


async def authenticated_user(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
) -> Any:
    """The user of the request, resolved exactly as Airflow's core API does (bearer token, else the
    ``_token`` cookie of the UI). Raises 401 without a token, 401/403 for an expired/invalid one."""
    from airflow.api_fastapi.core_api.security import get_user

    return await get_user(request, _oauth_token=None, bearer_credentials=credentials)


def _auth_manager() -> Any:
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager()


def ingest_dag_id(pipeline: str) -> str:
    """The ingest DAG of a pipeline (``PipelineConfig.ingest_dag_id``); its run access guards the page."""
    return f"kbp_ingest_{pipeline}"


def can_read_pipeline(user: Any, pipeline: str) -> bool:
    """May the user read the runs of the pipeline's ingest DAG (batches are its runs)?"""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return bool(
        _auth_manager().is_authorized_dag(
            method="GET",
            access_entity=DagAccessEntity.RUN,
            details=DagDetails(id=ingest_dag_id(pipeline)),
            user=user,
        )
    )


def can_read_variable(user: Any, key: str) -> bool:
    from airflow.api_fastapi.auth.managers.models.resource_details import VariableDetails

    return bool(
        _auth_manager().is_authorized_variable(method="GET", details=VariableDetails(key=key), user=user)
    )


def require_pipeline(user: Any, pipeline: str, ledger: Ledger) -> None:
    """403 unless the user may read the pipeline; 404 when the ledger has no batch of it."""
    if not can_read_pipeline(user, pipeline):
        raise HTTPException(
            status_code=403,
            detail=f"You may not read the runs of DAG {ingest_dag_id(pipeline)!r}, so not pipeline {pipeline!r}.",
        )
    if pipeline not in ledger.pipelines():
        raise HTTPException(status_code=404, detail=f"Pipeline {pipeline!r} has no batch in the ledger.")
