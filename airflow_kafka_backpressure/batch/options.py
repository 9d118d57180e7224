"""A pipeline's typed reader and sink options: ``reader_options`` (how the Python reader's tasks
read Kafka) and ``sink_options`` (how a batch's files are written).

Each option is declared once here (type, default, allowed values, meaning): the pipelines file is
checked against it (an unknown key or a wrong value fails with the key named), the configuration
reference of the docs is rendered from it, and the batch job gets the options as a flat dict
(:meth:`ReaderOptions.job_options`, :meth:`SinkOptions.job_options`; the job's side is
:mod:`.spark.readers` and :mod:`.spark.job`). Pure Python: no Spark, pyarrow or Kafka import.

``writer``, ``parquet_compression`` and ``parquet_plain_columns`` were ``reader_options`` keys
before ``sink_options`` existed; found there they are moved to ``sink_options`` with a warning.
"""

from __future__ import annotations

import logging
import math
import re
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from airflow_kafka_backpressure.batch.models import DEFAULT_WRITER, WRITERS

log = logging.getLogger(__name__)

#: The Python reader's Kafka clients: ``auto`` takes confluent-kafka where it is installed.
CLIENT_AUTO, CLIENT_CONFLUENT, CLIENT_KAFKA_PYTHON = "auto", "confluent", "kafka-python"
CLIENTS = (CLIENT_AUTO, CLIENT_CONFLUENT, CLIENT_KAFKA_PYTHON)
DEFAULT_CLIENT = CLIENT_AUTO
#: No input partition of the Python reader covers more offsets than this (as Spark's Kafka source's
#: ``maxRecordsPerPartition``); 0: no limit. Why this default, measured here
# (2 shared cores; single-range and 40-piece timings): every extra input partition
# costs ~0.1 s inside read() (consumer start, metadata, close) plus ~0.2-0.3 s of Spark's own
# per-task work for a Python Data Source under load, while one task reads ~100k-250k records/s
# with confluent-kafka. At 200,000 offsets per piece that fixed cost stays a small share of each
# task, the prefetch librdkafka throws away past a piece's end (<= 20,000 messages) stays <= 10%,
# and a hot partition of a million offsets is still read by five tasks at once.
DEFAULT_MAX_RECORDS_PER_PARTITION = 200_000
#: Rows per Arrow record batch a Python reader task hands to Spark (the reader option
#: ``arrow_batch_rows``, which was ``max_records_per_batch`` before: the settings key of that name
#: caps the records of a whole batch).
DEFAULT_ARROW_BATCH_ROWS = 10_000
#: The Parquet codecs Spark's writer takes (``spark.sql.parquet.compression.codec``); writer
#: ``arrow`` takes those pyarrow writes and refuses the others when the batch runs.
PARQUET_CODECS = ("none", "uncompressed", "snappy", "gzip", "lzo", "brotli", "lz4", "lz4_raw", "zstd")
#: Keys that moved from ``reader_options`` to ``sink_options``.
MOVED_TO_SINK_OPTIONS = ("writer", "parquet_compression", "parquet_plain_columns")
#: ``reader_options`` keys renamed: old name -> new name (the old one still read, with a warning).
RENAMED_READER_OPTIONS = {"max_records_per_batch": "arrow_batch_rows"}


def _option(default: Any, *, doc: str, allowed: str, check: Callable[[Any], str | None]) -> Any:
    """One option: its default, doc and allowed values (rendered in the docs) and its check (None:
    valid; else what is wrong)."""
    return field(default=default, metadata={"doc": doc, "allowed": allowed, "check": check})


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else f"use one of {', '.join(choices)}"

    return check


