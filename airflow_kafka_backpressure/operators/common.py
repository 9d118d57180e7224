"""What the operators share: the pipeline, its Variables, its ledger and Kafka clients.

Variables are read only inside ``execute()``. Settings are parsed before anything is written, so
an invalid edit fails the task and changes no state.
"""

from __future__ import annotations

import json
import logging
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from airflow.sdk import Variable

from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.config.settings import ControllerSettings, parse_settings, settings_help
from airflow_kafka_backpressure.ledger.topic_identity import changed_topics

from ..control.controller import ControllerStateError, PipelineController
from ..hooks.kafka_offsets import KafkaOffsetsHook
from ..hooks.ledger import LedgerHook
from ..kafka.offsets import KafkaOffsets
from ..ledger import Ledger
from ..ledger.locks import ledger_lock
from ..sinks import commit_lock_name, sink_format_for

log = logging.getLogger(__name__)

# kafka-python logs every connection at INFO; keep task logs readable unless the user chose a level
if logging.getLogger("kafka").level == logging.NOTSET:
    logging.getLogger("kafka").setLevel(logging.WARNING)


def as_pipeline(pipeline: PipelineConfig | dict[str, Any]) -> PipelineConfig:
    return pipeline if isinstance(pipeline, PipelineConfig) else PipelineConfig.from_dict(dict(pipeline))


def load_settings(pipeline: PipelineConfig) -> ControllerSettings:
    """Parse the settings Variable; create it with the defaults (and help text) if missing."""
    key = pipeline.settings_variable
    text = Variable.get(key, default=None)
    if text is None:
        settings = ControllerSettings()
        Variable.set(
            key,
            settings.to_json(),
            description=f"Mode, gains and limits of pipeline {pipeline.name}.\n" + settings_help(),
        )
        log.info("Created Variable %r with the defaults; edit it in the UI to tune the controller", key)
        return settings
    return parse_settings(text, source=f"Variable {key!r}")


def _load_json_variable(key: str) -> dict[str, Any] | None:
    text = Variable.get(key, default=None)
    if text is None or not str(text).strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"Variable {key!r} is not valid JSON ({e}). It holds state written by the pipeline; "
            "delete it to start again from defaults."
        ) from e
    if not isinstance(value, dict):
        raise ValueError(f"Variable {key!r} must hold a JSON object; delete it to start again from defaults.")
    return value


def load_controller(pipeline: PipelineConfig, settings: ControllerSettings) -> PipelineController:
    """The controller under the current settings: the mode they choose, the PID under their gains
    (a gains edit re-applies the last batch), the cost model as the state left it.

    A state that is not valid JSON, not a controller state, or holds NaN, infinite or out-of-range
    numbers is refused with the key that holds them."""
    key = pipeline.controller_variable
    state = _load_json_variable(key)
    if state is None:
        return PipelineController.new(settings.mode, settings, pipeline.batch_interval_ms)
    try:
        return PipelineController.from_dict(
            state, settings.mode, settings, pipeline.batch_interval_ms, where=f"Variable {key!r}"
        )
    except ControllerStateError as e:
        raise ControllerStateError(
            f"{e}. It holds state written by the pipeline: delete it to start the controller again."
        ) from e


def save_controller(
    pipeline: PipelineConfig, controller: PipelineController, settings: ControllerSettings
) -> None:
    Variable.set(
        pipeline.controller_variable,
        json.dumps(controller.to_dict(settings.cost_params(), pipeline.batch_interval_s), sort_keys=True),
        description=(
            f"Controller state of pipeline {pipeline.name} (written by the record task): each control "
            "mode's own state under its name, the active mode, the last plan."
        ),
    )


def load_executor_target(pipeline: PipelineConfig, settings: ControllerSettings) -> dict[str, Any]:
    """``{"executors": n, "changed_after_batch": id | None, ...}``; initial executors when unset."""
    state = _load_json_variable(pipeline.executors_variable) or {}
    executors = state.get("executors", settings.initial_executors)
    if not isinstance(executors, int) or executors < 1:
        raise ValueError(
            f"Variable {pipeline.executors_variable!r}: 'executors' = {executors!r} must be an integer >= 1"
        )
    return {
        "executors": executors,
        "changed_after_batch": state.get("changed_after_batch"),
        **{k: v for k, v in state.items() if k not in ("executors", "changed_after_batch")},
    }


def save_executor_target(pipeline: PipelineConfig, state: dict[str, Any]) -> None:
    Variable.set(
        pipeline.executors_variable,
        json.dumps(state, sort_keys=True),
        description=f"Executor target of pipeline {pipeline.name} (written by the scale task).",
    )


def save_maintenance(pipeline: PipelineConfig, state: dict[str, Any]) -> None:
    Variable.set(
        pipeline.maintenance_variable,
        json.dumps(state, sort_keys=True),
        description=f"The last maintenance of pipeline {pipeline.name}'s table (written by the maintenance task).",
    )


