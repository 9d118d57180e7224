"""What the monitoring page shows, as JSON-safe dicts: batches, replayable batches, the controller
Variables, and the per-partition lag and retention risk read from the broker.

The ledger is the one of the connection named by env ``KBP_LEDGER_CONN_ID``, else the default SQLite
file under ``AIRFLOW_HOME`` (:class:`~airflow_kafka_backpressure.hooks.ledger.LedgerHook`). A
pipeline's topics, consumer group and Kafka connection come from the pipelines file
(``KBP_PIPELINES_FILE``) when it describes the pipeline, else from the defaults (``kafka_default``,
group ``kbp-<pipeline>``, the topics of its latest batch).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException

from airflow_kafka_backpressure.config.pipeline import PIPELINES_FILE_ENV, PipelineConfig, load_pipelines
from airflow_kafka_backpressure.config.settings import parse_settings

from ..control.modes import REGISTRY as MODES
from ..control.scaling import SCALING_DOWN_RATIO, SCALING_UP_RATIO
from ..kafka.lag import measure_lag
from .auth import can_read_pipeline, can_read_variable, ingest_dag_id
from .internals import redact_variable

if TYPE_CHECKING:
    from ..ledger import BatchRecord, Ledger

log = logging.getLogger(__name__)

#: Environment variable naming the ledger's Airflow connection (unset: default SQLite ledger).
LEDGER_CONN_ENV = "KBP_LEDGER_CONN_ID"
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
#: Bound of every broker request the page makes (connect, metadata, offsets, one fetch).
BROKER_TIMEOUT_S = 5.0
#: Seconds a pipeline's lag report is reused (the page refreshes every 15 s; several tabs share it).
LAG_CACHE_S = 5.0

_VARIABLE_SUFFIXES = {
    "settings": "settings",
    "controller_state": "controller_state",
    "executor_target": "executor_target",
    "maintenance": "maintenance",
}


# --------------------------------------------------------------------------------------------------
# The ledger
# --------------------------------------------------------------------------------------------------


def ledger_conn_id() -> str | None:
    return os.environ.get(LEDGER_CONN_ENV) or None


def ledger_description() -> dict[str, Any]:
    conn_id = ledger_conn_id()
    return {
        "conn_id": conn_id,
        "source": f"connection {conn_id!r} (env {LEDGER_CONN_ENV})"
        if conn_id
        else "default SQLite file under AIRFLOW_HOME",
    }


def open_ledger() -> Ledger:
    """The ledger named by ``KBP_LEDGER_CONN_ID`` (else the default one), opened as a reader: a
    viewer's request never creates or migrates it. 503 when it cannot be opened or is not
    initialised yet (the message says what to run)."""
    # defers Airflow's connections and SQLAlchemy: only when a page reads the ledger
    from ..hooks.ledger import LedgerHook
    from ..ledger import LedgerNotInitialised

    try:
        return LedgerHook(ledger_conn_id()).get_conn(upgrade=False)
    except LedgerNotInitialised as e:
        raise HTTPException(status_code=503, detail=f"Ledger not initialised: {e}") from None
    except Exception as e:
        log.exception("Kafka backpressure monitor: cannot open the ledger")
        raise HTTPException(
            status_code=503,
            detail=(
                f"Cannot open the ledger ({ledger_description()['source']}): {type(e).__name__}. "
                f"Check the connection (env {LEDGER_CONN_ENV}) and the API server log."
            ),
        ) from None


# --------------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------------


def batch_view(b: BatchRecord) -> dict[str, Any]:
    """A batch as the page needs it: the ledger row (``to_dict()``) plus derived numbers.

    ``batch_interval_ms``, ``lag`` (records left behind when planned), ``planned_records``,
    ``data_loss_records``, ``processing_ratio`` (processing time / batch interval, the ratio that drives
    executor scaling) and ``records_per_s`` (records / processing time). ``arrival_per_s`` (records
    that arrived per second of input, comparable with the rate limit) is set by :func:`batches`,
    from the batch before.
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
    d["arrival_per_s"] = None
    return d


