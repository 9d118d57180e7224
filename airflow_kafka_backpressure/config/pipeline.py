"""What a pipeline is: topics, consumer group, sink, batch interval, connections, policies.

One :class:`PipelineConfig` drives both DAGs of a pipeline (ingest and replay) and names its
Variables. Pure Python: no Airflow import.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.batch.models import (
    DEFAULT_READER,
    DEFAULT_SINK_FORMAT,
    DEFAULT_STALL_TIMEOUT_S,
    writer_problem,
)
from airflow_kafka_backpressure.batch.options import (
    MaintenanceOptions,
    ReaderOptions,
    SinkOptions,
    split_reader_options,
)
from airflow_kafka_backpressure.config.checks import (
    SECONDS,
    check_decoding,
    check_maintenance,
    check_timing,
    check_types,
)
from airflow_kafka_backpressure.config.sink_placement import sharing_problems
from airflow_kafka_backpressure.control.allocation import ON_DATA_LOSS, ON_TOPIC_RESET, STARTING_OFFSETS
from airflow_kafka_backpressure.decoders import DECODERS, DEFAULT_FORMAT, RecordDecoder
from airflow_kafka_backpressure.decoders.decoding import BOUND_RULE, field_decoders
from airflow_kafka_backpressure.engines import ENGINES
from airflow_kafka_backpressure.sinks import SINK_FORMATS, sink_format_names
from airflow_kafka_backpressure.spark.readers import feeds_arrow_writer, reader_names
from airflow_kafka_backpressure.storage import is_absolute_location

#: Environment variable naming the pipelines file (JSON: a list, or {"pipelines": [...]}).
PIPELINES_FILE_ENV = "KBP_PIPELINES_FILE"

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
#: A batch's lease: how long after its worker's last sign of life it counts as abandoned (``lease_s``).
DEFAULT_LEASE_S = 120.0
#: The least time a planned batch waits for its ingest task (:attr:`PipelineConfig.planned_lease_s`).
MIN_PLANNED_LEASE_S = 60.0
#: Default batch timeout: this many batch intervals, but never less than MIN_BATCH_TIMEOUT_S.
BATCH_TIMEOUT_INTERVALS = 5
MIN_BATCH_TIMEOUT_S = 600.0
#: A planned/running batch with no activity this long counts as abandoned (when ``stale_after_s`` is unset).
DEFAULT_STALE_AFTER_S = 24 * 3600.0


#: Batches of a pipeline the ledger keeps by default (``ledger_keep_batches``): about a week at 60 s.
DEFAULT_LEDGER_KEEP_BATCHES = 10_000


def _field(default: Any = MISSING, *, doc: str, allowed: str = "", factory: Any = MISSING) -> Any:
    """One pipeline field: its default and its doc and allowed values (which validation in
    ``__post_init__`` enforces), read by the configuration reference of the docs."""
    return field(default=default, default_factory=factory, metadata={"doc": doc, "allowed": allowed})


@dataclass(frozen=True)
class PipelineConfig:
    name: str = _field(
        doc="the pipeline's name; its DAGs are kbp_ingest_<name> and kbp_replay_<name>, its Variables kbp.<name>.*",
        allowed="letters, digits, '_', '.', '-' (at most 100; not starting with '.' or '-')",
    )
    topics: tuple[str, ...] = _field(
        doc="the Kafka topics the pipeline reads", allowed="a list of topic names, at least one"
    )
    sink: str = _field(
        doc="where batches are written: the directory or table of the sink_format",
        allowed="an absolute path or a URI (hdfs://…, s3://…); object stores are refused at plan time for "
        + ", ".join(f.name for f in SINK_FORMATS.values() if f.needs_directory_renames),
    )
    batch_interval_s: float = _field(
        60.0, doc="seconds between batches: the ingest DAG's schedule", allowed=">= 1"
    )
    group_id: str | None = _field(
        None, doc="consumer group the progress is committed to; null: kbp-<name>", allowed="a string or null"
    )
    kafka_conn_id: str = _field("kafka_default", doc="the Kafka connection (conn type kafka)")
    engine: str = _field(
        "submit",
        doc="submit: spark-submit per batch; connect: a long-lived Spark Connect server",
        allowed=", ".join(ENGINES),
    )
    spark_conn_id: str = _field("spark_default", doc="submit engine: the Spark connection (conn type spark)")
    spark_connect_conn_id: str = _field(
        "spark_connect_default", doc="connect engine: the Spark Connect connection (conn type spark_connect)"
    )
    ledger_conn_id: str | None = _field(
        None,
        doc="the ledger's connection (kbp_ledger, postgres or generic); null: a SQLite file under AIRFLOW_HOME",
    )
    starting_offsets: str = _field(
        "earliest",
        doc="where a partition seen for the first time starts when its consumer group has no committed offset",
        allowed=", ".join(STARTING_OFFSETS),
    )
    on_data_loss: str = _field(
        "fail",
        doc="offsets deleted by retention before they were read: fail names them; skip records them as lost",
        allowed=", ".join(ON_DATA_LOSS),
    )
    on_topic_reset: str = _field(
        "fail",
        doc="a topic deleted and created again: fail plans nothing for it; earliest archives the old topic's rows and reads the new one from its start",
        allowed=", ".join(ON_TOPIC_RESET),
    )
    sink_format: str = _field(
        DEFAULT_SINK_FORMAT,
        doc="how batches land in the sink: " + " or ".join(f.reference() for f in SINK_FORMATS.values()),
        allowed=", ".join(sink_format_names()),
    )
    reader: str = _field(
        DEFAULT_READER,
        doc="how the Spark job reads Kafka: native is Spark's format('kafka'), python the package's Data Source, auto the first that can read the batch",
        allowed=", ".join(reader_names()),
    )
    transform: str | None = _field(
        None,
        doc="a function applied to each batch's DataFrame before the sink",
        allowed="'package.module:function' or null",
    )
    key_format: str = _field(
        DEFAULT_FORMAT,
        doc="how each record's key is decoded into typed columns (docs/record-formats.md); raw keeps Kafka's bytes",
        allowed=", ".join(DECODERS),
    )
    key_options: dict[str, Any] = _field(
        factory=dict, doc="the key_format's options (record formats below)", allowed="an object"
    )
    value_format: str = _field(
        DEFAULT_FORMAT,
        doc="how each record's value is decoded into typed columns (docs/record-formats.md); raw keeps Kafka's bytes",
        allowed=", ".join(DECODERS),
    )
    value_options: dict[str, Any] = _field(
        factory=dict, doc="the value_format's options (record formats below)", allowed="an object"
    )
    schema_registry_conn_id: str | None = _field(
        None,
        doc="the Schema Registry connection (conn type schema_registry) the avro format, and the json format "
        "without a declared schema, read schemas from; its credentials stay on the Airflow worker",
        allowed="a connection id, or null when no format reads the registry",
    )
    max_bad_records: int | float | None = _field(
        None,
        doc="records that do not decode go to the error table beside the sink, committed with the batch; above "
        "this bound the batch fails, naming the first bad offsets, and nothing of it is committed",
        allowed=BOUND_RULE,
    )
    keep_raw_value: bool = _field(
        False, doc="a decoded value keeps its raw bytes too, as the column kafka_value"
    )
    executor_cores: int = _field(1, doc="cores per executor (spark.executor.cores)", allowed=">= 1")
    executor_memory: str | None = _field(None, doc="spark.executor.memory, e.g. '4g'; null: Spark's default")
    driver_memory: str | None = _field(None, doc="spark.driver.memory; null: Spark's default")
    spark_conf: dict[str, str] = _field(
        factory=dict, doc="more Spark settings for each batch", allowed="an object of strings"
    )
    stall_timeout_s: float = _field(
        DEFAULT_STALL_TIMEOUT_S,
        doc="a read that makes no progress this long fails the batch",
        allowed="> 0 and shorter than the batch timeout",
    )
    batch_timeout_s: float | None = _field(
        None,
        doc="a batch's Spark work is stopped after this many seconds; null: 5 batch intervals, at least 600 s",
        allowed="> 0 or null",
    )
    reader_options: ReaderOptions = _field(
        factory=ReaderOptions,
        doc="how the Python reader's tasks read Kafka: a JSON object of the reader_options keys below",
        allowed="an object of the keys below",
    )
    sink_options: SinkOptions = _field(
        factory=SinkOptions,
        doc="how a batch's files are written: a JSON object of the sink_options keys below",
        allowed="an object of the keys below",
    )
    replay_interval_s: float | None = _field(
        None,
        doc="how often the replay DAG looks for failed batches; null: 5 batch intervals",
        allowed=">= 1 or null",
    )
    stale_after_s: float | None = _field(
        None,
        doc="a batch planned or running this long without finishing is replayable; null: 24 hours",
        allowed="> the batch timeout, or null",
    )
    lease_s: float | None = _field(
        None,
        doc="a running batch whose worker showed no sign of life this long is replayable; null: 120 s",
        allowed="> 0 or null",
    )
    kafka_timeout_s: float = _field(
        30.0, doc="bound of each broker call of the plan, record and replay tasks", allowed="> 0"
    )
    task_timeout_s: float | None = _field(
        None,
        doc="execution_timeout of the plan, record and scale tasks; null: max(2 batch intervals, 10 × kafka_timeout_s)",
        allowed="> 0 or null",
    )
    replay_deferrable: bool = _field(
        True, doc="the replay sensor waits in the triggerer, not in a worker slot"
    )
    sink_on_shared_filesystem: bool = _field(
        False,
        doc="a local sink path under a Spark master whose executors may run on other hosts is refused at plan "
        "time (each host would write to its own disk); true says the path is one shared filesystem (NFS …) "
        "mounted at the same place on every host",
    )
    ledger_keep_batches: int | None = _field(
        DEFAULT_LEDGER_KEEP_BATCHES,
        doc="the record task prunes this pipeline's finished batches beyond the newest N from the ledger "
        "(never past a partition's commit or head, never an unfinished batch); null: keep every batch",
        allowed=">= 1 or null",
    )
    ledger_keep_days: float | None = _field(
        None,
        doc="with pruning, only batches that ended more than this many days ago are deleted; null: no age limit",
        allowed="> 0 or null",
    )
    ledger_keep_losses_days: float | None = _field(
        None,
        doc="recorded losses (offsets deleted by retention or a topic reset before they were read, abandoned "
        "batches) stay in the ledger and on the monitoring page when their batches are pruned; with a number, "
        "the record task deletes those recorded more than this many days ago whose batch was pruned; null: "
        "keep every recorded loss",
        allowed="> 0 or null",
    )
    maintenance: MaintenanceOptions | None = _field(
        None,
        doc="table sinks (delta, iceberg): the maintenance DAG kbp_maintain_<name> (compaction, snapshot expiry, "
        "removal of unreferenced files), a JSON object of the maintenance keys below; null: no maintenance DAG",
        allowed="a JSON object or null",
    )
    start_date: str = _field("2026-01-01", doc="the DAGs' start_date (ISO date)")
    tags: tuple[str, ...] = _field((), doc="extra DAG tags", allowed="a list of strings")

    def __post_init__(self) -> None:
        def bad(key: str, value: Any, rule: str) -> ValueError:
            return ValueError(f"pipeline {self.name!r}: {key} = {value!r} is invalid: {rule}")

        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise bad("name", self.name, "use letters, digits, '_', '.', '-' (at most 100)")
        topics = (self.topics,) if isinstance(self.topics, str) else tuple(self.topics)
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise bad("topics", self.topics, "give a list of strings with at least one topic name")
        object.__setattr__(self, "topics", topics)
        object.__setattr__(self, "tags", tuple(self.tags))
        self._typed_options()
        check_types(self, bad)
        if not self.sink:
            raise bad("sink", self.sink, "give a path or Hadoop URI for the output")
        if not is_absolute_location(self.sink):
            raise bad(
                "sink",
                self.sink,
                "use an absolute path or a URI (/data/orders, s3://bucket/orders): a relative path means a "
                "different directory to the Airflow worker, the Spark driver and each executor",
            )
        for key in SECONDS:
            value = getattr(self, key)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise bad(key, value, "must be a finite number of seconds > 0")
        check_timing(self, bad)
        if self.starting_offsets not in STARTING_OFFSETS:
            raise bad("starting_offsets", self.starting_offsets, f"one of {STARTING_OFFSETS}")
        if self.on_data_loss not in ON_DATA_LOSS:
            raise bad("on_data_loss", self.on_data_loss, f"one of {ON_DATA_LOSS}")
        if self.on_topic_reset not in ON_TOPIC_RESET:
            raise bad("on_topic_reset", self.on_topic_reset, f"one of {ON_TOPIC_RESET}")
        if self.engine not in ENGINES:
            raise bad("engine", self.engine, f"one of {', '.join(ENGINES)}")
        if self.reader not in reader_names():
            raise bad("reader", self.reader, f"one of {', '.join(reader_names())}")
        if self.transform is not None and ":" not in self.transform:
            raise bad("transform", self.transform, "use 'package.module:function'")
        if self.sink_format not in sink_format_names():
            raise bad("sink_format", self.sink_format, f"one of {', '.join(sink_format_names())}")
        decoders = check_decoding(self, bad)
        writer = self.sink_options.writer
        problem = writer_problem(
            writer, self.transform, self.reader, feeds_arrow_writer(self.reader), decoded=bool(decoders)
        )
        fmt = SINK_FORMATS[self.sink_format]
        problem = problem or fmt().writer_problem(writer)
        if problem:
            raise bad("sink_options.writer", writer, problem)
        option = fmt.options_problem(self.sink_options.job_options())
        if option is not None:
            key, shown, why = option
            raise bad(f"sink_options.{key}", shown, f"{why} (sink_format {self.sink_format!r})")
        check_maintenance(self, bad, DEFAULT_LEASE_S)
        if self.executor_cores < 1:
            raise bad("executor_cores", self.executor_cores, "must be >= 1")
        if self.ledger_keep_batches is not None and self.ledger_keep_batches < 1:
            raise bad(
                "ledger_keep_batches", self.ledger_keep_batches, "must be >= 1 (or null: keep every batch)"
            )
        if self.ledger_keep_days is not None and not (
            math.isfinite(self.ledger_keep_days) and self.ledger_keep_days > 0
        ):
            raise bad(
                "ledger_keep_days", self.ledger_keep_days, "must be a finite number of days > 0 (or null)"
            )
        if self.ledger_keep_losses_days is not None and not (
            math.isfinite(self.ledger_keep_losses_days) and self.ledger_keep_losses_days > 0
        ):
            raise bad(
                "ledger_keep_losses_days",
                self.ledger_keep_losses_days,
                "must be a finite number of days > 0 (or null: keep every recorded loss)",
            )

    @property
    def longest_batch_in_flight_s(self) -> float:
        """The longest a batch's attempt can be between its plan and its commit: its plan waits for
        its ingest task (:attr:`planned_lease_s`), its job runs (:attr:`batch_task_timeout`), and
        a worker that died mid-job keeps the attempt in flight until its lease ends. The table's
        maintenance keeps what such an attempt reads for at least this long."""
        return self.planned_lease_s + self.batch_task_timeout + (self.lease_s or DEFAULT_LEASE_S)

    @property
    def maintain_dag_id(self) -> str:
        return f"kbp_maintain_{self.name}"

    # ----- derived names ----------------------------------------------------------------------
    def decoders(self) -> dict[str, RecordDecoder]:
        """The decoder of each field whose format is not ``raw`` (empty: Kafka's raw columns)."""
        return field_decoders(
            {"key": (self.key_format, self.key_options), "value": (self.value_format, self.value_options)}
        )

    @property
    def planned_lease_s(self) -> float:
        """How long a planned batch may wait for its ingest task to claim it before the replay DAG
        may take it over (the plan or the ingest task died in between): the batch lease, but at
        least two batch intervals and :data:`MIN_PLANNED_LEASE_S` (a task queued behind a busy
        executor is late, not dead)."""
        return max(self.lease_s or DEFAULT_LEASE_S, 2 * self.batch_interval_s, MIN_PLANNED_LEASE_S)

    @property
    def group(self) -> str:
        return self.group_id or f"kbp-{self.name}"

    @property
    def batch_interval_ms(self) -> int:
        return int(round(self.batch_interval_s * 1000))

    @property
    def batch_timeout(self) -> float:
        """Seconds a batch's Spark work may run: ``batch_timeout_s``, else
        ``BATCH_TIMEOUT_INTERVALS`` batch intervals but at least ``MIN_BATCH_TIMEOUT_S``."""
        if self.batch_timeout_s is not None:
            return float(self.batch_timeout_s)
        return max(BATCH_TIMEOUT_INTERVALS * self.batch_interval_s, MIN_BATCH_TIMEOUT_S)

    @property
    def control_task_timeout(self) -> float:
        """``execution_timeout`` (s) of the plan, record and scale tasks: ``task_timeout_s``, else two
        batch intervals, but at least enough for ten broker calls at their bound."""
        if self.task_timeout_s is not None:
            return float(self.task_timeout_s)
        return max(2 * self.batch_interval_s, 10 * self.kafka_timeout_s)

    @property
    def batch_task_timeout(self) -> float:
        """``execution_timeout`` (s) of a task that runs one batch: the batch's own timeout (its Spark
        work is stopped there) plus the control tasks' bound for submitting, marking and cleaning up."""
        return self.batch_timeout + self.control_task_timeout

    @property
    def settings_variable(self) -> str:
        """Gains and limits (JSON), edited by users."""
        return f"kbp.{self.name}.settings"

    @property
    def controller_variable(self) -> str:
        """PID state (JSON), written by the record task."""
        return f"kbp.{self.name}.controller_state"

    @property
    def executors_variable(self) -> str:
        """Executor target (JSON), written by the scale task."""
        return f"kbp.{self.name}.executor_target"

    @property
    def maintenance_variable(self) -> str:
        """The last maintenance's reports (JSON), written by the maintenance task."""
        return f"kbp.{self.name}.maintenance"

    @property
    def ingest_dag_id(self) -> str:
        return f"kbp_ingest_{self.name}"

    @property
    def replay_dag_id(self) -> str:
        return f"kbp_replay_{self.name}"

    # ----- serialisation ----------------------------------------------------------------------
    def _typed_options(self) -> None:
        """``reader_options`` and ``sink_options`` as their types (given as JSON objects); keys
        that moved from ``reader_options`` to ``sink_options`` are moved, with a warning."""
        reader, moved = split_reader_options(self.reader_options, self.name)
        sink: Any = self.sink_options
        if moved:
            if isinstance(sink, SinkOptions):  # what differs from the defaults was given
                defaults = SinkOptions().job_options()
                given = {k: v for k, v in sink.job_options().items() if defaults.get(k) != v}
            else:
                given = dict(sink or {})
            both = sorted(set(moved) & set(given))
            if both:
                raise ValueError(
                    f"pipeline {self.name!r}: {both} given both in reader_options and in sink_options; "
                    "keep them in sink_options only"
                )
            sink = {**given, **moved}
        try:
            object.__setattr__(self, "reader_options", ReaderOptions.from_mapping(reader))
            object.__setattr__(self, "sink_options", SinkOptions.from_mapping(sink))
            if self.maintenance is not None:
                object.__setattr__(self, "maintenance", MaintenanceOptions.from_mapping(self.maintenance))
        except ValueError as e:
            raise ValueError(f"pipeline {self.name!r}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["topics"] = list(self.topics)
        d["tags"] = list(self.tags)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelineConfig:
        if not isinstance(d, dict):
            raise ValueError(
                f"a pipeline must be a JSON object with name, topics and sink; got {type(d).__name__} {d!r:.80}"
            )
        known = set(cls.__dataclass_fields__)
        unknown = sorted(str(k) for k in set(d) - known)
        if unknown:
            raise ValueError(
                f"pipeline {d.get('name')!r}: unknown key(s) {unknown}; allowed: {sorted(known)}"
            )
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(
                f"pipeline {d.get('name')!r}: required key(s) {missing} missing (required: {required})"
            )
        return cls(**d)

    @classmethod
    def load_all(cls, text: str, source: str = "pipelines file") -> list[PipelineConfig]:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}: not valid JSON: {e}") from e
        items = raw.get("pipelines", raw) if isinstance(raw, dict) else raw
        if not isinstance(items, list):
            raise ValueError(f'{source}: expected a list of pipelines or {{"pipelines": [...]}}')
        configs = []
        for i, item in enumerate(items):
            try:
                configs.append(cls.from_dict(item))
            except ValueError as e:
                raise ValueError(f"{source}: pipeline #{i + 1}: {e}") from None
        names = [c.name for c in configs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"{source}: pipeline names must be unique; repeated: {dupes}")
        shared_problems = sharing_problems(configs)
        if shared_problems:
            raise ValueError(f"{source}: " + "; ".join(shared_problems))
        return configs


def load_pipelines(path: str | os.PathLike[str] | None = None) -> list[PipelineConfig]:
    """Pipelines from ``path``, else ``$KBP_PIPELINES_FILE`` (a JSON list, or ``{"pipelines": [...]}``)."""
    path = path or os.environ.get(PIPELINES_FILE_ENV)
    if not path:
        return []
    text = Path(path).read_text()
    return PipelineConfig.load_all(text, source=str(path))
