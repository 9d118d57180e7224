"""Value objects shared by the planner, the Spark job, the ledger and the operators.

Pure Python: no Airflow, Spark or Kafka imports, so the Spark driver and the control core can use
them. Every object round-trips through a JSON-safe ``to_dict()`` / ``from_dict()``; the two that
tasks pass each other by XCom (:class:`BatchPlan` from the plan task, :class:`BatchMetrics` from
the ingest task) also through ``to_xcom()`` / ``from_xcom()``, which names the task and key of a
malformed payload.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, TypeVar

#: How a batch's data is written (``options["writer"]``): ``spark`` — Spark's Parquet writer, after
#: the transform if any; ``arrow`` — each reading task writes its range with pyarrow, no transform
#: (:mod:`.spark.arrow_writer`); ``auto`` — ``arrow`` where it applies (:func:`chosen_writer`),
#: ``spark`` otherwise.
WRITERS = ("auto", "spark", "arrow")
DEFAULT_WRITER = "auto"


def writer_problem(
    writer: str, transform: str | None, reader: str, reader_feeds_arrow: bool, *, decoded: bool = False
) -> str | None:
    """What is wrong with ``writer`` for a pipeline with ``transform`` and ``reader`` (None: nothing);
    ``reader_feeds_arrow``: the reader (or ``auto``) can feed the arrow writer; ``decoded``: the
    pipeline decodes its keys or values (a format other than raw). One rule for the pipelines file
    and the batch job."""
    if writer not in WRITERS:
        return f"use one of {', '.join(WRITERS)}"
    if writer == "arrow" and decoded:
        return (
            "writer 'arrow' writes the raw records the Python reader read, and this pipeline decodes them "
            "(key_format or value_format is not raw): use writer 'auto' or 'spark'"
        )
    if writer == "arrow" and (transform is not None or not reader_feeds_arrow):
        return (
            "writer 'arrow' writes the raw records the Python reader read: it takes no transform and reader "
            f"'auto' or 'python' (got transform={transform!r}, reader={reader!r}); remove the transform and use "
            "reader 'auto' or 'python', or use writer 'spark'"
        )
    return None


def chosen_writer(
    writer: str,
    transform: str | None,
    reader_feeds_arrow: bool,
    arrow_codec: bool = True,
    *,
    decoded: bool = False,
) -> str:
    """The writer a batch uses: ``writer`` itself unless it is ``auto``, which is ``arrow`` for the
    raw records (no transform, nothing ``decoded``) of a reader that feeds it (``reader_feeds_arrow``:
    the chosen reader's) in a codec pyarrow writes (``arrow_codec``), else ``spark``."""
    if writer != "auto":
        return writer
    return "arrow" if transform is None and not decoded and reader_feeds_arrow and arrow_codec else "spark"


#: Defaults of what a pipeline's batch job does, declared here once for the pipeline's fields
#: (:class:`~.pipeline.PipelineConfig`) and the job spec (:class:`JobSpec`).
DEFAULT_READER = "auto"
DEFAULT_SINK_FORMAT = "parquet"
DEFAULT_STALL_TIMEOUT_S = 120.0


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


_Range = TypeVar("_Range", bound="OffsetRange")


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets ``[from_offset, until_offset)`` of one topic-partition, as in Spark's OffsetRange."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    def __post_init__(self) -> None:
        if not self.topic:
            raise ValueError("OffsetRange.topic must be a non-empty string")
        if self.partition < 0:
            raise ValueError(f"OffsetRange {self.topic}: partition must be >= 0, got {self.partition}")
        if self.from_offset < 0:
            raise ValueError(f"OffsetRange {self.tp}: from_offset must be >= 0, got {self.from_offset}")
        if self.until_offset < self.from_offset:
            raise ValueError(
                f"OffsetRange {self.tp}: until_offset {self.until_offset} is below "
                f"from_offset {self.from_offset}"
            )

    @cached_property
    def tp(self) -> TopicPartition:
        """The range's topic-partition (made once: a plan of 10,000 ranges asks for it ~7 times each)."""
        return TopicPartition(self.topic, self.partition)

    @property
    def count(self) -> int:
        """Offsets covered. On real Kafka, compaction and transaction markers make records <= count."""
        return self.until_offset - self.from_offset

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "from_offset": self.from_offset,
            "until_offset": self.until_offset,
        }

    @classmethod
    def from_dict(cls: type[_Range], d: dict[str, Any]) -> _Range:
        return cls(str(d["topic"]), int(d["partition"]), int(d["from_offset"]), int(d["until_offset"]))

    def __str__(self) -> str:
        return f"{self.tp}[{self.from_offset}, {self.until_offset})"