def with_arrival_rates(views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``views`` (a pipeline's batches, any order) with ``arrival_per_s``: the records that arrived
    on the topics per second between the plan of the batch before and this one's (this one's
    planned records plus the lag it left, less the lag the batch before left, over the time between
    the two plans). A rate per second of input, as the rate limit is; None for the oldest batch
    shown, or a plan at the same millisecond."""
    ordered = sorted(views, key=lambda v: v["batch_id"])
    for before, v in zip(ordered, ordered[1:]):
        seconds = (v["created_at_ms"] - before["created_at_ms"]) / 1000.0
        if seconds > 0:
            arrived = v["planned_records"] + v["lag"] - before["lag"]
            v["arrival_per_s"] = max(arrived, 0) / seconds
    return views


def replayable_view(b: BatchRecord) -> dict[str, Any]:
    d = batch_view(b)
    d["reason"] = "failed" if b.status == "failed" else "stale"
    d["last_activity_ms"] = b.last_activity_ms
    return d


def now_ms() -> int:
    return int(time.time() * 1000)


def batches(
    ledger: Ledger, pipeline: str, limit: int, statuses: list[str] | None = None
) -> list[dict[str, Any]]:
    try:
        views = [batch_view(b) for b in ledger.recent_batches(pipeline, limit=limit, statuses=statuses)]
        return with_arrival_rates(views) if statuses is None else views
    except ValueError as e:
        raise HTTPException(status_code=400, detail=str(e)) from None


def replayable(ledger: Ledger, pipeline: str, stale_after_s: float) -> list[dict[str, Any]]:
    stale_before = now_ms() - int(stale_after_s * 1000)
    return [replayable_view(b) for b in ledger.replayable_batches(pipeline, stale_before_ms=stale_before)]


def pipelines(user: Any, ledger: Ledger) -> list[dict[str, Any]]:
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
# The controller Variables
# --------------------------------------------------------------------------------------------------


def read_state(user: Any, pipeline: str) -> dict[str, Any]:
    """The pipeline's Variables (only those the user may read) and the effective scaling thresholds."""
    from airflow.models import Variable

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
            entry["value"] = redact_variable(json.loads(raw), key)
        except ValueError:
            entry["value"] = redact_variable(str(raw), key)
            entry["error"] = "not valid JSON"

    up, down, source = SCALING_UP_RATIO, SCALING_DOWN_RATIO, "default"
    settings = variables["settings"]
    if settings["exists"] and isinstance(settings["value"], dict):
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
            # the mode that plans and its cards (each mode says what it shows), a run waiting for data
            "mode": controller.get("mode") if isinstance(controller, dict) else None,
            "cards": mode_cards(controller),
            "waiting": controller.get("waiting") if isinstance(controller, dict) else None,
            "last_plan": controller.get("last_plan") if isinstance(controller, dict) else None,
            "executors": target.get("executors") if isinstance(target, dict) else None,
            "last_decision": target.get("last_decision") if isinstance(target, dict) else None,
        },
    }


def mode_cards(controller: Any) -> list[dict[str, str]]:
    """The active mode's cards from the stored controller state (its part under its name, or where a
    state written before the modes kept their parts under their names held it)."""
    if not isinstance(controller, dict) or controller.get("mode") not in MODES:
        return []
    name = controller["mode"]
    kind = MODES[name]
    part = controller[name] if name in controller else kind.legacy_state(controller)
    return kind.page_cards(part, controller.get("last_plan"))


def overview(user: Any, ledger: Ledger, pipeline: str, limit: int, stale_after_s: float) -> dict[str, Any]:
    return {
        "pipeline": pipeline,
        "ingest_dag_id": ingest_dag_id(pipeline),
        "generated_at_ms": now_ms(),
        "limit": limit,
        "stale_after_s": stale_after_s,
        "batches": batches(ledger, pipeline, limit),
        "replayable": replayable(ledger, pipeline, stale_after_s),
        "losses": losses(ledger, pipeline, limit),
        **read_state(user, pipeline),
    }


def losses(ledger: Ledger, pipeline: str, limit: int) -> list[dict[str, Any]]:
    """Per batch with recorded losses (newest first): status, ``lost`` (records) and the spans with
    their kind (plan, replay, abandon) and reason."""
    return [b.to_dict() for b in ledger.losses(pipeline, limit)]


# --------------------------------------------------------------------------------------------------
# Lag and retention risk, from the broker
# --------------------------------------------------------------------------------------------------