def last_maintenance(pipeline: PipelineConfig) -> dict[str, Any] | None:
    """The last maintenance of the pipeline's table (:func:`save_maintenance`), as a batch's Asset
    event names it (:func:`maintenance_summary`); None where the pipeline has no maintenance or
    none has run. Never fails a batch (it is read after the batch's commit): a Variable that
    cannot be read or does not parse is logged and named None."""
    if pipeline.maintenance is None:
        return None
    try:
        text = Variable.get(pipeline.maintenance_variable, default=None)
        return maintenance_summary(json.loads(text)) if text else None
    except Exception as e:  # noqa: BLE001 - a field of the event; the batch is committed already
        log.warning(
            "Variable %s could not be read as a maintenance report (%s): the batch's event names none",
            pipeline.maintenance_variable,
            e,
        )
        return None


def maintenance_summary(state: dict[str, Any]) -> dict[str, Any]:
    """The run, its time, and for the pipeline's table (the first of ``tables``) the version it
    left (a Delta version, an Iceberg snapshot id) and what its compaction replaced."""
    table = state["tables"][0]
    return {
        "run_id": state.get("run_id"),
        "at": state.get("at"),
        "version": table.get("version"),
        "files_removed": int(table.get("files_removed", 0)),
        "files_added": int(table.get("files_added", 0)),
    }


def ledger_for(pipeline: PipelineConfig) -> Ledger:
    return LedgerHook(pipeline.ledger_conn_id).get_conn()


def kafka_for(pipeline: PipelineConfig) -> KafkaOffsets:
    return KafkaOffsetsHook(pipeline.kafka_conn_id, timeout_s=pipeline.kafka_timeout_s).get_conn()


def commit_progress(pipeline: PipelineConfig, ledger: Ledger, kafka: KafkaOffsets) -> dict[str, int]:
    """Commit the consumer group up to the contiguous done offsets of the pipeline's topics.

    Only forward: while a finished batch is being rewritten (a cleared run) its ranges are not done,
    but what the group already committed was durably written, so the commit never moves back.

    Topics deleted and created again since the newest plan are left out (their watermarks belong to
    the old topic's offsets).

    Record and replay may commit at once: each reads the group's position, then commits past it.
    The whole read-compare-commit runs under the pipeline's ledger lock (:func:`commit_lock`), so a
    slower caller holding an older view can never commit after, and under, a newer one."""
    with commit_lock(pipeline, ledger):
        done = {
            tp: o
            for tp, o in ledger.committable_offsets(pipeline.name).items()
            if tp.topic in pipeline.topics
        }
        known = ledger.known_topic_ids(pipeline.name)
        if done and known:
            # a topic deleted and created again since the newest plan: the ledger's watermarks are the
            # old topic's offsets and must not land on the new one (the next plan decides what to do)
            changed = changed_topics(known, kafka.topic_ids(sorted({tp.topic for tp in done})))
            if changed:
                log.warning(
                    "Pipeline %s: topic(s) %s were deleted and created again since the newest plan: the group is "
                    "not committed for them (the next plan applies on_topic_reset=%r)",
                    pipeline.name,
                    {t: f"{old} -> {new}" for t, (old, new) in changed.items()},
                    pipeline.on_topic_reset,
                )
                done = {tp: o for tp, o in done.items() if tp.topic not in changed}
        current = kafka.committed_offsets(pipeline.group, list(done)) if done else {}
        forward = {tp: o for tp, o in done.items() if o > current.get(tp, -1)}
        kafka.commit_offsets(pipeline.group, forward)
    return {str(tp): o for tp, o in forward.items()}


def commit_lock(pipeline: PipelineConfig, ledger: Ledger) -> Any:
    """The ledger lock around a consumer-group commit of ``pipeline``. Its holder makes at most two
    bounded broker calls, so waiting for it is bounded by a few broker timeouts."""
    return ledger_lock(
        ledger, f"{pipeline.name}:group-commit", timeout_s=4 * pipeline.kafka_timeout_s + ledger.timeout_s
    )


def table_lock_name(pipeline: PipelineConfig) -> str | None:
    """The ledger lock of the pipeline's table (:func:`~..sinks.commit_lock_name`), or None when
    its batches need none."""
    return commit_lock_name(
        pipeline.sink_format, pipeline.sink, pipeline.spark_conf, maintained=pipeline.maintenance is not None
    )


def sink_lock_wait_s(pipeline: PipelineConfig) -> float:
    """How long a batch waits for its sink's commit lock (:func:`sink_commit_lock`): as long as
    another batch's job may hold it (the batch timeout, plus the bound for stopping and marking it)
    or the table's maintenance (its timeout); 0 when the pipeline's sink needs no lock. The DAGs'
    task timeouts add it."""
    if table_lock_name(pipeline) is None:
        return 0.0
    maintenance = 0.0 if pipeline.maintenance is None else pipeline.maintenance.timeout_s
    return max(pipeline.batch_task_timeout, maintenance)