@dataclass(frozen=True, order=True)
class DataLoss(OffsetRange):
    """Offsets that retention deleted before they were read: ``[from_offset, until_offset)``."""

    @property
    def lost(self) -> int:
        return self.count


#: The key of a task's return value, the XCom its ``execute()`` pushes.
RETURN_VALUE_KEY = "return_value"


class XComPayloadError(ValueError):
    """An XCom that is not the payload its task pushes (missing, not a dict, a field missing or of
    the wrong type); the message names the task and key."""


_Payload = TypeVar("_Payload")


def _from_xcom(
    what: str, from_dict: Callable[[dict[str, Any]], _Payload], value: object, task_id: str, key: str
) -> _Payload:
    """``from_dict(value)`` for an XCom pushed by ``task_id`` under ``key``: one way (a JSON-safe
    dict, as ``to_xcom()`` pushed it), or :class:`XComPayloadError` naming the task and key."""
    where = f"XCom {key!r} of task {task_id!r}"
    if value is None:
        raise XComPayloadError(f"{where} is missing: the task pushed no {what} (did it run and succeed?)")
    if not isinstance(value, Mapping):
        shown = repr(value)
        shown = shown if len(shown) <= 200 else shown[:200] + "…"
        raise XComPayloadError(f"{where} is not {what}: expected a dict, got {type(value).__name__} {shown}")
    try:
        return from_dict(dict(value))
    except KeyError as e:
        raise XComPayloadError(f"{where} is not {what}: no field {e}") from e
    except (TypeError, ValueError) as e:
        raise XComPayloadError(f"{where} is not {what}: {type(e).__name__}: {e}") from e


def batch_path(sink: str, batch_id: int) -> str:
    """Where a batch's output lives: one directory per batch, keyed by its id (Hive style)."""
    return f"{sink.rstrip('/')}/batch_id={int(batch_id)}"


