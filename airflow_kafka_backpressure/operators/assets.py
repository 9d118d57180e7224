"""The pipeline's sink as an Airflow Asset, and one Asset event per committed batch.

* :func:`sink_asset` — one Asset per pipeline: name ``kbp.<pipeline>.sink``, URI of the sink. A
  local path becomes ``file:///abs/path`` (a bare path is not a URI for Airflow 3.3: it is stored
  as given and no URI handler or OpenLineage conversion applies); ``s3a://``/``s3n://`` become
  ``s3://`` (the same objects; Airflow's and OpenLineage's handlers know ``s3``); other URIs
  (``s3://``, ``gs://``, ``abfss://``, ``hdfs://`` …) are kept.
* :func:`emit_batch_events` — call it from ``execute()`` after the batch's output is swapped in and
  the ledger says so. Each batch becomes one event of the sink Asset with the **partition key**
  ``str(batch_id)``, so a downstream DAG scheduled with ``PartitionedAssetTimetable(assets=...)``
  gets **one run per committed batch** (Airflow 3.3 turns each partition key into its own run; a
  plain ``schedule=[asset]`` would merge events that arrive between two runs, and does not see
  partitioned events at all). A task that commits several batches (the replay operator) emits one
  event per batch: the task SDK's ``outlet_events[asset].add_partitions([...])`` yields one event
  per key, all with the accessor's one ``extra``; that extra therefore holds every batch of the task
  under ``"batches"`` keyed by batch id, and each event's own batch is ``extra["batches"][key]``.
* :func:`triggering_batch` — what a downstream task calls to get exactly the batch its run was
  created for (from ``dag_run.partition_key`` and the triggering event's extra).
* :func:`batch_dataset` — that batch's rows as a ``pyarrow.dataset.Dataset``, without Spark, as its
  sink format reads it (:meth:`~.sinks.SinkFormat.batch_dataset`): the batch's Parquet directory,
  or a Delta table's current version filtered to the batch (read with ``deltalake``, the ``delta``
  extra).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airflow_kafka_backpressure.batch.models import DEFAULT_SINK_FORMAT, OffsetRange
from airflow_kafka_backpressure.sinks import SINK_FORMATS, ParquetSink, UnknownSinkFormat, sink_format_for

SINK_ASSET_GROUP = "kafka-backpressure"


def sink_uri(sink: str) -> str:
    """The Asset URI of a sink path or Hadoop URI (see the module docstring)."""
    parts = urlsplit(sink)
    if not parts.scheme or len(parts.scheme) == 1:  # a path (a drive letter is not a scheme)
        return Path(sink).expanduser().resolve().as_uri()
    if parts.scheme in ("s3a", "s3n"):
        return "s3://" + sink.split("://", 1)[1]
    return sink


def sink_asset_name(pipeline: str) -> str:
    return f"kbp.{pipeline}.sink"


def sink_asset(pipeline: Any) -> Any:
    """The sink Asset of a :class:`~airflow_kafka_backpressure.config.pipeline.PipelineConfig`."""
    from airflow.sdk import Asset

    return Asset(name=sink_asset_name(pipeline.name), uri=sink_uri(pipeline.sink), group=SINK_ASSET_GROUP)


def batch_event_extra(
    batch_id: int,
    ranges: Iterable[OffsetRange],
    records: int,
    *,
    replay: bool,
    output_path: str,
    run_id: str | None = None,
    sink_format: str = DEFAULT_SINK_FORMAT,
    read_at: Mapping[str, Any] | None = None,
    last_maintenance: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One batch as a downstream DAG sees it (JSON-safe): only non-empty ranges are listed.
    ``sink_format``: the pipeline's; ``output_path``: where that format puts the batch
    (:meth:`~.sinks.SinkFormat.event_path`: a Parquet batch's directory; a Delta table, whose rows
    with ``kbp_batch_id`` = the batch id and ``kbp_pipeline`` = the pipeline are the batch).
    ``last_maintenance``: the table's last maintenance when the batch was recorded
    (:func:`~.common.maintenance_summary`; None: the pipeline has none, or none has run)."""
    return {
        "batch_id": int(batch_id),
        "ranges": [r.to_dict() for r in sorted(ranges) if r.count],
        "records": int(records),
        "replay": bool(replay),
        "output_path": output_path,
        "sink_format": sink_format,
        "planned_by_run_id": run_id,
        # the table as the batch's commit left it (a Delta version, an Iceberg snapshot and its
        # metadata file): a downstream task reads exactly that
        "read_at": None if read_at is None else dict(read_at),
        "last_maintenance": None if last_maintenance is None else dict(last_maintenance),
    }


