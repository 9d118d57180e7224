"""The two Kafka clients the range reader can use, behind one small interface.

* ``confluent`` — confluent-kafka (librdkafka), the client of the official Airflow Kafka
  provider: ``consume(num_messages=N)`` hands over whole chunks, and the columns are taken from
  them with C-level ``map`` calls (no per-record Python objects beyond the client's own).
* ``kafka-python`` — pure Python, always installed with this package.
* ``auto`` — confluent-kafka when it can be imported where the read runs (a Spark executor),
  kafka-python otherwise.

Both read one topic-partition from an explicit offset: no consumer group membership, no
commits, no topic auto-creation, ``isolation.level=read_uncommitted`` unless the connection sets
it (the default of Kafka's Java client, Spark's Kafka source and kafka-python), and an error, not
a silent reset, for offsets the broker no longer has. confluent-kafka refuses to create a consumer
without ``group.id``: it gets :data:`READER_GROUP_ID`, which ``assign()`` never joins and nothing
commits to.

A :class:`RangeFetcher` only fetches; :func:`.range_reader.read_range` owns the loop (bounds,
progress, stall timeout, batching).
"""

from __future__ import annotations

import importlib.util
import logging
import operator
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from airflow_kafka_backpressure.batch.models import OffsetRange

# the clients are declared with the pipeline's reader_options; CLIENTS and DEFAULT_CLIENT are
# re-exported for the reader's modules
from airflow_kafka_backpressure.batch.options import CLIENT_AUTO, CLIENT_CONFLUENT, CLIENT_KAFKA_PYTHON
from airflow_kafka_backpressure.batch.options import CLIENTS as CLIENTS
from airflow_kafka_backpressure.batch.options import DEFAULT_CLIENT as DEFAULT_CLIENT
from airflow_kafka_backpressure.kafka.clients import new_client
from airflow_kafka_backpressure.kafka.config import to_confluent, to_kafka_python
from airflow_kafka_backpressure.spark.kafka_arrow import kafka_record_batch

READER_CLIENT_ID = "kbp-range-reader"
READER_GROUP_ID = "kbp-range-reader"  # confluent-kafka requires one; never joined, never committed
DEFAULT_ISOLATION_LEVEL = "read_uncommitted"
# Longest single wait inside confluent's consume(): it returns only when it has num_messages or
# the wait is over, so at the end of a range whose last offsets are not records (transaction
# markers, compaction) a long wait would be spent idle. The read loop checks the position between
# waits.
CONFLUENT_CONSUME_SLICE_S = 0.1
# How long a read waits for its first answer from Kafka (the topic's metadata) before it fails
# with "cannot connect", unless the connection sets socket.connection.setup.timeout.ms.
CONNECT_TIMEOUT_S = 30.0
# How long a failing read may spend asking the broker what is wrong, for its error message.
DIAGNOSIS_TIMEOUT_S = 5.0
# librdkafka fetch settings for reading bounded ranges; a connection's own values win. Measured
# with bench/reader_throughput.py and single-consumer runs here (2 cores):
# * librdkafka prefetches until its queue holds queued.min.messages (default 100,000) messages,
#   then waits fetch.queue.backoff.ms (default 1 s) before fetching again. Past the end of a
#   range that prefetch is thrown away (a range split in 8 cost ~50% more CPU per record), and a
#   lower queued.min.messages alone stalls the read for the 1 s backoff (32k instead of ~250k
#   records/s). 20,000 messages (two Arrow batches) with a 10 ms backoff read a whole partition
#   at ~250k records/s and split ranges with a third less CPU per record than the defaults.
# * 4 MiB per partition fetch (default 1 MiB) took the least broker CPU per record of 1, 4 and
#   16 MiB; queued.max.messages.kbytes bounds the prefetch memory for large records.
CONFLUENT_FETCH_DEFAULTS: dict[str, Any] = {
    "queued.min.messages": 20_000,
    "fetch.queue.backoff.ms": 10,
    "queued.max.messages.kbytes": 16 * 1024,
    "max.partition.fetch.bytes": 4 * 1024 * 1024,
    "fetch.max.bytes": 16 * 1024 * 1024,
}

