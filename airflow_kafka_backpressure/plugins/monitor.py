"""The monitoring page of the Kafka backpressure pipelines, inside the Airflow UI.

A FastAPI app mounted by the API server under :data:`URL_PREFIX`, shown by the UI as an external view
(menu *Browse → Kafka Backpressure*, route ``/plugin/kafka-backpressure``). Per pipeline it shows the
batches of the ledger (PID rate limit, records, processed rate, processing time / batch interval with
the scaling thresholds, scheduling delay, executors, lag, status, errors), the replayable batches and
the controller Variables (``kbp.<pipeline>.settings`` / ``.controller_state`` / ``.executor_target``),
read-only.

Endpoints (all relative to :data:`URL_PREFIX`; JSON unless said):

* ``GET /`` — the page (HTML; ``?pipeline=&limit=`` select what it shows first);
* ``GET /pipelines`` — the pipelines of the ledger that the user may see, with their latest batch;
* ``GET /pipelines/{pipeline}/batches?limit=&status=`` — recent batches, newest first;
* ``GET /pipelines/{pipeline}/replayable?stale_after_s=`` — failed batches and stale in-flight ones;
* ``GET /pipelines/{pipeline}/state`` — the controller Variables and the scaling thresholds;
* ``GET /pipelines/{pipeline}/overview?limit=&stale_after_s=`` — the three above in one answer.

Access: a mounted app gets no login check from Airflow, so every route of the app depends on
:func:`authenticated_user`, Airflow's own ``get_user`` (bearer token, else the UI's ``_token``
cookie): no valid token → 401. A pipeline's data also needs read access to the runs of its ingest
DAG (``kbp_ingest_<pipeline>``, auth manager ``is_authorized_dag``) → 403 otherwise, and the
Variables are shown only to users the auth manager lets read them (``is_authorized_variable``).

The ledger is the one of the connection named by env ``KBP_LEDGER_CONN_ID``, else the default SQLite
file under ``AIRFLOW_HOME`` (:class:`~airflow_kafka_backpressure.hooks.ledger.LedgerHook`).

The page needs no internet: inline SVG charts and vanilla JS, under a nonce-based Content Security
Policy. Every value from the ledger or the Variables is inserted as text (``textContent``), never as
markup; the initial data are embedded as JSON with ``<``, ``>``, ``&`` escaped.

Heavy Airflow modules (API security, models, hooks) are imported inside functions: Airflow loads
plugins in every component, and only the API server serves this app.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from airflow.plugins_manager import AirflowPlugin

if TYPE_CHECKING:
    from ..ledger import BatchRecord, Ledger

log = logging.getLogger(__name__)

__all__ = [
    "LEDGER_CONN_ENV",
    "URL_PREFIX",
    "URL_ROUTE",
    "KafkaBackpressurePlugin",
    "app",
    "authenticated_user",
    "batch_view",
]

#: Where the API server mounts the app (must not start with /api/v2, /ui, /execution, /auth, /pluginsv2).
URL_PREFIX = "/kafka-backpressure"
#: The UI route of the external view: the page shows at ``/plugin/<URL_ROUTE>``.
URL_ROUTE = "kafka-backpressure"
#: Environment variable naming the ledger's Airflow connection (unset: default SQLite ledger).
LEDGER_CONN_ENV = "KBP_LEDGER_CONN_ID"
#: A planned/running batch idle this long counts as replayable (PipelineConfig.stale_after_s default).
DEFAULT_STALE_AFTER_S = 86400.0
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
DEFAULT_SCALING_UP_RATIO = 0.9
DEFAULT_SCALING_DOWN_RATIO = 0.3

_VARIABLE_SUFFIXES = {
    "settings": "settings",
    "controller_state": "controller_state",
    "executor_target": "executor_target",
}


# --------------------------------------------------------------------------------------------------
# Authentication and authorization
# --------------------------------------------------------------------------------------------------

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

    return bool(_auth_manager().is_authorized_variable(method="GET", details=VariableDetails(key=key), user=user))


def _require_pipeline(user: Any, pipeline: str, ledger: Ledger) -> None:
    if not can_read_pipeline(user, pipeline):
        raise HTTPException(
            status_code=403,
            detail=f"You may not read the runs of DAG {ingest_dag_id(pipeline)!r}, so not pipeline {pipeline!r}.",
        )
    if pipeline not in ledger.pipelines():
        raise HTTPException(status_code=404, detail=f"Pipeline {pipeline!r} has no batch in the ledger.")


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def _ledger_conn_id() -> str | None:
    return os.environ.get(LEDGER_CONN_ENV) or None


def _ledger_description() -> dict[str, Any]:
    conn_id = _ledger_conn_id()
    return {
        "conn_id": conn_id,
        "source": f"connection {conn_id!r} (env {LEDGER_CONN_ENV})" if conn_id else "default SQLite file under AIRFLOW_HOME",
    }


def open_ledger() -> Ledger:
    """The ledger named by ``KBP_LEDGER_CONN_ID`` (else the default one); 503 when it cannot be opened."""
    from ..hooks.ledger import LedgerHook

    conn_id = _ledger_conn_id()
    try:
        return LedgerHook(conn_id).get_conn()
    except Exception as e:
        log.exception("Kafka backpressure monitor: cannot open the ledger")
        raise HTTPException(
            status_code=503,
            detail=(
                f"Cannot open the ledger ({_ledger_description()['source']}): {type(e).__name__}. "
                f"Check the connection (env {LEDGER_CONN_ENV}) and the API server log."
            ),
        ) from None


def batch_view(b: BatchRecord) -> dict[str, Any]:
    """A batch as the page needs it: the ledger row (``to_dict()``) plus derived numbers.

    ``batch_interval_ms``, ``lag`` (records left behind when planned), ``planned_records``,
    ``data_loss_records``, ``processing_ratio`` (processing time / batch interval, the ratio that drives
    executor scaling) and ``records_per_s`` (records / processing time).
    """
    d = b.to_dict()
    interval = b.plan.batch_interval_ms
    d["batch_interval_ms"] = interval
    d["lag"] = b.plan.lag
    d["planned_records"] = b.plan.records
    d["data_loss_records"] = sum(x.lost for x in b.plan.data_loss)
    d["processing_ratio"] = (
        b.processing_ms / interval if b.processing_ms is not None and interval and interval > 0 else None
    )
    d["records_per_s"] = (
        b.records * 1000.0 / b.processing_ms if b.records is not None and b.processing_ms else None
    )
    return d


def replayable_view(b: BatchRecord) -> dict[str, Any]:
    d = batch_view(b)
    d["reason"] = "failed" if b.status == "failed" else "stale"
    d["last_activity_ms"] = b.last_activity_ms
    return d


def _now_ms() -> int:
    return int(time.time() * 1000)


def read_state(user: Any, pipeline: str) -> dict[str, Any]:
    """The pipeline's Variables (only those the user may read) and the effective scaling thresholds."""
    from airflow.models import Variable

    try:
        from airflow._shared.secrets_masker import redact
    except ImportError:  # pragma: no cover - moved in another Airflow version
        from airflow.sdk.execution_time.secrets_masker import redact  # type: ignore[no-redef]

    variables: dict[str, Any] = {}
    for name, suffix in _VARIABLE_SUFFIXES.items():
        key = f"kbp.{pipeline}.{suffix}"
        entry: dict[str, Any] = {"key": key, "readable": False, "exists": False, "value": None, "error": None}
        variables[name] = entry
        if not can_read_variable(user, key):
            continue
        entry["readable"] = True
        try:
            raw = Variable.get(key, default_var=None)
        except Exception as e:
            log.warning("Kafka backpressure monitor: cannot read Variable %s: %s", key, e)
            entry["error"] = f"cannot read it: {type(e).__name__}"
            continue
        if raw is None:
            continue
        entry["exists"] = True
        try:
            entry["value"] = redact(json.loads(raw), key)
        except ValueError:
            entry["value"] = redact(str(raw), key)
            entry["error"] = "not valid JSON"

    up, down, source = DEFAULT_SCALING_UP_RATIO, DEFAULT_SCALING_DOWN_RATIO, "default"
    settings = variables["settings"]
    if settings["exists"] and isinstance(settings["value"], dict):
        from ..config import parse_settings

        try:
            effective = parse_settings(settings["value"], source=f"Variable {settings['key']!r}")
            up, down, source = effective.scaling_up_ratio, effective.scaling_down_ratio, "settings"
        except ValueError as e:
            settings["error"] = str(e)
    controller = variables["controller_state"]["value"]
    target = variables["executor_target"]["value"]
    return {
        "variables": variables,
        "thresholds": {"scaling_up_ratio": up, "scaling_down_ratio": down, "source": source},
        "current": {
            "rate_limit": controller.get("rate_limit") if isinstance(controller, dict) else None,
            "executors": target.get("executors") if isinstance(target, dict) else None,
            "last_decision": target.get("last_decision") if isinstance(target, dict) else None,
        },
    }