def _lock_reason(pipeline: PipelineConfig) -> str:
    """Why the batches into the pipeline's table hold its ledger lock, for messages."""
    reason = sink_format_for(pipeline.sink_format, pipeline.sink_options.job_options()).commit_lock_reason(
        pipeline.sink, pipeline.spark_conf
    )
    if reason is not None:
        return f"batches into this table run one at a time because {reason}"
    return (
        f"the table's maintenance (the DAG {pipeline.maintain_dag_id}) compacts it between batches, never "
        "beside one"
    )


def sink_commit_lock(
    pipeline: PipelineConfig,
    ledger: Ledger,
    batch_id: int,
    *,
    while_waiting: Any = None,
    every_s: float = 30.0,
) -> AbstractContextManager[Any]:
    """The ledger lock of the pipeline's table, held around a batch's job when the sink format's
    commits into it are not safe among concurrent Spark drivers
    (:meth:`~..sinks.SinkFormat.commit_lock_reason`: Delta on S3) or the table has a maintenance
    DAG; a no-op otherwise. One lock per table (its normalized URI): ingest, replay and cleared
    runs, of any pipeline sharing the ledger, and the maintenance write it one at a time.
    ``while_waiting`` renews the batch's lease while it waits."""
    name = table_lock_name(pipeline)
    if name is None:
        return nullcontext()
    wait = sink_lock_wait_s(pipeline)
    return ledger_lock(
        ledger,
        name,
        timeout_s=wait,
        while_waiting=while_waiting,
        every_s=every_s,
        held_by=(
            f"batch {batch_id} of pipeline {pipeline.name!r} waited {wait:g} s for another batch's job or the "
            f"table's maintenance in {pipeline.sink} to end, and it goes on: {_lock_reason(pipeline)}. The batch "
            "is failed and replayable. Look for a hung batch job writing this table (ingest, replay or a cleared "
            "run, of this or another pipeline on this ledger) or a hung maintenance task; for Delta on S3, a "
            "LogStore that is safe among drivers (S3DynamoDBLogStore: spark.delta.logStore.s3a.impl in the "
            "pipeline's spark_conf) lets batches run side by side"
        ),
    )


def maintenance_lock(pipeline: PipelineConfig, ledger: Ledger) -> AbstractContextManager[Any]:
    """The ledger lock of the pipeline's table, held by its maintenance: it waits as long as a
    batch's job may hold it."""
    name = table_lock_name(pipeline)
    assert name is not None, "a maintained table always has a lock"
    wait = pipeline.batch_task_timeout
    return ledger_lock(
        ledger,
        name,
        timeout_s=wait,
        held_by=(
            f"the maintenance of {pipeline.sink} waited {wait:g} s (a batch's task timeout) for a batch's job into "
            "the table to end, and it goes on; nothing was changed. Look for a hung batch job writing this table; "
            "the next maintenance run tries again"
        ),
    )


def state_lock(pipeline: PipelineConfig, ledger: Ledger, variable: str) -> Any:
    """The ledger lock around a read-modify-write of one of the pipeline's state Variables (the
    controller state, the executor target): concurrent record or scale tasks (a backfill, a cleared
    run beside the scheduled one) then apply their updates one after the other and none is lost."""
    return ledger_lock(ledger, f"{pipeline.name}:variable:{variable}")


def refuse_backfill(pipeline: PipelineConfig, dag_run: Any) -> None:
    """Fail (without retries) when the ingest DAG runs as part of a backfill.

    A backfill creates runs that Airflow runs concurrently with the scheduled ones (``max_active_runs``
    does not bound them). Each ingest run plans the *next* offsets from the ledger's heads, not
    offsets belonging to its logical date, so backfill runs would only race the scheduled runs for
    the same new data and never re-process the past. Past batches are re-processed by the replay DAG."""
    run_type = str(getattr(dag_run, "run_type", "") or "").lower()
    if "backfill" not in run_type:
        return
    from airflow.sdk.exceptions import AirflowFailException

    raise AirflowFailException(
        f"Pipeline {pipeline.name!r}: the ingest DAG {pipeline.ingest_dag_id!r} does not take backfills (run "
        f"{getattr(dag_run, 'run_id', '?')!r}). Its runs read the topics forward from where the ledger's last "
        "batch ended, not by date, so backfill runs would race the scheduled runs and re-process nothing. "
        f"Failed or abandoned batches are re-processed, with their original ranges, by the replay DAG "
        f"{pipeline.replay_dag_id!r}; to rewrite one past batch, clear its original ingest run (it reuses its "
        "stored plan). Cancel this backfill."
    )