# Columns are taken from a chunk of records with map() over C-level getters: no Python-level
# loop per record (zip(*records) looks similar but costs several times more on large chunks).
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


class KafkaRangeReadError(RuntimeError):
    """A range could not be read completely; the message names the range and what to do."""


def confluent_available() -> bool:
    """True when confluent-kafka can be imported in this process."""
    return importlib.util.find_spec("confluent_kafka") is not None


def check_client(client: str, *, source: str) -> str:
    """``client`` when it is one of :data:`CLIENTS`; else a ``ValueError`` naming ``source``."""
    if client not in CLIENTS:
        raise ValueError(f"{source}: client must be one of {list(CLIENTS)}, got {client!r}")
    return client


def resolve_client(client: str, *, source: str = "range reader") -> str:
    """``confluent`` or ``kafka-python`` for ``auto | confluent | kafka-python``, in this process."""
    check_client(client, source=source)
    if client == CLIENT_AUTO:
        return CLIENT_CONFLUENT if confluent_available() else CLIENT_KAFKA_PYTHON
    if client == CLIENT_CONFLUENT and not confluent_available():
        raise KafkaRangeReadError(
            f"{source}: client='confluent' but confluent-kafka is not installed where this read runs. "
            "Install it on the Spark executors (pip install 'airflow-provider-kafka-backpressure[confluent]'), "
            "or use client='auto' (falls back to kafka-python) or client='kafka-python'"
        )
    return client


def kafka_python_consumer_config(kafka_props: dict[str, Any], *, source: str) -> dict[str, Any]:
    """kafka-python ``KafkaConsumer`` arguments for reading explicit ranges."""
    cfg = to_kafka_python(kafka_props, source=source)
    cfg.setdefault("client_id", READER_CLIENT_ID)
    cfg.setdefault("isolation_level", DEFAULT_ISOLATION_LEVEL)
    cfg.setdefault("bootstrap_timeout_ms", int(CONNECT_TIMEOUT_S * 1000))
    cfg.update(
        group_id=None, enable_auto_commit=False, auto_offset_reset="none", allow_auto_create_topics=False
    )
    return cfg


def confluent_consumer_config(kafka_props: dict[str, Any], *, source: str) -> dict[str, Any]:
    """confluent-kafka ``Consumer`` configuration for reading explicit ranges."""
    cfg = to_confluent(kafka_props, source=source)
    cfg.setdefault("client.id", READER_CLIENT_ID)
    cfg.setdefault("isolation.level", DEFAULT_ISOLATION_LEVEL)
    for key, value in CONFLUENT_FETCH_DEFAULTS.items():
        cfg.setdefault(key, value)
    cfg.update(
        {
            "group.id": READER_GROUP_ID,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "allow.auto.create.topics": False,
            "enable.partition.eof": False,
            "log.connection.close": False,
        }
    )
    return cfg


def check_reader_config(kafka_props: dict[str, Any], client: str, *, source: str) -> None:
    """Fail early (e.g. on the Spark driver) for a bad ``client`` or bad properties, with the
    same checks the read will apply on the executors (whichever client ``auto`` picks there)."""
    check_client(client, source=source)
    if client in (CLIENT_AUTO, CLIENT_KAFKA_PYTHON):
        kafka_python_consumer_config(kafka_props, source=source)
    if client in (CLIENT_AUTO, CLIENT_CONFLUENT):
        confluent_consumer_config(kafka_props, source=source)


class RangeFetcher(Protocol):
    """One consumer positioned at the start of one range."""

    client: str

    def fetch(self, max_records: int, timeout_s: float) -> list[Any]:
        """Up to ``max_records`` records of the partition, in offset order (may be empty)."""

    def position(self) -> int | None:
        """The offset of the next record the consumer will return (None before it knows)."""

    def to_batch(self, records: list[Any], r: OffsetRange) -> pa.RecordBatch:
        """The records of ``records`` inside ``r`` as an Arrow batch."""

    def diagnose(self, r: OffsetRange) -> Diagnosis:
        """What the broker says about ``r``'s partition (for an error message)."""

    def close(self) -> None: ...