def _batches(ledger: Ledger, pipeline: str, limit: int, statuses: list[str] | None = None) -> list[dict[str, Any]]:
    try:
        return [batch_view(b) for b in ledger.recent_batches(pipeline, limit=limit, statuses=statuses)]
    except ValueError as e:
        raise HTTPException(status_code=400, detail=str(e)) from None


def _replayable(ledger: Ledger, pipeline: str, stale_after_s: float) -> list[dict[str, Any]]:
    stale_before = _now_ms() - int(stale_after_s * 1000)
    return [replayable_view(b) for b in ledger.replayable_batches(pipeline, stale_before_ms=stale_before)]


def _overview(user: Any, ledger: Ledger, pipeline: str, limit: int, stale_after_s: float) -> dict[str, Any]:
    return {
        "pipeline": pipeline,
        "ingest_dag_id": ingest_dag_id(pipeline),
        "generated_at_ms": _now_ms(),
        "limit": limit,
        "stale_after_s": stale_after_s,
        "batches": _batches(ledger, pipeline, limit),
        "replayable": _replayable(ledger, pipeline, stale_after_s),
        **read_state(user, pipeline),
    }


def _pipelines(user: Any, ledger: Ledger) -> list[dict[str, Any]]:
    out = []
    for name in ledger.pipelines():
        if not can_read_pipeline(user, name):
            continue
        latest = ledger.recent_batches(name, limit=1)
        out.append(
            {
                "name": name,
                "ingest_dag_id": ingest_dag_id(name),
                "latest_batch": batch_view(latest[0]) if latest else None,
            }
        )
    return out


# --------------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------------

#: Every route depends on an authenticated user (401 otherwise), the page included.
app = FastAPI(
    title="Kafka backpressure monitor",
    dependencies=[Depends(authenticated_user)],
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)

_Limit = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="newest batches to return")
_StaleAfter = Query(
    DEFAULT_STALE_AFTER_S, gt=0, description="planned/running batches idle this long (s) count as replayable"
)


