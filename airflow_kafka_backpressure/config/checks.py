"""The checks of a pipeline's fields against each other and their declared types: each names the
key, the value and the fix. :class:`~.pipeline.PipelineConfig` runs them when it is built.

Each takes the pipeline (a ``PipelineConfig``, typed ``Any`` here: this module is imported by
``pipeline.py``) and ``bad``, its function that builds the error naming the key. Pure Python: no
Airflow import.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import fields
from typing import Any

from airflow_kafka_backpressure.decoders import DECODERS, DecoderError, RecordDecoder
from airflow_kafka_backpressure.decoders.decoding import bound_problem
from airflow_kafka_backpressure.sinks import SINK_FORMATS

#: Fields holding seconds: each a finite number > 0 (or null where the field allows it).
SECONDS = (
    "batch_interval_s",
    "stall_timeout_s",
    "batch_timeout_s",
    "replay_interval_s",
    "stale_after_s",
    "kafka_timeout_s",
    "task_timeout_s",
    "lease_s",
)
#: Shortest schedule the DAG factory builds (batch and replay interval).
MIN_INTERVAL_S = 1.0


def check_timing(p: Any, bad: Any) -> None:
    """The timing fields against each other: each rule keeps a wait that would never fire, or a
    replay that would race a batch still inside its own time bound, out of the pipelines file."""
    if p.batch_interval_s < MIN_INTERVAL_S:
        raise bad("batch_interval_s", p.batch_interval_s, f"must be at least {MIN_INTERVAL_S:g} s")
    if p.replay_interval_s is not None and p.replay_interval_s < MIN_INTERVAL_S:
        raise bad(
            "replay_interval_s",
            p.replay_interval_s,
            f"must be at least {MIN_INTERVAL_S:g} s (or null: every 5 batch intervals)",
        )
    timeout = p.batch_timeout
    if p.stall_timeout_s >= timeout:
        raise bad(
            "stall_timeout_s",
            p.stall_timeout_s,
            f"must be shorter than the batch timeout ({timeout:g} s, batch_timeout_s or its default): a read "
            "that stalls would be killed by the batch timeout before the stall is reported. Lower it, or raise "
            "batch_timeout_s",
        )
    if p.stale_after_s is not None and p.stale_after_s <= timeout:
        raise bad(
            "stale_after_s",
            p.stale_after_s,
            f"must be longer than the batch timeout ({timeout:g} s): a batch still running inside its time bound "
            "would be taken as abandoned and replayed while it writes. Raise it above batch_timeout_s, or lower "
            "batch_timeout_s",
        )


def check_decoding(p: Any, bad: Any) -> dict[str, RecordDecoder]:
    """The record formats, their options, the registry and the bad-record bound; returns the
    decoders of the fields that are decoded."""
    for name in ("key", "value"):
        fmt = getattr(p, f"{name}_format")
        if fmt not in DECODERS:
            raise bad(
                f"{name}_format",
                fmt,
                f"use one of {', '.join(DECODERS)} (protobuf has no decoder yet: docs/limitations.md)",
            )
    try:
        decoders = p.decoders()
    except DecoderError as e:
        raise ValueError(f"pipeline {p.name!r}: {e}") from None
    registry_users = [f"{n}_format {d.name!r}" for n, d in decoders.items() if d.uses_registry()]
    if registry_users and not p.schema_registry_conn_id:
        raise bad(
            "schema_registry_conn_id",
            p.schema_registry_conn_id,
            f"{' and '.join(registry_users)} {'read' if len(registry_users) > 1 else 'reads'} schemas from a "
            "schema registry: name a connection of type "
            "schema_registry (Admin -> Connections)",
        )
    problem = bound_problem(p.max_bad_records)
    if problem:
        raise bad("max_bad_records", p.max_bad_records, problem)
    return decoders


def check_types(p: Any, bad: Any) -> None:
    """Every field has the JSON type its annotation says (numbers for floats, no booleans for
    numbers), so a pipelines file with ``"batch_interval_s": "60"`` fails with the key named."""
    hints = typing.get_type_hints(type(p))
    for f in fields(p):
        value = getattr(p, f.name)
        hint = hints[f.name]
        allowed = (
            typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        )
        if value is None and type(None) in allowed:
            continue
        if isinstance(hint, type) and isinstance(value, hint):  # typed options: checked by their type
            continue
        ok = False
        for t in allowed:
            origin = typing.get_origin(t) or t
            if origin is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            elif origin is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif origin is tuple:
                ok = isinstance(value, tuple) and all(isinstance(x, str) for x in value)
            elif origin is dict:
                ok = isinstance(value, dict) and all(isinstance(k, str) for k in value)
                if ok and typing.get_args(t)[1:] == (str,):
                    ok = all(isinstance(v, str) for v in value.values())
            elif origin in (str, bool):
                ok = isinstance(value, origin)
            elif isinstance(origin, type):  # typed options within a union (maintenance)
                ok = isinstance(value, origin)
            if ok:
                break
        if not ok:
            kinds = {
                float: "a number",
                int: "an integer",
                str: "a string",
                bool: "true/false",
                tuple: "a list of strings",
                dict: "an object",
                type(None): "null",
            }
            names = " or ".join(
                "an object of strings"
                if typing.get_args(t)[1:] == (str,)
                else kinds.get(typing.get_origin(t) or t, "an object")
                for t in allowed
            )
            raise bad(f.name, value, f"must be {names}")


def check_maintenance(p: Any, bad: Any, default_lease_s: float) -> None:
    """``maintenance`` needs a table format, and a retention no shorter than a batch's longest
    time in flight (``longest_batch_in_flight_s``; docs/sinks.md, "Maintenance"); ``default_lease_s``:
    the lease of a pipeline that sets none."""
    if p.maintenance is None:
        return
    if not SINK_FORMATS[p.sink_format].maintainable:
        maintained = ", ".join(n for n, f in SINK_FORMATS.items() if f.maintainable)
        raise bad(
            "maintenance",
            p.maintenance.job_options(),
            f"sink_format {p.sink_format!r} has no table to maintain (each batch is its own directory); "
            f"use a table format ({maintained}) or remove maintenance",
        )
    least_h = math.ceil(p.longest_batch_in_flight_s / 360.0) / 10.0  # rounded up to 0.1 h
    if p.maintenance.retention_s < p.longest_batch_in_flight_s:
        raise bad(
            "maintenance.retention_hours",
            p.maintenance.retention_hours,
            f"shorter than the longest a batch can be in flight ({least_h:g} h: its plan waits up to "
            f"{p.planned_lease_s:g} s for its ingest task, its job runs up to {p.batch_task_timeout:g} s, and "
            f"a worker that dies mid-job holds it for its lease of {p.lease_s or default_lease_s:g} s); the "
            "maintenance would delete the files and snapshots such a batch's commit and its replay's checks "
            f"read. Set retention_hours >= {least_h:g}, or lower batch_timeout_s / lease_s",
        )