def _inside(records: list[Any], r: OffsetRange, offset_of: Callable[[Any], int]) -> list[Any]:
    """``records`` (offset order) cut to ``[r.from_offset, r.until_offset)``; no copy when all fit."""
    lo = bisect_left(records, r.from_offset, key=offset_of)
    hi = bisect_left(records, r.until_offset, lo=lo, key=offset_of)
    return records if lo == 0 and hi == len(records) else records[lo:hi]


class Diagnosis(NamedTuple):
    """What the broker says about a range's partition; ``explained``: it accounts for a stall."""

    text: str
    explained: bool = False


def _bounds(r: OffsetRange, partitions: set[int] | None, low: int | None, high: int | None) -> Diagnosis:
    if partitions is None:
        return Diagnosis(f"topic {r.topic!r} does not exist (the reader never creates topics)", True)
    if r.partition not in partitions:
        return Diagnosis(
            f"topic {r.topic!r} has no partition {r.partition} (it has {sorted(partitions)})", True
        )
    if high is None or high < 0:
        return Diagnosis(f"the offsets of {r.tp} are unknown")
    held = f"{r.tp} holds offsets [{low if low is not None and low >= 0 else '?'}, {high})"
    if high < r.until_offset:
        return Diagnosis(
            f"{held}: the range ends past the latest offset {high}. The plan must cap until_offset at the "
            "latest offset: re-plan this batch",
            True,
        )
    return Diagnosis(held)


def _require_partition(r: OffsetRange, partitions: set[int] | None) -> None:
    """Raise for a missing topic or partition before the consumer is assigned: assigning an
    unknown topic makes some clients ask for its metadata with auto-creation allowed (kafka-python
    3.0.12 does, whatever ``allow_auto_create_topics`` says, unless built by
    :func:`~airflow_kafka_backpressure.kafka.clients.new_client`, which hands the setting over), and
    a broker that auto-creates topics would then create it."""
    if partitions is None or r.partition not in partitions:
        raise KafkaRangeReadError(f"cannot read {r}: {_bounds(r, partitions, None, None).text}")


# --------------------------------------------------------------------------- confluent-kafka