def _no_store(response: JSONResponse) -> JSONResponse:
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@app.get("/pipelines")
def list_pipelines(user: Any = Depends(authenticated_user)) -> JSONResponse:
    ledger = open_ledger()
    return _no_store(JSONResponse({"ledger": _ledger_description(), "pipelines": _pipelines(user, ledger)}))


@app.get("/pipelines/{pipeline}/batches")
def list_batches(
    pipeline: str,
    limit: int = _Limit,
    status: list[str] | None = Query(None, description="only batches in these statuses"),
    user: Any = Depends(authenticated_user),
) -> JSONResponse:
    ledger = open_ledger()
    _require_pipeline(user, pipeline, ledger)
    return _no_store(JSONResponse({"pipeline": pipeline, "batches": _batches(ledger, pipeline, limit, status)}))


@app.get("/pipelines/{pipeline}/replayable")
def list_replayable(
    pipeline: str, stale_after_s: float = _StaleAfter, user: Any = Depends(authenticated_user)
) -> JSONResponse:
    ledger = open_ledger()
    _require_pipeline(user, pipeline, ledger)
    return _no_store(
        JSONResponse(
            {"pipeline": pipeline, "stale_after_s": stale_after_s, "batches": _replayable(ledger, pipeline, stale_after_s)}
        )
    )


@app.get("/pipelines/{pipeline}/state")
def pipeline_state(pipeline: str, user: Any = Depends(authenticated_user)) -> JSONResponse:
    ledger = open_ledger()
    _require_pipeline(user, pipeline, ledger)
    return _no_store(JSONResponse({"pipeline": pipeline, **read_state(user, pipeline)}))


@app.get("/pipelines/{pipeline}/overview")
def pipeline_overview(
    pipeline: str,
    limit: int = _Limit,
    stale_after_s: float = _StaleAfter,
    user: Any = Depends(authenticated_user),
) -> JSONResponse:
    ledger = open_ledger()
    _require_pipeline(user, pipeline, ledger)
    return _no_store(JSONResponse(_overview(user, ledger, pipeline, limit, stale_after_s)))


@app.get("/", response_class=HTMLResponse)
def page(
    pipeline: str | None = Query(None, description="pipeline shown first (default: the first one)"),
    limit: int = _Limit,
    user: Any = Depends(authenticated_user),
) -> HTMLResponse:
    boot: dict[str, Any] = {"limit": limit, "selected": None, "overview": None, "error": None}
    try:
        ledger = open_ledger()
        pipelines = _pipelines(user, ledger)
        boot["ledger"] = _ledger_description()
        boot["pipelines"] = pipelines
        names = [p["name"] for p in pipelines]
        selected = pipeline if pipeline in names else (names[0] if names else None)
        if pipeline and pipeline not in names:
            boot["error"] = f"Pipeline {pipeline!r} is not in the ledger or you may not read it."
        if selected is not None:
            boot["selected"] = selected
            boot["overview"] = _overview(user, ledger, selected, limit, DEFAULT_STALE_AFTER_S)
    except HTTPException as e:
        boot.update(pipelines=[], ledger=_ledger_description(), error=str(e.detail))
    nonce = secrets.token_urlsafe(18)
    body = _PAGE.replace("__NONCE__", nonce).replace("__BOOT__", embed_json(boot))
    return HTMLResponse(body, headers=_page_headers(nonce))


