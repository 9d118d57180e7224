"""The monitoring page's FastAPI app, mounted by Airflow's API server (see :mod:`.monitor`).

Endpoints (relative to the mount prefix; JSON unless said):

* ``GET /`` — the page (HTML; ``?pipeline=&limit=`` select what it shows first);
* ``GET /pipelines`` — the pipelines of the ledger that the user may see, with their latest batch;
* ``GET /pipelines/{pipeline}/batches?limit=&status=`` — recent batches, newest first;
* ``GET /pipelines/{pipeline}/replayable?stale_after_s=`` — failed batches and stale in-flight ones;
* ``GET /pipelines/{pipeline}/losses?limit=`` — offsets recorded as lost (retention before a read,
  an abandoned batch), per batch with counts, newest first;
* ``GET /pipelines/{pipeline}/state`` — the controller Variables and the scaling thresholds;
* ``GET /pipelines/{pipeline}/overview?limit=&stale_after_s=`` — batches, replayable, losses and
  state in one answer;
* ``GET /pipelines/{pipeline}/lag?retention_margin_records=&timestamps=`` — per partition: earliest,
  committed position, ledger head, latest, lag, seconds behind, retention margin and risk, read from
  the broker (every request bounded in time; 503 naming the connection when it does not answer).

Every route depends on :func:`~.auth.authenticated_user` (401 without a valid token).
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, JSONResponse

from airflow_kafka_backpressure.config.pipeline import DEFAULT_STALE_AFTER_S

from . import page as page_html
from . import views
from .auth import authenticated_user, require_pipeline

#: Every route depends on an authenticated user (401 otherwise), the page included.
app = FastAPI(
    title="Kafka backpressure monitor",
    dependencies=[Depends(authenticated_user)],
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)

_Limit = Query(views.DEFAULT_LIMIT, ge=1, le=views.MAX_LIMIT, description="newest batches to return")
_StaleAfter = Query(
    DEFAULT_STALE_AFTER_S,
    gt=0,
    description="planned/running batches idle this long (s) count as replayable",
)


def _no_store(response: JSONResponse) -> JSONResponse:
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@app.get("/pipelines")
def list_pipelines(user: Any = Depends(authenticated_user)) -> JSONResponse:
    ledger = views.open_ledger()
    return _no_store(
        JSONResponse({"ledger": views.ledger_description(), "pipelines": views.pipelines(user, ledger)})
    )


@app.get("/pipelines/{pipeline}/batches")
def list_batches(
    pipeline: str,
    limit: int = _Limit,
    status: list[str] | None = Query(None, description="only batches in these statuses"),
    user: Any = Depends(authenticated_user),
) -> JSONResponse:
    ledger = views.open_ledger()
    require_pipeline(user, pipeline, ledger)
    return _no_store(
        JSONResponse({"pipeline": pipeline, "batches": views.batches(ledger, pipeline, limit, status)})
    )


@app.get("/pipelines/{pipeline}/replayable")
def list_replayable(
    pipeline: str, stale_after_s: float = _StaleAfter, user: Any = Depends(authenticated_user)
) -> JSONResponse:
    ledger = views.open_ledger()
    require_pipeline(user, pipeline, ledger)
    body = {
        "pipeline": pipeline,
        "stale_after_s": stale_after_s,
        "batches": views.replayable(ledger, pipeline, stale_after_s),
    }
    return _no_store(JSONResponse(body))


@app.get("/pipelines/{pipeline}/losses")
def list_losses(pipeline: str, limit: int = _Limit, user: Any = Depends(authenticated_user)) -> JSONResponse:
    ledger = views.open_ledger()
    require_pipeline(user, pipeline, ledger)
    return _no_store(JSONResponse({"pipeline": pipeline, "losses": views.losses(ledger, pipeline, limit)}))


@app.get("/pipelines/{pipeline}/state")
def pipeline_state(pipeline: str, user: Any = Depends(authenticated_user)) -> JSONResponse:
    ledger = views.open_ledger()
    require_pipeline(user, pipeline, ledger)
    return _no_store(JSONResponse({"pipeline": pipeline, **views.read_state(user, pipeline)}))


@app.get("/pipelines/{pipeline}/overview")
def pipeline_overview(
    pipeline: str,
    limit: int = _Limit,
    stale_after_s: float = _StaleAfter,
    user: Any = Depends(authenticated_user),
) -> JSONResponse:
    ledger = views.open_ledger()
    require_pipeline(user, pipeline, ledger)
    return _no_store(JSONResponse(views.overview(user, ledger, pipeline, limit, stale_after_s)))


@app.get("/pipelines/{pipeline}/lag")
def pipeline_lag(
    pipeline: str,
    retention_margin_records: int = Query(
        0,
        ge=0,
        description="a partition with unread data this close to the earliest retained offset is at risk",
    ),
    timestamps: bool = Query(
        True, description="read the oldest unwritten record's timestamp (seconds behind)"
    ),
    user: Any = Depends(authenticated_user),
) -> JSONResponse:
    ledger = views.open_ledger()
    require_pipeline(user, pipeline, ledger)
    return _no_store(JSONResponse(views.lag(ledger, pipeline, retention_margin_records, timestamps)))


@app.get("/", response_class=HTMLResponse)
def page(
    pipeline: str | None = Query(None, description="pipeline shown first (default: the first one)"),
    limit: int = _Limit,
    user: Any = Depends(authenticated_user),
) -> HTMLResponse:
    boot: dict[str, Any] = {"limit": limit, "selected": None, "overview": None, "error": None}
    try:
        ledger = views.open_ledger()
        listed = views.pipelines(user, ledger)
        boot["ledger"] = views.ledger_description()
        boot["pipelines"] = listed
        names = [p["name"] for p in listed]
        selected = pipeline if pipeline in names else (names[0] if names else None)
        if pipeline and pipeline not in names:
            boot["error"] = f"Pipeline {pipeline!r} is not in the ledger or you may not read it."
        if selected is not None:
            boot["selected"] = selected
            boot["overview"] = views.overview(user, ledger, selected, limit, DEFAULT_STALE_AFTER_S)
    except HTTPException as e:
        boot.update(pipelines=[], ledger=views.ledger_description(), error=str(e.detail))
    body, headers = page_html.render(boot)
    return HTMLResponse(body, headers=headers)
