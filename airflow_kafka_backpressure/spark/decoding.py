"""A batch's records decoded inside the job (a pipeline with a ``key_format`` or ``value_format``):
typed rows for the sink, the records that did not decode for its error table, and the checks that
fail the batch before anything is committed.

:class:`DecodedBatch` decodes the DataFrame the reader returned in the JVM
(:func:`~..decoders.frame.decode_frame`) and counts it: records, key + value bytes per range, bad
records, and records of an incompatible schema. Two ways, by the sink format:

* a format that stages its data before a commit of its own (the Parquet directory), with no
  transform: the counts are observed as the rows are written (``DataFrame.observe``), one pass over
  Kafka; :meth:`~DecodedBatch.settle` then checks them between the write and the commit (a refusal
  aborts the staged write) and the bad records are read again only when there are some;
* otherwise (a table whose write is its commit, a transform whose output may not carry the counts):
  the decoded records are persisted and counted by one Spark job before the write, which reads them
  from the cache: Kafka is read once.

The checks: a record written with a schema the reader schema cannot read (an incompatible change)
fails the batch, naming the subject, both versions and the field; more bad records than the
pipeline's ``max_bad_records`` fail it, naming the first bad offsets and why each did not decode.

The rows that land: :func:`~..decoders.frame.query_rows` (a record value's fields as columns,
Kafka's metadata as ``kafka_*``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from airflow_kafka_backpressure.batch.models import JobSpec, OffsetRange
from airflow_kafka_backpressure.decoders import decoder_from_spec
from airflow_kafka_backpressure.decoders.decoding import Decoding, bound_text
from airflow_kafka_backpressure.decoders.frame import (
    REASON,
    bad_rows,
    decode_frame,
    fatal_rows,
    is_fatal,
    query_rows,
)
from airflow_kafka_backpressure.sinks import SetAside
from airflow_kafka_backpressure.sinks.completion import (
    key_value_bytes,
    range_records,
    read_count_aggregates,
    records_by_partition,
)
from airflow_kafka_backpressure.spark.errors import JobError
from airflow_kafka_backpressure.sql_text import ident

#: how many bad records a refusal names
SHOWN_BAD_RECORDS = 5


def _where(row: Any) -> str:
    return f"{row['topic']}-{row['partition']}@{row['offset']}"


def _count_exprs(ranges: Sequence[OffsetRange]) -> list[Any]:
    """Aggregates of a decoded batch: the records of its non-empty ranges
    (:func:`~..sinks.completion.read_count_aggregates`), the key+value bytes, the bad records and
    those of an incompatible schema (each parsed by Spark from SQL text: one call to the JVM
    apiece)."""
    from pyspark.sql import functions as F

    return [
        F.expr(e)
        for e in (
            f"sum({key_value_bytes()}) AS bytes",
            f"count({ident(REASON)}) AS bad",
            f"count(CASE WHEN {is_fatal()} THEN 1 END) AS fatal",
            *read_count_aggregates(ranges),
        )
    ]


class DecodedBatch(SetAside):
    """One batch's decoding (module doc); :meth:`close` releases what it persisted."""

    def __init__(self, spark: Any, spec: JobSpec, read: Any, *, observe: bool) -> None:
        assert spec.decoding is not None
        self.spark, self.spec = spark, spec
        self.decoding = Decoding.from_dict(spec.decoding)
        plan = spec.plan
        self.where = f"batch {plan.batch_id} of pipeline {plan.pipeline!r}"
        self._read = read  # Kafka's rows, for a recount per range (sinks.completion.range_records)
        self.live = [r for r in plan.ranges if r.count > 0]
        self._kept: list[Any] = []
        self._observation: Any = None
        if observe and self.live:
            from pyspark.sql import Observation

            self._observation = Observation()
            decoded = decode_frame(
                read, self.decoding.specs, observe=(self._observation, _count_exprs(self.live))
            )
        else:
            decoded = decode_frame(read, self.decoding.specs)
            if self.live:
                decoded = decoded.persist()
                self._kept.append(decoded)
        self.observed = self._observation is not None
        self.decoded = decoded
        self.rows = query_rows(decoded, keep_raw_value=self.decoding.keep_raw_value)

    def _counts(self) -> Mapping[str, Any]:
        if not self.live:
            return {}
        if self._observation is not None:
            return dict(self._observation.get)
        try:
            return self.decoded.agg(*_count_exprs(self.live)).collect()[0].asDict()
        except Exception as e:
            problems = [
                p
                for s in self.decoding.specs.values()
                if (p := decoder_from_spec(s).session_problem(self.spark))
            ]
            if problems:
                raise JobError(f"{self.where}: " + "; ".join(problems)) from e
            raise

    def settle(self) -> None:
        got = self._counts()
        total_bytes = int(got.get("bytes") or 0)
        records_per_range = range_records(self.live, got, lambda: records_by_partition(self._read))
        counts = {r.tp: n for r, n in zip(self.live, records_per_range)}
        # the bytes are the batch's total, carried by its first range (the manifest keeps the total)
        first = self.live[0].tp if self.live else None
        self.reads = tuple(
            (r, counts.get(r.tp, 0), total_bytes if r.tp == first else 0) for r in self.spec.plan.ranges
        )
        records = sum(counts.values())
        self.count = int(got.get("bad") or 0)
        self.good = records - self.count
        if int(got.get("fatal") or 0):
            row = fatal_rows(self.decoded).orderBy("topic", "partition", "offset").limit(1).collect()[0]
            raise JobError(
                f"{self.where}: the record at {_where(row)} was written with an incompatible schema, so nothing of "
                f"the batch was committed: {row['reason']}"
            )
        allowed = self.decoding.allowed(records)
        if allowed is not None and self.count > allowed:
            first_bad = (
                bad_rows(self.decoded).orderBy("topic", "partition", "offset").limit(SHOWN_BAD_RECORDS)
            )
            shown = "; ".join(f"{_where(r)}: {r['reason']}" for r in first_bad.collect())
            raise JobError(
                f"{self.where}: {self.count} of {records} records did not decode, more than "
                f"{bound_text(self.decoding.max_bad_records)} allows ({allowed}); nothing of the batch was committed. "
                f"First bad records: {shown}. Fix the producer or the pipeline's key_format/value_format and replay "
                "the batch, or raise max_bad_records to set them aside in the error table"
            )

    def errors(self) -> Any:
        return bad_rows(self.decoded)

    def close(self) -> None:
        for df in self._kept:
            df.unpersist()
        self._kept = []


@contextmanager
def decode_batch(spark: Any, spec: JobSpec, read: Any, *, observe: bool) -> Iterator[DecodedBatch]:
    """The batch ``read`` decoded as ``spec.decoding`` says (:class:`DecodedBatch`; ``observe``:
    counted as its rows are written), released when the block ends."""
    batch = DecodedBatch(spark, spec, read, observe=observe)
    try:
        yield batch
    finally:
        batch.close()