def embed_json(value: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>``, ``&`` or line separators."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _page_headers(nonce: str) -> dict[str, str]:
    csp = "; ".join(
        [
            "default-src 'none'",
            f"script-src 'nonce-{nonce}'",
            f"style-src 'nonce-{nonce}'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'self'",
        ]
    )
    return {
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
    }


def page_href() -> str:
    """Where the UI's iframe loads the page: :data:`URL_PREFIX` under the path of ``[api] base_url``
    (the API server mounts everything there when Airflow is served under a sub-path)."""
    from urllib.parse import urlsplit

    from airflow.configuration import conf

    root = urlsplit(conf.get("api", "base_url", fallback="") or "/").path or "/"
    return root.rstrip("/") + URL_PREFIX + "/"


class KafkaBackpressurePlugin(AirflowPlugin):
    """Registered through the ``airflow.plugins`` entry point only (not in the provider info)."""

    name = "kafka_backpressure"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Kafka backpressure monitor"}]
    external_views = [
        {
            "name": "Kafka Backpressure",
            "href": page_href(),
            "url_route": URL_ROUTE,
            "category": "browse",
            "destination": "nav",
        }
    ]


# --------------------------------------------------------------------------------------------------
# The page: static HTML + CSS + JS; data arrive as JSON (embedded, then fetched) and are set as text.
# --------------------------------------------------------------------------------------------------

_PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Kafka Backpressure</title>
<style nonce="__NONCE__">
:root {
  --bg: #ffffff; --fg: #1a202c; --muted: #64748b; --line: #e2e8f0; --panel: #f8fafc;
  --c1: #2563eb; --c2: #16a34a; --c3: #ea580c; --c4: #7c3aed; --c5: #0891b2; --c6: #db2777;
  --ok: #16a34a; --bad: #dc2626; --warn: #d97706; --run: #2563eb; --plan: #64748b; --replay: #7c3aed;
}
@media (prefers-color-scheme: dark) {
  :root { --bg: #0f172a; --fg: #e2e8f0; --muted: #94a3b8; --line: #334155; --panel: #1e293b;
    --c1: #60a5fa; --c2: #4ade80; --c3: #fb923c; --c4: #a78bfa; --c5: #22d3ee; --c6: #f472b6; }
}
* { box-sizing: border-box; }
body { margin: 0; padding: 12px 16px 32px; background: var(--bg); color: var(--fg);
  font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
h1 { font-size: 18px; margin: 0 16px 0 0; }
h2 { font-size: 15px; margin: 20px 0 8px; }
h3 { font-size: 13px; margin: 0 0 4px; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
.bar { display: flex; flex-wrap: wrap; align-items: center; gap: 10px; padding-bottom: 10px;
  border-bottom: 1px solid var(--line); }
.bar label { color: var(--muted); }
select, button, input { font: inherit; color: var(--fg); background: var(--panel);
  border: 1px solid var(--line); border-radius: 4px; padding: 3px 6px; }
button { cursor: pointer; }
.muted { color: var(--muted); }
.banner { margin: 10px 0; padding: 8px 10px; border-radius: 4px; border: 1px solid var(--bad);
  color: var(--bad); white-space: pre-wrap; }
.hidden { display: none; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin-top: 12px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px;
  min-width: 150px; }
.card .k { color: var(--muted); font-size: 11px; text-transform: uppercase; letter-spacing: .03em; }
.card .v { font-size: 18px; font-weight: 600; overflow-wrap: anywhere; }
.card .s { color: var(--muted); font-size: 11px; overflow-wrap: anywhere; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 12px; margin-top: 12px; }
.chart { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 8px; }
.chart svg { width: 100%; height: auto; display: block; }
.legend { display: flex; gap: 12px; flex-wrap: wrap; color: var(--muted); font-size: 11px; }
.sw { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; vertical-align: -1px; }
.axis line, .axis path { stroke: var(--line); }
.axis text, .tick { fill: var(--muted); font-size: 10px; }
.grid { stroke: var(--line); stroke-width: 1; }
.s1 { stroke: var(--c1); fill: var(--c1); } .s2 { stroke: var(--c2); fill: var(--c2); }
.s3 { stroke: var(--c3); fill: var(--c3); } .s4 { stroke: var(--c4); fill: var(--c4); }
.s5 { stroke: var(--c5); fill: var(--c5); } .s6 { stroke: var(--c6); fill: var(--c6); }
path.line { fill: none; stroke-width: 2; }
.b1 { background: var(--c1); } .b2 { background: var(--c2); } .b3 { background: var(--c3); }
.b4 { background: var(--c4); } .b5 { background: var(--c5); } .b6 { background: var(--c6); }
.bwarn { background: var(--bad); } .bmin { background: var(--warn); } .brun { background: var(--plan); }
line.th-up { stroke: var(--bad); stroke-dasharray: 5 4; stroke-width: 1.5; }
line.th-down { stroke: var(--warn); stroke-dasharray: 5 4; stroke-width: 1.5; }
text.th-up { fill: var(--bad); font-size: 10px; } text.th-down { fill: var(--warn); font-size: 10px; }
rect.st-succeeded, rect.st-replayed { fill: var(--ok); } rect.st-failed { fill: var(--bad); }
rect.st-running, rect.st-replaying, rect.st-planned, rect.st-unknown { fill: var(--plan); }
.empty { fill: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 6px; text-align: left; vertical-align: top; }
th { color: var(--muted); font-weight: 600; position: sticky; top: 0; background: var(--bg); }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.tablewrap { max-height: 520px; overflow: auto; border: 1px solid var(--line); border-radius: 6px; }
.status { display: inline-block; padding: 1px 6px; border-radius: 9px; color: #fff; font-size: 11px; }
.status.st-succeeded, .status.st-replayed { background: var(--ok); }
.status.st-failed { background: var(--bad); }
.status.st-running, .status.st-replaying { background: var(--run); }
.status.st-planned, .status.st-unknown { background: var(--plan); }
tr.row-failed td { background: rgba(220, 38, 38, .07); }
.err { color: var(--bad); white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; max-width: 560px; }
details summary { cursor: pointer; }
td pre { margin: 0; }
.vars { display: grid; grid-template-columns: repeat(auto-fill, minmax(320px, 1fr)); gap: 12px; }
.vars pre { margin: 4px 0 0; padding: 6px; background: var(--bg); border: 1px solid var(--line);
  border-radius: 4px; max-height: 320px; overflow: auto; white-space: pre-wrap; overflow-wrap: anywhere; }
</style>
</head>
<body>
<div class="bar">
  <h1>Kafka Backpressure</h1>
  <label for="kbp-pipeline">Pipeline</label>
  <select id="kbp-pipeline"></select>
  <label for="kbp-limit">Batches</label>
  <select id="kbp-limit"><option>50</option><option>100</option><option>200</option><option>500</option><option>1000</option></select>
  <label><input type="checkbox" id="kbp-auto" checked> auto-refresh 15 s</label>
  <button type="button" id="kbp-refresh">Refresh</button>
  <span class="muted" id="kbp-updated"></span>
</div>
<noscript><p class="banner">This page needs JavaScript to draw its charts and tables; the JSON endpoints are under <code>pipelines</code>.</p></noscript>
<div id="kbp-error" class="banner hidden"></div>
<p class="muted" id="kbp-ledger"></p>

<div class="cards" id="kbp-cards"></div>

<h2>Per batch</h2>
<div class="charts">
  <div class="chart"><h3>Rate limit vs records/s processed</h3><div class="legend" id="legend-rate"></div>
    <svg id="plot-rate" viewBox="0 0 560 220" role="img" aria-label="rate limit and processed rate per batch"></svg></div>
  <div class="chart"><h3>Records per batch</h3><div class="legend" id="legend-records"></div>
    <svg id="plot-records" viewBox="0 0 560 220" role="img" aria-label="records per batch"></svg></div>
  <div class="chart"><h3>Processing time / batch interval</h3><div class="legend" id="legend-ratio"></div>
    <svg id="plot-ratio" viewBox="0 0 560 220" role="img" aria-label="processing time over batch interval"></svg></div>
  <div class="chart"><h3>Scheduling delay and processing time (s)</h3><div class="legend" id="legend-delay"></div>
    <svg id="plot-delay" viewBox="0 0 560 220" role="img" aria-label="scheduling delay per batch"></svg></div>
  <div class="chart"><h3>Executors</h3><div class="legend" id="legend-executors"></div>
    <svg id="plot-executors" viewBox="0 0 560 220" role="img" aria-label="executors per batch"></svg></div>
  <div class="chart"><h3>Lag left behind (records)</h3><div class="legend" id="legend-lag"></div>
    <svg id="plot-lag" viewBox="0 0 560 220" role="img" aria-label="lag per batch"></svg></div>
</div>

<h2>Replayable batches <span class="muted" id="kbp-replay-note"></span></h2>
<div class="tablewrap"><table id="kbp-replayable"></table></div>

<h2>Recent batches</h2>
<div class="tablewrap"><table id="kbp-batches"></table></div>

<h2>Controller settings and state <span class="muted">(Airflow Variables, read-only here)</span></h2>
<div class="vars" id="kbp-vars"></div>

<script type="application/json" id="kbp-boot">__BOOT__</script>
<script nonce="__NONCE__">
(function () {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var STATUSES = ["planned", "running", "succeeded", "failed", "replaying", "replayed"];
  var W = 560, H = 220, ML = 58, MR = 14, MT = 12, MB = 30;
  var boot = JSON.parse(document.getElementById("kbp-boot").textContent);
  var state = { pipeline: boot.selected, limit: boot.limit || 100, timer: null, busy: false };

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function sv(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) { if (Object.prototype.hasOwnProperty.call(attrs, k)) { e.setAttribute(k, String(attrs[k])); } }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }
  function isNum(v) { return typeof v === "number" && isFinite(v); }
  function stCls(s) { return "st-" + (STATUSES.indexOf(s) >= 0 ? s : "unknown"); }
  function fmt(v, digits) {
    if (!isNum(v)) { return "\u2013"; }
    var a = Math.abs(v);
    if (digits === undefined) { digits = a >= 100 || Number.isInteger(v) ? 0 : (a >= 10 ? 1 : 2); }
    return v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
  }
  function fmtShort(v) {
    if (!isNum(v)) { return ""; }
    var a = Math.abs(v);
    if (a >= 1e9) { return fmt(v / 1e9, 1) + "G"; }
    if (a >= 1e6) { return fmt(v / 1e6, 1) + "M"; }
    if (a >= 1e4) { return fmt(v / 1e3, 1) + "k"; }
    return fmt(v, a < 10 && !Number.isInteger(v) ? 2 : 0);
  }
  function fmtMs(ms) {
    if (!isNum(ms)) { return "\u2013"; }
    if (Math.abs(ms) < 1000) { return fmt(ms, 0) + " ms"; }
    if (Math.abs(ms) < 120000) { return fmt(ms / 1000, 1) + " s"; }
    return fmt(ms / 60000, 1) + " min";
  }
  function fmtTime(ms) {
    if (!isNum(ms)) { return "\u2013"; }
    var d = new Date(ms);
    return isNaN(d.getTime()) ? "\u2013" : d.toISOString().replace("T", " ").slice(0, 19) + "Z";
  }
  function showError(msg) {
    var e = $("kbp-error");
    if (msg) { e.textContent = msg; e.classList.remove("hidden"); } else { e.textContent = ""; e.classList.add("hidden"); }
  }

  // ---- charts --------------------------------------------------------------------------------
  function niceStep(range, ticks) {
    var raw = range / ticks, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  function legend(id, items) {
    var box = $(id); clear(box);
    items.forEach(function (it) {
      var s = el("span"); s.appendChild(el("span", "sw " + it.cls)); s.appendChild(document.createTextNode(it.label));
      box.appendChild(s);
    });
  }
  // opts: {batches, series: [{label, cls, key(b)->num|null, step, bars}], hlines: [{y, cls, label}], minMax}
  function chart(svgId, opts) {
    var svg = $(svgId); clear(svg);
    var bs = opts.batches, n = bs.length;
    var pw = W - ML - MR, ph = H - MT - MB;
    var ymax = opts.minMax || 0;
    opts.series.forEach(function (s) { bs.forEach(function (b) { var v = s.key(b); if (isNum(v) && v > ymax) { ymax = v; } }); });
    (opts.hlines || []).forEach(function (h) { if (isNum(h.y) && h.y * 1.15 > ymax) { ymax = h.y * 1.15; } });
    var hasData = opts.series.some(function (s) { return bs.some(function (b) { return isNum(s.key(b)); }); });
    if (!hasData) {
      svg.appendChild(sv("text", { x: W / 2, y: H / 2, "text-anchor": "middle", "class": "empty" }, n ? "no values yet" : "no batches"));
      return;
    }
    if (!(ymax > 0)) { ymax = 1; }
    var step = niceStep(ymax, 4); ymax = Math.ceil(ymax / step) * step;
    function X(i) { return n <= 1 ? ML + pw / 2 : ML + (i * pw) / (n - 1); }
    function Y(v) { return MT + ph - (v / ymax) * ph; }
    var axis = sv("g", { "class": "axis" });
    for (var t = 0; t <= ymax + step / 2; t += step) {
      axis.appendChild(sv("line", { x1: ML, x2: W - MR, y1: Y(t), y2: Y(t), "class": "grid" }));
      axis.appendChild(sv("text", { x: ML - 6, y: Y(t) + 3, "text-anchor": "end" }, fmtShort(t)));
    }
    var every = Math.max(1, Math.ceil(n / 8));
    for (var i = 0; i < n; i += every) {
      axis.appendChild(sv("text", { x: X(i), y: H - MB + 14, "text-anchor": "middle" }, "#" + bs[i].batch_id));
    }
    axis.appendChild(sv("text", { x: W - MR, y: H - 4, "text-anchor": "end" }, "batch id"));
    svg.appendChild(axis);
    opts.series.forEach(function (s) {
      if (s.bars) {
        var bw = Math.max(2, Math.min(24, (pw / Math.max(n, 1)) * 0.7));
        bs.forEach(function (b, i) {
          var v = s.key(b); if (!isNum(v)) { return; }
          var r = sv("rect", { x: X(i) - bw / 2, y: Y(v), width: bw, height: Math.max(0, Y(0) - Y(v)), "class": s.barCls ? s.barCls(b) : s.cls });
          r.appendChild(sv("title", {}, "batch " + b.batch_id + " (" + b.status + "): " + fmt(v) + " " + (s.unit || "")));
          svg.appendChild(r);
        });
        return;
      }
      var d = "", pen = false, prevY = null;
      bs.forEach(function (b, i) {
        var v = s.key(b);
        if (!isNum(v)) { pen = false; prevY = null; return; }
        if (!pen) { d += "M" + X(i) + "," + Y(v); }
        else if (s.step && prevY !== null) { d += "H" + X(i) + "V" + Y(v); }
        else { d += "L" + X(i) + "," + Y(v); }
        pen = true; prevY = Y(v);
      });
      if (d) { svg.appendChild(sv("path", { d: d, "class": "line " + s.cls })); }
      bs.forEach(function (b, i) {
        var v = s.key(b); if (!isNum(v)) { return; }
        var c = sv("circle", { cx: X(i), cy: Y(v), r: n > 120 ? 1.5 : 2.5, "class": s.cls });
        c.appendChild(sv("title", {}, s.label + ", batch " + b.batch_id + ": " + fmt(v) + " " + (s.unit || "")));
        svg.appendChild(c);
      });
    });
    (opts.hlines || []).forEach(function (h) {
      if (!isNum(h.y)) { return; }
      svg.appendChild(sv("line", { x1: ML, x2: W - MR, y1: Y(h.y), y2: Y(h.y), "class": h.cls }));
      svg.appendChild(sv("text", { x: W - MR - 2, y: Y(h.y) - 3, "text-anchor": "end", "class": h.cls }, h.label));
    });
  }

  function drawCharts(ov) {
    var bs = (ov && ov.batches ? ov.batches.slice() : []).reverse(); // oldest first
    var th = (ov && ov.thresholds) || { scaling_up_ratio: 0.9, scaling_down_ratio: 0.3 };
    legend("legend-rate", [{ cls: "b1", label: "rate limit (records/s)" }, { cls: "b2", label: "processed (records/s)" }]);
    chart("plot-rate", { batches: bs, series: [
      { label: "rate limit", cls: "s1", unit: "records/s", step: true, key: function (b) { return b.rate; } },
      { label: "processed", cls: "s2", unit: "records/s", key: function (b) { return b.records_per_s; } }] });
    legend("legend-records", [{ cls: "b2", label: "records read (succeeded/replayed)" }, { cls: "bwarn", label: "failed (planned records)" },
      { cls: "brun", label: "in flight (planned records)" }]);
    chart("plot-records", { batches: bs, series: [
      { label: "records", bars: true, unit: "records", barCls: function (b) { return stCls(b.status); },
        key: function (b) { return isNum(b.records) ? b.records : b.planned_records; } }] });
    legend("legend-ratio", [{ cls: "b4", label: "processing / interval" },
      { cls: "bwarn", label: "scale up \u2265 " + th.scaling_up_ratio }, { cls: "bmin", label: "scale down \u2264 " + th.scaling_down_ratio }]);
    chart("plot-ratio", { batches: bs, minMax: 1, series: [
      { label: "ratio", cls: "s4", key: function (b) { return b.processing_ratio; } }],
      hlines: [{ y: th.scaling_up_ratio, cls: "th-up", label: "up " + th.scaling_up_ratio },
               { y: th.scaling_down_ratio, cls: "th-down", label: "down " + th.scaling_down_ratio }] });
    var interval = bs.length ? bs[bs.length - 1].batch_interval_ms : null;
    legend("legend-delay", [{ cls: "b3", label: "scheduling delay (s)" }, { cls: "b5", label: "processing time (s)" }]);
    chart("plot-delay", { batches: bs, series: [
      { label: "scheduling delay", cls: "s3", unit: "s", key: function (b) { return isNum(b.scheduling_delay_ms) ? b.scheduling_delay_ms / 1000 : null; } },
      { label: "processing time", cls: "s5", unit: "s", key: function (b) { return isNum(b.processing_ms) ? b.processing_ms / 1000 : null; } }],
      hlines: isNum(interval) ? [{ y: interval / 1000, cls: "th-down", label: "interval " + fmt(interval / 1000) + " s" }] : [] });
    legend("legend-executors", [{ cls: "b6", label: "executors" }]);
    chart("plot-executors", { batches: bs, minMax: 1, series: [
      { label: "executors", cls: "s6", step: true, key: function (b) { return b.executors; } }] });
    legend("legend-lag", [{ cls: "b3", label: "records behind the latest offsets after the batch" }]);
    chart("plot-lag", { batches: bs, series: [
      { label: "lag", cls: "s3", unit: "records", key: function (b) { return b.lag; } }] });
  }

  // ---- cards, tables, variables --------------------------------------------------------------
  function card(box, k, v, s) {
    var c = el("div", "card"); c.appendChild(el("div", "k", k)); c.appendChild(el("div", "v", v));
    if (s) { c.appendChild(el("div", "s", s)); }
    box.appendChild(c);
  }
  function drawCards(ov) {
    var box = $("kbp-cards"); clear(box);
    if (!ov) { return; }
    var cur = ov.current || {}, last = ov.batches && ov.batches[0];
    var rl = cur.rate_limit;
    card(box, "Rate limit now", isNum(rl) ? (rl < 0 ? "none" : fmt(rl) + " /s") : "\u2013",
      ov.variables && ov.variables.controller_state && !ov.variables.controller_state.readable ? "controller state not readable" : "controller_state.rate_limit");
    var dec = cur.last_decision;
    card(box, "Executor target", isNum(cur.executors) ? fmt(cur.executors) : "\u2013",
      dec && typeof dec === "object" ? ("last: " + (dec.action || "?") + (dec.reason ? " \u2013 " + dec.reason : "")) : "");
    if (last) {
      card(box, "Latest batch", "#" + last.batch_id + " " + last.status, fmtTime(last.ended_at_ms || last.started_at_ms || last.created_at_ms));
      var done = (ov.batches || []).filter(function (b) { return isNum(b.processing_ratio); })[0];
      card(box, "Processing / interval", done ? fmt(done.processing_ratio, 2) : "\u2013",
        done ? fmtMs(done.processing_ms) + " of " + fmtMs(done.batch_interval_ms) + ", batch #" + done.batch_id : "no finished batch");
      card(box, "Lag left behind", isNum(last.lag) ? fmt(last.lag) : "\u2013", "records, when batch #" + last.batch_id + " was planned");
    }
    card(box, "Replayable", fmt((ov.replayable || []).length), "failed or stale batches");
  }
  function row(tr, cells) {
    cells.forEach(function (c) {
      var td = el("td", c.num ? "num" : "");
      if (c.node) { td.appendChild(c.node); } else { td.textContent = c.text === undefined || c.text === null ? "" : String(c.text); }
      tr.appendChild(td);
    });
  }
  function head(table, names) {
    var thead = el("thead"), tr = el("tr");
    names.forEach(function (h) { tr.appendChild(el("th", "", h)); });
    thead.appendChild(tr); table.appendChild(thead);
  }
  function statusNode(s) { return el("span", "status " + stCls(s), s); }
  function errorNode(text) {
    if (!text) { return el("span", "muted", ""); }
    var s = String(text), first = s.split("\n")[0];
    if (s.length <= 160 && s.indexOf("\n") < 0) { return el("pre", "err", s); }
    var d = el("details"); d.appendChild(el("summary", "err", first.length > 160 ? first.slice(0, 160) + "\u2026" : first));
    d.appendChild(el("pre", "err", s)); return d;
  }
  function rangesText(b) {
    var rs = (b.plan && b.plan.ranges) || [];
    return rs.filter(function (r) { return r.until_offset > r.from_offset; })
      .map(function (r) { return r.topic + "[" + r.partition + "] " + r.from_offset + "\u2013" + r.until_offset; }).join("\n");
  }
  function drawBatches(ov) {
    var t = $("kbp-batches"); clear(t);
    head(t, ["Batch", "Run id", "Status", "Started", "Records", "Rate limit /s", "Processed /s", "Processing",
             "Interval", "Ratio", "Sched. delay", "Executors", "Lag", "Attempts", "Error"]);
    var tb = el("tbody"), bs = (ov && ov.batches) || [];
    if (!bs.length) { var tr0 = el("tr"); row(tr0, [{ text: "no batches" }]); tb.appendChild(tr0); }
    bs.forEach(function (b) {
      var tr = el("tr", b.status === "failed" ? "row-failed" : "");
      row(tr, [{ text: b.batch_id, num: true }, { text: b.run_id }, { node: statusNode(b.status) },
        { text: fmtTime(b.started_at_ms) }, { text: fmt(b.records), num: true }, { text: fmt(b.rate), num: true },
        { text: fmt(b.records_per_s), num: true }, { text: fmtMs(b.processing_ms), num: true },
        { text: fmtMs(b.batch_interval_ms), num: true }, { text: fmt(b.processing_ratio, 2), num: true },
        { text: fmtMs(b.scheduling_delay_ms), num: true }, { text: fmt(b.executors), num: true },
        { text: fmt(b.lag), num: true }, { text: fmt(b.attempts), num: true }, { node: errorNode(b.error) }]);
      tb.appendChild(tr);
    });
    t.appendChild(tb);
  }
  function drawReplayable(ov) {
    var t = $("kbp-replayable"); clear(t);
    $("kbp-replay-note").textContent = ov ? "(failed, or planned/running and idle for more than " + fmt((ov.stale_after_s || 0) / 3600, 1) + " h)" : "";
    head(t, ["Batch", "Run id", "Status", "Why", "Attempts", "Last activity", "Planned records", "Ranges", "Error"]);
    var tb = el("tbody"), bs = (ov && ov.replayable) || [];
    if (!bs.length) { var tr0 = el("tr"); row(tr0, [{ text: "nothing to replay" }]); tb.appendChild(tr0); }
    bs.forEach(function (b) {
      var tr = el("tr", "row-failed");
      row(tr, [{ text: b.batch_id, num: true }, { text: b.run_id }, { node: statusNode(b.status) }, { text: b.reason },
        { text: fmt(b.attempts), num: true }, { text: fmtTime(b.last_activity_ms) }, { text: fmt(b.planned_records), num: true },
        { node: el("pre", "", rangesText(b)) }, { node: errorNode(b.error) }]);
      tb.appendChild(tr);
    });
    t.appendChild(tb);
  }
  function drawVariables(ov) {
    var box = $("kbp-vars"); clear(box);
    if (!ov || !ov.variables) { return; }
    ["settings", "controller_state", "executor_target"].forEach(function (name) {
      var v = ov.variables[name]; if (!v) { return; }
      var c = el("div", "card"); var h = el("h3"); h.appendChild(el("code", "", v.key)); c.appendChild(h);
      if (!v.readable) { c.appendChild(el("div", "muted", "You may not read this Variable.")); }
      else if (!v.exists) { c.appendChild(el("div", "muted", name === "settings" ? "Not set: Spark's defaults apply (the plan task creates it)." : "Not set yet.")); }
      else { c.appendChild(el("pre", "", typeof v.value === "string" ? v.value : JSON.stringify(v.value, null, 2))); }
      if (v.error) { c.appendChild(el("div", "err", v.error)); }
      box.appendChild(c);
    });
    var th = ov.thresholds;
    if (th) {
      var c = el("div", "card"); c.appendChild(el("h3", "", "Scaling thresholds in use"));
      c.appendChild(el("div", "", "up at ratio \u2265 " + th.scaling_up_ratio + ", down at \u2264 " + th.scaling_down_ratio + " (" + th.source + ")"));
      box.appendChild(c);
    }
  }

  function render(ov) {
    drawCards(ov); drawCharts(ov); drawReplayable(ov); drawBatches(ov); drawVariables(ov);
    $("kbp-updated").textContent = ov ? "updated " + fmtTime(ov.generated_at_ms) : "";
  }
  function fillPipelines(list) {
    var sel = $("kbp-pipeline"), cur = state.pipeline; clear(sel);
    if (!list.length) { var o0 = el("option", "", "(no pipelines)"); o0.value = ""; sel.appendChild(o0); sel.disabled = true; return; }
    sel.disabled = false;
    list.forEach(function (p) { var o = el("option", "", p.name); o.value = p.name; if (p.name === cur) { o.selected = true; } sel.appendChild(o); });
  }
  function describeLedger(ledger, count) {
    $("kbp-ledger").textContent = "Ledger: " + ((ledger && ledger.source) || "?") +
      (count ? "" : ". No pipeline you may see has a batch yet.");
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (r.status === 401 || r.status === 403) {
        return r.json().catch(function () { return {}; }).then(function (j) {
          throw new Error((r.status === 401 ? "Not logged in (or the session expired): log in to Airflow again and reload. " : "Forbidden: ") + (j.detail || ""));
        });
      }
      if (!r.ok) { return r.json().catch(function () { return {}; }).then(function (j) { throw new Error("HTTP " + r.status + ": " + (j.detail ? JSON.stringify(j.detail) : "")); }); }
      return r.json();
    });
  }
  function refresh() {
    if (state.busy) { return; }
    state.busy = true;
    getJSON("pipelines").then(function (p) {
      fillPipelines(p.pipelines || []); describeLedger(p.ledger, (p.pipelines || []).length);
      var names = (p.pipelines || []).map(function (x) { return x.name; });
      if (names.indexOf(state.pipeline) < 0) { state.pipeline = names.length ? names[0] : null; fillPipelines(p.pipelines); }
      if (!state.pipeline) { render(null); return null; }
      return getJSON("pipelines/" + encodeURIComponent(state.pipeline) + "/overview?limit=" + state.limit).then(function (ov) {
        render(ov); showError(null);
      });
    }).catch(function (e) { showError(String(e && e.message ? e.message : e)); })
      .then(function () { state.busy = false; });
  }
  function remember() {
    try {
      var q = "?limit=" + state.limit + (state.pipeline ? "&pipeline=" + encodeURIComponent(state.pipeline) : "");
      history.replaceState(null, "", q);
    } catch (e) { /* sandboxed */ }
  }
  function schedule() {
    if (state.timer) { clearInterval(state.timer); state.timer = null; }
    if ($("kbp-auto").checked) { state.timer = setInterval(refresh, 15000); }
  }

  $("kbp-limit").value = String(state.limit);
  if ($("kbp-limit").value !== String(state.limit)) { var o = el("option", "", String(state.limit)); $("kbp-limit").appendChild(o); $("kbp-limit").value = String(state.limit); }
  $("kbp-pipeline").addEventListener("change", function (e) { state.pipeline = e.target.value || null; remember(); refresh(); });
  $("kbp-limit").addEventListener("change", function (e) { state.limit = parseInt(e.target.value, 10) || 100; remember(); refresh(); });
  $("kbp-refresh").addEventListener("click", refresh);
  $("kbp-auto").addEventListener("change", schedule);

  fillPipelines(boot.pipelines || []);
  describeLedger(boot.ledger, (boot.pipelines || []).length);
  showError(boot.error);
  render(boot.overview);
  schedule();
})();
</script>
</body>
</html>
"""