def pipeline_config(ledger: Ledger, name: str) -> tuple[PipelineConfig, str]:
    """The pipeline as the pipelines file describes it, else with default connections and group and
    the topics of its latest batch; and a sentence saying which."""

    path = os.environ.get(PIPELINES_FILE_ENV)
    if path:
        try:
            for p in load_pipelines(path):
                if p.name == name:
                    return p, f"pipelines file {path} (env {PIPELINES_FILE_ENV})"
        except (OSError, ValueError) as e:
            log.warning("Kafka backpressure monitor: cannot read the pipelines file %s: %s", path, e)
    latest = ledger.recent_batches(name, limit=1)
    topics = sorted({r.topic for r in latest[0].ranges}) if latest else []
    if not topics:
        raise HTTPException(
            status_code=404, detail=f"Pipeline {name!r}: no topic known (no batch with ranges)."
        )
    p = PipelineConfig(name=name, topics=tuple(topics), sink=latest[0].sink)
    return p, (
        f"defaults (pipeline not in {PIPELINES_FILE_ENV}): connection {p.kafka_conn_id!r}, group {p.group!r}, "
        "topics of the latest batch"
    )


class _LagReads:
    """At most one broker read of a pipeline's lag at a time in this process, and its result kept for
    :data:`LAG_CACHE_S`. The API server runs these synchronous handlers on a shared thread pool (the
    Execution API's too): during a broker freeze, open tabs that refresh every few seconds must not
    each hold a thread for a broker timeout. A request that finds a read of the same pipeline in
    flight gets the last report (marked ``stale``) or a 503 saying so, at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reading: set[str] = set()
        self._reports: dict[tuple[Any, ...], tuple[float, dict[str, Any]]] = {}

    def get(self, key: tuple[Any, ...], read: Any) -> dict[str, Any]:
        pipeline = key[0]
        with self._lock:
            kept = self._reports.get(key)
            age = time.monotonic() - kept[0] if kept else None
            if kept and age is not None and age < LAG_CACHE_S:
                return {**kept[1], "age_s": round(age, 1), "stale": False}
            if pipeline in self._reading:
                if kept:
                    return {**kept[1], "age_s": round(age or 0.0, 1), "stale": True}
                raise HTTPException(
                    status_code=503,
                    detail=(
                        f"The lag of pipeline {pipeline!r} is being read from Kafka by another request "
                        f"(bounded to {BROKER_TIMEOUT_S:g} s per broker call); try again in a few seconds."
                    ),
                    headers={"Retry-After": str(int(BROKER_TIMEOUT_S))},
                )
            self._reading.add(pipeline)
        try:
            report = read()
        finally:
            with self._lock:
                self._reading.discard(pipeline)
        with self._lock:
            self._reports[key] = (time.monotonic(), report)
            for k in [k for k, (at, _) in self._reports.items() if time.monotonic() - at > 60 * LAG_CACHE_S]:
                del self._reports[k]
        return {**report, "age_s": 0.0, "stale": False}


_LAG_READS = _LagReads()


def lag(ledger: Ledger, name: str, retention_margin_records: int, with_timestamps: bool) -> dict[str, Any]:
    """The per-partition lag report of a pipeline, read from the broker at most once per
    :data:`LAG_CACHE_S` and never twice at once (:class:`_LagReads`); 503 with the reason when the
    broker cannot answer (every request is bounded by :data:`BROKER_TIMEOUT_S`)."""
    return _LAG_READS.get(
        (name, retention_margin_records, with_timestamps),
        lambda: _read_lag(ledger, name, retention_margin_records, with_timestamps),
    )


def _read_lag(
    ledger: Ledger, name: str, retention_margin_records: int, with_timestamps: bool
) -> dict[str, Any]:
    # defers Airflow's connections and the Kafka client: only when a page asks for lag
    from ..hooks.kafka_offsets import KafkaOffsetsHook

    p, source = pipeline_config(ledger, name)
    try:
        with KafkaOffsetsHook(p.kafka_conn_id, timeout_s=BROKER_TIMEOUT_S).get_conn() as kafka:
            report = measure_lag(
                kafka,
                ledger,
                pipeline=p.name,
                topics=p.topics,
                group=p.group,
                starting_offsets=p.starting_offsets,
                retention_margin_records=retention_margin_records,
                with_timestamps=with_timestamps,
            )
    except Exception as e:
        log.warning("Kafka backpressure monitor: lag of pipeline %s: %s", name, e)
        raise HTTPException(
            status_code=503,
            detail=(
                f"Cannot read the offsets of pipeline {name!r} from Kafka connection {p.kafka_conn_id!r} "
                f"(every request bounded to {BROKER_TIMEOUT_S:g} s): {type(e).__name__}: {e}"
            ),
        ) from None
    return {
        **report.to_dict(),
        "config_source": source,
        "kafka_conn_id": p.kafka_conn_id,
        "topics": list(p.topics),
    }