def emit_batch_events(
    context: Mapping[str, Any], pipeline: Any, batches: Iterable[dict[str, Any]]
) -> list[str]:
    """Record one sink-Asset event per committed batch (``batches``: :func:`batch_event_extra` dicts)
    on the running task; the task must declare :func:`sink_asset` in its ``outlets``. Returns the
    partition keys (batch ids) emitted. Events are sent when the task succeeds."""
    asset = sink_asset(pipeline)
    batches = list(batches)
    if not batches:
        return []
    accessor = context["outlet_events"][asset]
    known = dict(accessor.extra.get("batches", {}))
    known.update({str(b["batch_id"]): b for b in batches})
    accessor.extra.update({"pipeline": pipeline.name, "sink": pipeline.sink, "batches": known})
    keys = [str(b["batch_id"]) for b in batches]
    accessor.add_partitions(keys)
    return keys


class NotTriggeredByABatch(LookupError):
    pass


def triggering_batch(context: Mapping[str, Any], pipeline: Any | None = None) -> dict[str, Any]:
    """The batch this run of a downstream DAG was created for: ``{"batch_id", "ranges", "records",
    "replay", "output_path", ...}``. The DAG must be scheduled with
    ``PartitionedAssetTimetable(assets=sink_asset(pipeline))``."""
    dag_run = context["dag_run"]
    key = getattr(dag_run, "partition_key", None)
    if key is None:
        raise NotTriggeredByABatch(
            f"Run {dag_run.run_id!r} has no partition key: it was not created by a sink Asset event. "
            "Schedule the DAG with PartitionedAssetTimetable(assets=sink_asset(pipeline)) and let the "
            "pipeline's batches trigger it."
        )
    events = context["triggering_asset_events"]
    names = {sink_asset_name(pipeline.name)} if pipeline is not None else None
    for asset, asset_events in events.items():
        if names is not None and getattr(asset, "name", None) not in names:
            continue
        for event in reversed(list(asset_events)):
            batch = ((event.extra or {}).get("batches") or {}).get(key)
            if batch is not None:
                return batch
    raise NotTriggeredByABatch(
        f"Run {dag_run.run_id!r} (partition key {key!r}): no triggering sink Asset event describes batch {key}."
    )


def batch_dataset(batch: Mapping[str, Any], pipeline_name: str) -> Any:
    """The rows of ``batch`` (what :func:`triggering_batch` returns) as a ``pyarrow.dataset.Dataset``,
    read without Spark by the batch's sink format (:meth:`~.sinks.SinkFormat.batch_dataset`):

    * ``parquet``: the batch's directory (``output_path``), every file of it;
    * ``delta``: the table at ``output_path`` at the version the batch's commit created (the
      event's ``read_at``; the current version where it names none), filtered to ``kbp_pipeline`` =
      ``pipeline_name`` and ``kbp_batch_id`` = the batch id. Read with ``deltalake`` (delta-rs;
      ``pip install airflow-provider-kafka-backpressure[delta]``); ``s3a://`` is read as ``s3://``
      with the ``AWS_*`` environment (an ``http://`` ``AWS_ENDPOINT_URL`` is allowed);
    * ``iceberg``: the snapshot the batch's commit created (``read_at``), filtered the same way,
      read with pyiceberg from the metadata file the event names, without the catalog.
    """
    # events written before they named their sink format were the Parquet directory's
    name = batch.get("sink_format", ParquetSink.name)
    try:
        fmt = sink_format_for(name)
    except UnknownSinkFormat:
        raise ValueError(
            f"batch {batch.get('batch_id')}: sink_format {name!r} has no reader here; use one of "
            f"{', '.join(SINK_FORMATS)}"
        ) from None
    path, batch_id, read_at = str(batch["output_path"]), int(batch["batch_id"]), batch.get("read_at")
    if read_at is None:
        # only where the commit named one: a format registered before read_at existed (whose
        # batch_dataset takes no such argument) names none and is read as before
        return fmt.batch_dataset(path, pipeline=pipeline_name, batch_id=batch_id)
    return fmt.batch_dataset(path, pipeline=pipeline_name, batch_id=batch_id, read_at=read_at)