class ConfluentFetcher:
    client = CLIENT_CONFLUENT

    def __init__(self, r: OffsetRange, kafka_props: dict[str, Any], *, source: str) -> None:
        from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

        self._KafkaError = KafkaError
        self._KafkaException = KafkaException
        # Any: the stubs type offset() and headers() for produced messages too (None before delivery,
        # str values); a consumed message has both
        self._Message: Any = Message
        cfg = confluent_consumer_config(kafka_props, source=source)
        self._servers = cfg["bootstrap.servers"]
        self._errors: list[Any] = []  # client-level errors, reported during consume()
        self.last_error: Any = None
        cfg["error_cb"] = self._errors.append
        cfg["logger"] = logging.getLogger("airflow_kafka_backpressure.librdkafka")
        try:
            self._consumer = Consumer(cfg)
        except (KafkaException, ValueError, TypeError) as e:
            raise KafkaRangeReadError(
                f"{source}: librdkafka refused the Kafka configuration: {e}. Fix the connection's properties"
            ) from e
        self._tp = TopicPartition(r.topic, r.partition)
        self._range = r
        connect_timeout_s = cfg.get("socket.connection.setup.timeout.ms", CONNECT_TIMEOUT_S * 1000) / 1000
        try:
            _require_partition(r, self._first_metadata(r.topic, connect_timeout_s))
        except BaseException:
            self._consumer.close()
            raise
        self._consumer.assign([TopicPartition(r.topic, r.partition, r.from_offset)])

    def _partitions(self, topic: str, timeout_s: float = DIAGNOSIS_TIMEOUT_S) -> set[int] | None:
        """The topic's partitions (None: no such topic); a metadata request for this topic only,
        which librdkafka sends with auto-creation off."""
        meta = self._consumer.list_topics(topic=topic, timeout=timeout_s)
        found = meta.topics.get(topic)
        return None if found is None or found.error is not None else set(found.partitions)

    def _first_metadata(self, topic: str, timeout_s: float) -> set[int] | None:
        """:meth:`_partitions`, retried in short waits so that a refused login fails at once and an
        unreachable broker after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._partitions(topic, min(1.0, max(0.05, deadline - time.monotonic())))
            except self._KafkaException as e:
                self._consumer.poll(0)  # serves the error callback
                self._check_client_errors()
                if time.monotonic() >= deadline:
                    last = f"; the client last reported {self.last_error.str()}" if self.last_error else ""
                    raise KafkaRangeReadError(
                        f"cannot connect to Kafka at {self._servers!r} to read {self._range} within "
                        f"{timeout_s:g}s ({e.args[0].str() if e.args else e}{last}). Check bootstrap.servers, "
                        "the network and the connection's security settings (security.protocol, sasl.*, "
                        "ssl.*); socket.connection.setup.timeout.ms sets the wait"
                    ) from e

    def _check_client_errors(self) -> None:
        if not self._errors:
            return
        errors, self._errors[:] = list(self._errors), []
        self.last_error = errors[-1]
        KafkaError = self._KafkaError
        for e in errors:
            if e.fatal() or e.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
                raise KafkaRangeReadError(
                    f"cannot read {self._range}: Kafka at {self._servers!r} refused the connection "
                    f"({e.name()}: {e.str()}). Check security.protocol, sasl.* and ssl.* of the connection"
                )

    def fetch(self, max_records: int, timeout_s: float) -> list[Any]:
        msgs = self._consumer.consume(
            num_messages=max_records, timeout=min(timeout_s, CONFLUENT_CONSUME_SLICE_S)
        )
        self._check_client_errors()
        if msgs and any(map(self._Message.error, msgs)):
            for m in msgs:
                err = m.error()
                if err is not None and err.code() != self._KafkaError._PARTITION_EOF:
                    self._raise_message_error(err)
            msgs = [m for m in msgs if m.error() is None]
        return msgs

    def _raise_message_error(self, err: Any) -> None:
        r = self._range
        hint = "Check the topic, the connection's permissions (Read on the topic) and the broker's health"
        if err.code() in (self._KafkaError._AUTO_OFFSET_RESET, self._KafkaError.OFFSET_OUT_OF_RANGE):
            hint = (
                "The range's offsets are no longer (or not yet) on the broker: retention may have deleted "
                "them before they were read. Re-plan the batch from the partition's current offsets and "
                "record the data loss"
            )
        raise KafkaRangeReadError(f"reading {r}: Kafka reported {err.name()}: {err.str()}. {hint}")

    def position(self) -> int | None:
        [tp] = self._consumer.position([self._tp])
        return tp.offset if tp.offset >= 0 else None

    def to_batch(self, records: list[Any], r: OffsetRange) -> pa.RecordBatch:
        M = self._Message
        msgs = _inside(records, r, M.offset)
        stamps = list(map(M.timestamp, msgs))  # (type, ms) pairs
        # confluent's timestamp types: 0 none, 1 create time, 2 log-append time; Spark's: -1, 0, 1
        return kafka_record_batch(
            r.topic,
            r.partition,
            keys=list(map(M.key, msgs)),
            values=list(map(M.value, msgs)),
            offsets=list(map(M.offset, msgs)),
            timestamp_ms=list(map(_SECOND, stamps)),
            timestamp_type=pc.subtract(pa.array(list(map(_FIRST, stamps)), pa.int32()), 1),
            headers=list(map(M.headers, msgs)),
        )

    def diagnose(self, r: OffsetRange) -> Diagnosis:
        try:
            partitions = self._partitions(r.topic)
            low = high = None
            if partitions is not None and r.partition in partitions:
                low, high = self._consumer.get_watermark_offsets(self._tp, cached=True)
                if high < 0:  # nothing fetched yet: ask the broker
                    low, high = self._consumer.get_watermark_offsets(self._tp, timeout=DIAGNOSIS_TIMEOUT_S)
            found = _bounds(r, partitions, low, high)
        except self._KafkaException as e:
            found = Diagnosis(f"it did not answer a metadata request ({e})")
        if self._errors:
            self.last_error = self._errors[-1]
        if self.last_error is None:
            return found
        err = self.last_error
        return found._replace(text=f"{found.text}; the client last reported {err.name()}: {err.str()}")

    def close(self) -> None:
        self._consumer.close()


# --------------------------------------------------------------------------- kafka-python

# getters of kafka-python's ConsumerRecord namedtuple fields
_OFFSET, _TIMESTAMP, _TIMESTAMP_TYPE, _KEY, _VALUE, _HEADERS = (
    operator.itemgetter(i) for i in (3, 4, 5, 6, 7, 8)
)


class KafkaPythonFetcher:
    client = CLIENT_KAFKA_PYTHON

    def __init__(self, r: OffsetRange, kafka_props: dict[str, Any], *, source: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        cfg = kafka_python_consumer_config(kafka_props, source=source)
        self._range = r
        try:
            self._consumer = new_client(KafkaConsumer, **cfg)
        except Exception as e:
            raise KafkaRangeReadError(
                f"cannot connect to Kafka at {cfg.get('bootstrap_servers')!r} to read {r}: "
                f"{type(e).__name__}: {e}. Check bootstrap.servers, the network and the connection's "
                "security settings (security.protocol, sasl.*, ssl.*); socket.connection.setup.timeout.ms "
                "bounds the wait"
            ) from e
        self._tp = TopicPartition(r.topic, r.partition)
        try:
            try:
                partitions = self._partitions(r.topic)
            except Exception as e:
                raise KafkaRangeReadError(
                    f"cannot read {r}: Kafka at {cfg.get('bootstrap_servers')!r} did not answer a metadata "
                    f"request ({type(e).__name__}: {e}). Check the broker's health and the connection's "
                    "permissions (Describe on the topic)"
                ) from e
            _require_partition(r, partitions)
        except BaseException:
            self._consumer.close()
            raise
        self._consumer.assign([self._tp])
        self._consumer.seek(self._tp, r.from_offset)

    def _partitions(self, topic: str) -> set[int] | None:
        """The topic's partitions (None: no such topic), from cluster-wide metadata, which does
        not create topics."""
        found = self._consumer.partitions_for_topic(topic)
        return set(found) if found else None

    def fetch(self, max_records: int, timeout_s: float) -> list[Any]:
        from kafka.errors import KafkaError

        try:
            polled = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as e:
            raise KafkaRangeReadError(
                f"reading {self._range}: Kafka reported {type(e).__name__}: {e}. If the offsets are no "
                "longer on the broker (retention), re-plan the batch from the partition's current offsets "
                "and record the data loss; otherwise check the connection's permissions and the broker"
            ) from e
        return polled.get(self._tp, [])

    def position(self) -> int | None:
        return self._consumer.position(self._tp)

    def to_batch(self, records: list[Any], r: OffsetRange) -> pa.RecordBatch:
        recs = _inside(records, r, _OFFSET)
        return kafka_record_batch(
            r.topic,
            r.partition,
            keys=list(map(_KEY, recs)),
            values=list(map(_VALUE, recs)),
            offsets=list(map(_OFFSET, recs)),
            timestamp_ms=list(map(_TIMESTAMP, recs)),
            timestamp_type=list(map(_TIMESTAMP_TYPE, recs)),
            headers=list(map(_HEADERS, recs)),
        )

    def diagnose(self, r: OffsetRange) -> Diagnosis:
        try:
            partitions = self._partitions(r.topic)
            low = high = None
            if partitions is not None and r.partition in partitions:
                high = self._consumer.highwater(self._tp)  # from fetch responses, when there were any
                if high is None:
                    timeout_ms = int(DIAGNOSIS_TIMEOUT_S * 1000)
                    low = self._consumer.beginning_offsets([self._tp], timeout_ms=timeout_ms)[self._tp]
                    high = self._consumer.end_offsets([self._tp], timeout_ms=timeout_ms)[self._tp]
            return _bounds(r, partitions, low, high)
        except Exception as e:  # diagnosis is best effort; the stall itself is the error
            return Diagnosis(f"it did not answer a metadata request ({type(e).__name__}: {e})")

    def close(self) -> None:
        self._consumer.close()


def open_fetcher(client: str, r: OffsetRange, kafka_props: dict[str, Any], *, source: str) -> RangeFetcher:
    """A fetcher of the resolved ``client`` positioned at ``r.from_offset``."""
    resolved = resolve_client(client, source=source)
    cls = ConfluentFetcher if resolved == CLIENT_CONFLUENT else KafkaPythonFetcher
    return cls(r, kafka_props, source=source)