def _int_at_least(least: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"an integer >= {least} (got {type(value).__name__})"
        return None if value >= least else f"must be >= {least}"

    return check


def _codec(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.lower() in PARQUET_CODECS):
        return None
    return f"use one of {', '.join(PARQUET_CODECS)}, or null for Spark's default (snappy)"


def _columns(value: Any) -> str | None:
    if value is None or (isinstance(value, (list, tuple)) and all(isinstance(c, str) and c for c in value)):
        return None
    return "a list of column names, or null for the sink's default"


#: ``partition_by``: a transform of a column, as Iceberg writes it
PARTITION_BY = re.compile(r"^(day|hour)\(([A-Za-z_][A-Za-z0-9_]*)\)$")


def _partition_by(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and PARTITION_BY.match(value)):
        return None
    return "day(<column>) or hour(<column>), e.g. day(timestamp), or null"


def _optional_text(value: Any) -> str | None:
    return None if value is None or (isinstance(value, str) and value) else "a non-empty string, or null"


def _name(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value and value.replace("_", "a").isalnum() and not value[0].isdigit():
        return None
    return "letters, digits and underscores, not starting with a digit"


class _Options:
    """What both option sets share: made from a JSON object with every key checked, and handed to
    the batch job as a flat dict."""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            problem = f.metadata["check"](value)
            if problem:
                raise ValueError(f"{self.section}.{f.name} = {value!r} is invalid: {problem}")

    section: typing.ClassVar[str]

    @classmethod
    def from_mapping(cls, value: Any) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{cls.section} must be a JSON object, got {type(value).__name__} {value!r:.80}")
        known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise ValueError(f"{cls.section}: unknown key(s) {unknown}; allowed: {known}")
        return cls(**value)

    def job_options(self) -> dict[str, Any]:
        """The options the batch job reads (``JobSpec.options``): those set to other than null."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if v is not None}  # type: ignore[call-overload]


@dataclass(frozen=True)
class ReaderOptions(_Options):
    section: typing.ClassVar[str] = "reader_options"

    client: str = _option(
        DEFAULT_CLIENT,
        doc="the Kafka client of the Python reader's tasks: auto takes confluent-kafka where it is installed",
        allowed=", ".join(CLIENTS),
        check=_one_of(CLIENTS),
    )
    max_records_per_partition: int = _option(
        DEFAULT_MAX_RECORDS_PER_PARTITION,
        doc="no input partition of the Python reader covers more offsets than this (as Spark's Kafka source's maxRecordsPerPartition); 0: no limit",
        allowed=">= 0",
        check=_int_at_least(0),
    )
    arrow_batch_rows: int = _option(
        DEFAULT_ARROW_BATCH_ROWS,
        doc="rows per Arrow record batch a Python reader task hands to Spark (was max_records_per_batch, still read with a warning)",
        allowed=">= 1",
        check=_int_at_least(1),
    )


@dataclass(frozen=True)
class SinkOptions(_Options):
    section: typing.ClassVar[str] = "sink_options"

    writer: str = _option(
        DEFAULT_WRITER,
        doc="how a batch's Parquet files are written: spark (Spark's writer, after the transform), arrow (each Python reader task writes its range with pyarrow; no transform, reader auto or python, sink_format parquet), auto (arrow where it applies, else spark)",
        allowed=", ".join(WRITERS),
        check=_one_of(WRITERS),
    )
    parquet_compression: str | None = _option(
        None,
        doc="the Parquet codec of the batch's files; null: snappy",
        allowed=", ".join(PARQUET_CODECS) + " or null",
        check=_codec,
    )
    parquet_plain_columns: tuple[str, ...] | None = _option(
        None,
        doc="columns written without dictionary encoding (the Parquet-directory sink); null: key and value",
        allowed="a list of column names or null",
        check=_columns,
    )

    partition_by: str | None = _option(
        None,
        doc="table sinks (delta, iceberg): the batch's rows partitioned by the UTC day or hour of a timestamp column, day(timestamp) or hour(kafka_timestamp) or day(<a decoded field>); Delta gets a kbp_day (DATE) or kbp_hour (TIMESTAMP) partition column, Iceberg a hidden partition; fixed when the table is created; null: none",
        allowed="day(<column>), hour(<column>) or null",
        check=_partition_by,
    )
    iceberg_catalog_uri: str | None = _option(
        None,
        doc="sink_format iceberg: the SQLAlchemy URL of pyiceberg's SQL catalog (sqlite:////data/iceberg.db on one host, postgresql+psycopg2://user@host/db); no password in it: PGPASSWORD or ~/.pgpass on the workers",
        allowed="a URL without a password, or null",
        check=_optional_text,
    )
    iceberg_namespace: str | None = _option(
        None,
        doc="sink_format iceberg: the catalog namespace of the table (named after the sink's last path segment); null: kbp",
        allowed="a name, or null",
        check=_name,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.parquet_plain_columns is not None:  # a JSON list, kept as a tuple (frozen, hashable)
            object.__setattr__(self, "parquet_plain_columns", tuple(self.parquet_plain_columns))


def _number_at_least(least: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"a number >= {least:g} (got {type(value).__name__})"
        return None if math.isfinite(value) and value >= least else f"a finite number >= {least:g}"

    return check


def _column(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value)):
        return None
    return "a column name (letters, digits, '_'), or null"


#: Snapshot and file retention of the maintenance by default: Delta's own default
#: (``delta.deletedFileRetentionDuration``, 7 days).
DEFAULT_RETENTION_HOURS = 168.0


@dataclass(frozen=True)
class MaintenanceOptions(_Options):
    """The table's maintenance (``maintenance`` of a pipeline whose sink is a table format): the
    DAG ``kbp_maintain_<name>`` compacts small files, expires old snapshots and removes files no
    snapshot within the retention needs (``sinks/maintenance.py``)."""

    section: typing.ClassVar[str] = "maintenance"

    schedule: str = _option(
        "@daily",
        doc="when the maintenance DAG kbp_maintain_<name> runs: a cron expression or an Airflow preset",
        allowed="a cron expression or @hourly, @daily, @weekly…",
        check=_optional_text,
    )
    retention_hours: float = _option(
        DEFAULT_RETENTION_HOURS,
        doc="snapshots (Iceberg), files no longer referenced (Delta VACUUM, Iceberg orphans) and Delta's per-batch transaction ids older than this are dropped; never shorter than the longest a batch can be in flight (checked when the DAGs load, docs/sinks.md)",
        allowed=">= 1 and >= the pipeline's longest batch in flight",
        check=_number_at_least(1),
    )
    target_file_mb: int = _option(
        128,
        doc="compaction merges each partition's small files into files of about this size",
        allowed=">= 1",
        check=_int_at_least(1),
    )
    sort_by: str | None = _option(
        None,
        doc="compaction orders rows by this column (Delta: Z-order by it; Iceberg: sorted files), so a filter on it reads fewer files; null: insertion order",
        allowed="a column name or null",
        check=_column,
    )
    timeout_minutes: float = _option(
        60.0,
        doc="the maintenance task's bound; batches of the table wait for it (it holds the table's ledger lock)",
        allowed=">= 1",
        check=_number_at_least(1),
    )

    @property
    def retention_s(self) -> float:
        return float(self.retention_hours) * 3600.0

    @property
    def target_file_bytes(self) -> int:
        return int(self.target_file_mb) * 1024 * 1024

    @property
    def timeout_s(self) -> float:
        return float(self.timeout_minutes) * 60.0


def split_reader_options(value: Any, pipeline: str) -> tuple[Any, dict[str, Any]]:
    """``reader_options`` as given, with renamed keys under their new names and without the keys
    that moved to ``sink_options``, and those keys (each change with a warning naming it). Anything
    but a JSON object is returned as it is, for :meth:`ReaderOptions.from_mapping` to refuse."""
    if not isinstance(value, Mapping):
        return value, {}
    renamed = {old: new for old, new in RENAMED_READER_OPTIONS.items() if old in value}
    both = sorted(old for old, new in renamed.items() if new in value)
    if both:
        raise ValueError(
            f"pipeline {pipeline!r}: reader_options has both {both} and their new names "
            f"{[RENAMED_READER_OPTIONS[k] for k in both]}; keep the new names only"
        )
    if renamed:
        _deprecated(
            f"pipeline {pipeline!r}: reader_options key(s) renamed: "
            + ", ".join(f"{old!r} is now {new!r}" for old, new in sorted(renamed.items()))
            + " (the settings Variable's max_records_per_batch caps a whole batch; this option sizes "
            "the Python reader's Arrow record batches)"
        )
        value = {renamed.get(k, k): v for k, v in value.items()}
    moved = {k: value[k] for k in MOVED_TO_SINK_OPTIONS if k in value}
    if not moved:
        return value, {}
    _deprecated(
        f"pipeline {pipeline!r}: reader_options key(s) {sorted(moved)} moved to sink_options; "
        f"write them as sink_options: {moved!r}"
    )
    return {k: v for k, v in value.items() if k not in moved}, moved


def _deprecated(message: str) -> None:
    warnings.warn(message, DeprecationWarning, stacklevel=4)
    log.warning("%s", message)