@dataclass(frozen=True)
class BatchPlan:
    """The offset ranges of one micro-batch and how they were chosen."""

    pipeline: str
    batch_id: int
    run_id: str
    ranges: tuple[OffsetRange, ...]
    sink: str
    batch_interval_ms: int
    planned_at_ms: int
    rate: float | None = None
    data_loss: tuple[DataLoss, ...] = ()
    lag: int | None = None  # records between the ranges' ends and the latest offsets when planned
    # Kafka's topic id of each topic when planned: a topic deleted and created again keeps its name
    # but not its id (its offsets restart), so a rerun, a replay or a commit can tell (plans made
    # before topic ids were recorded have none).
    topic_ids: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranges", tuple(sorted(self.ranges)))
        object.__setattr__(self, "topic_ids", dict(sorted(dict(self.topic_ids).items())))
        seen: set[TopicPartition] = set()
        for r in self.ranges:
            if r.tp in seen:
                raise ValueError(f"BatchPlan {self.batch_id}: two ranges for {r.tp}")
            seen.add(r.tp)

    @property
    def records(self) -> int:
        """Upper bound of the records the batch reads (the sum of range sizes)."""
        return sum(r.count for r in self.ranges)

    @property
    def output_path(self) -> str:
        return batch_path(self.sink, self.batch_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "batch_id": self.batch_id,
            "run_id": self.run_id,
            "ranges": [r.to_dict() for r in self.ranges],
            "sink": self.sink,
            "batch_interval_ms": self.batch_interval_ms,
            "planned_at_ms": self.planned_at_ms,
            "rate": self.rate,
            "data_loss": [d.to_dict() for d in self.data_loss],
            "lag": self.lag,
            "topic_ids": dict(self.topic_ids),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchPlan:
        return cls(
            pipeline=str(d["pipeline"]),
            batch_id=int(d["batch_id"]),
            run_id=str(d["run_id"]),
            ranges=tuple(OffsetRange.from_dict(r) for r in d["ranges"]),
            sink=str(d["sink"]),
            batch_interval_ms=int(d["batch_interval_ms"]),
            planned_at_ms=int(d["planned_at_ms"]),
            rate=None if d.get("rate") is None else float(d["rate"]),
            data_loss=tuple(DataLoss.from_dict(x) for x in d.get("data_loss", ())),
            lag=None if d.get("lag") is None else int(d["lag"]),
            topic_ids={str(k): str(v) for k, v in (d.get("topic_ids") or {}).items()},
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> BatchPlan:
        return cls.from_dict(json.loads(s))

    def to_xcom(self) -> dict[str, Any]:
        """The plan task's return value."""
        return self.to_dict()

    @classmethod
    def from_xcom(cls, value: object, *, task_id: str, key: str = RETURN_VALUE_KEY) -> BatchPlan:
        """The plan ``task_id`` pushed under ``key`` (:class:`XComPayloadError` if malformed)."""
        return _from_xcom("a batch plan", cls.from_dict, value, task_id, key)


@dataclass(frozen=True)
class PartitionCount:
    topic: str
    partition: int
    records: int

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "records": self.records}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PartitionCount:
        return cls(str(d["topic"]), int(d["partition"]), int(d["records"]))


@dataclass(frozen=True)
class BatchMetrics:
    """What the bounded job measured. Times are epoch milliseconds.

    ``processing_ms`` is the job's wall time from launch (the operator starting spark-submit) to the
    sink commit: start-up is real cost per interval, so the controller settles on a sustainable rate.
    """

    batch_id: int
    records: int
    bytes: int
    launched_at_ms: int
    read_started_at_ms: int
    committed_at_ms: int
    executors: int
    partitions: tuple[PartitionCount, ...] = ()
    #: the batch's output was already committed by an earlier attempt and taken over (no read)
    adopted: bool = False
    #: records of ``records`` that did not decode: committed to the error table, not the sink's rows
    bad_records: int = 0
    #: what a reader needs to read the sink as the batch's commit left it (a table's version)
    read_at: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def processing_ms(self) -> int:
        return self.committed_at_ms - self.launched_at_ms

    @property
    def startup_ms(self) -> int:
        """Launch to the read's start (client and session start, adoption and bounds checks): the
        part of ``processing_ms`` every batch pays whatever its size."""
        return min(max(self.read_started_at_ms - self.launched_at_ms, 0), max(self.processing_ms, 0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "records": self.records,
            "bytes": self.bytes,
            "launched_at_ms": self.launched_at_ms,
            "read_started_at_ms": self.read_started_at_ms,
            "committed_at_ms": self.committed_at_ms,
            "processing_ms": self.processing_ms,
            "executors": self.executors,
            "partitions": [p.to_dict() for p in self.partitions],
            "adopted": self.adopted,
            "bad_records": self.bad_records,
            "read_at": self.read_at,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchMetrics:
        return cls(
            batch_id=int(d["batch_id"]),
            records=int(d["records"]),
            bytes=int(d["bytes"]),
            launched_at_ms=int(d["launched_at_ms"]),
            read_started_at_ms=int(d["read_started_at_ms"]),
            committed_at_ms=int(d["committed_at_ms"]),
            executors=int(d["executors"]),
            partitions=tuple(PartitionCount.from_dict(p) for p in d.get("partitions", ())),
            adopted=bool(d.get("adopted", False)),
            bad_records=int(d.get("bad_records") or 0),
            read_at=dict(d["read_at"]) if isinstance(d.get("read_at"), dict) else None,
        )

    def to_xcom(self) -> dict[str, Any]:
        """The ingest task's return value."""
        return self.to_dict()

    @classmethod
    def from_xcom(cls, value: object, *, task_id: str, key: str = RETURN_VALUE_KEY) -> BatchMetrics:
        """The metrics ``task_id`` pushed under ``key`` (:class:`XComPayloadError` if malformed)."""
        return _from_xcom("batch metrics", cls.from_dict, value, task_id, key)


@dataclass(frozen=True)
class Adoption:
    """What a replay may take over instead of reading again: a sink version of this pipeline's
    batch committed for exactly its planned ``ranges`` (or for the ranges the replay itself would
    write), with every file it lists present at its listed size — whichever earlier attempt wrote
    it: the replay has claimed the batch, so no newer attempt is live. A worker that died between
    the sink swap and marking the batch leaves exactly that. ``token``: the batch's last owner in
    the ledger, for messages. ``refusal``: the replay may not read (retention or a topic reset took
    offsets and the pipeline's policy is to fail): the job adopts, or fails with this message."""

    token: str
    ranges: tuple[OffsetRange, ...]
    refusal: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "ranges": [r.to_dict() for r in self.ranges], "refusal": self.refusal}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Adoption:
        refusal = d.get("refusal")
        return cls(
            str(d["token"]),
            tuple(OffsetRange.from_dict(r) for r in d["ranges"]),
            None if refusal is None else str(refusal),
        )


def new_token() -> str:
    """A fresh attempt token (it names the attempt's staging directory in the sink)."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class JobSpec:
    """Everything the bounded Spark job needs for one attempt at a batch.

    ``kafka`` holds librdkafka-style client properties (see :mod:`.kafka.config`); it may hold
    credentials. ``token`` names this attempt (its staging directory in the sink). ``min_partitions``
    is the read parallelism asked for (input partitions; large ranges are split to reach it).
    ``options``: the pipeline's ``reader_options`` and ``sink_options`` as one flat dict
    (:mod:`.batch_options`: ``client``, ``max_records_per_partition``, ``max_records_per_batch``,
    ``writer`` (:data:`WRITERS`), ``parquet_compression``, ``parquet_plain_columns``).
    """

    plan: BatchPlan
    kafka: dict[str, Any]
    launched_at_ms: int
    token: str = field(default_factory=new_token)
    reader: str = DEFAULT_READER  # "auto" or a reader of spark.readers.READERS
    transform: str | None = None  # "package.module:function", DataFrame -> DataFrame
    poll_timeout_ms: int = 1000
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    min_partitions: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: the ledger's attempt number of this attempt (fences the sink commit; None: unfenced)
    attempt: int | None = None
    adopt: Adoption | None = None
    #: how the batch lands in the sink: a format of ``sinks.SINK_FORMATS``
    sink_format: str = DEFAULT_SINK_FORMAT
    #: the file of the Spark Connect session holding ``kafka``'s secret values, which then go into
    #: no plan (``spark/session_secrets.py``); None: the plans stay on the driver (submit engine)
    secrets_file: str | None = None
    #: how the records' key and value are decoded (``decoders.Decoding.to_dict()``: the prepared
    #: decoder specs — schema text, never a registry URL or credential — and the bad-record bound);
    #: None: Kafka's raw columns, as read
    decoding: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.reader or not isinstance(self.reader, str):
            raise ValueError(f"reader must be 'auto' or a reader's name; got {self.reader!r}")
        if self.transform is not None and ":" not in self.transform:
            raise ValueError(f"transform must look like 'package.module:function', got {self.transform!r}")
        if not self.token or not all(c.isalnum() or c in "-_" for c in self.token):
            raise ValueError(
                f"token must be a non-empty string of letters, digits, '-', '_'; got {self.token!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "kafka": dict(self.kafka),
            "launched_at_ms": self.launched_at_ms,
            "token": self.token,
            "reader": self.reader,
            "transform": self.transform,
            "poll_timeout_ms": self.poll_timeout_ms,
            "stall_timeout_s": self.stall_timeout_s,
            "min_partitions": self.min_partitions,
            "options": dict(self.options),
            "attempt": self.attempt,
            "adopt": None if self.adopt is None else self.adopt.to_dict(),
            "sink_format": self.sink_format,
            "secrets_file": self.secrets_file,
            "decoding": self.decoding,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSpec:
        return cls(
            plan=BatchPlan.from_dict(d["plan"]),
            kafka=dict(d["kafka"]),
            launched_at_ms=int(d["launched_at_ms"]),
            token=str(d.get("token") or new_token()),
            reader=str(d.get("reader", DEFAULT_READER)),
            transform=d.get("transform"),
            poll_timeout_ms=int(d.get("poll_timeout_ms", 1000)),
            stall_timeout_s=float(d.get("stall_timeout_s", DEFAULT_STALL_TIMEOUT_S)),
            min_partitions=None if d.get("min_partitions") is None else int(d["min_partitions"]),
            options=dict(d.get("options", {})),
            attempt=None if d.get("attempt") is None else int(d["attempt"]),
            adopt=None if not d.get("adopt") else Adoption.from_dict(d["adopt"]),
            sink_format=str(d.get("sink_format") or DEFAULT_SINK_FORMAT),
            secrets_file=d.get("secrets_file"),
            decoding=d.get("decoding") or None,
        )
