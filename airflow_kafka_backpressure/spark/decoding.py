"""A batch's records decoded inside the job (a pipeline with a ``key_format`` or ``value_format``):
typed rows for the sink, the records that did not decode for its error table, and the checks that
fail the batch before anything is committed.

:func:`decode_batch` decodes the DataFrame the reader returned once, in the JVM
(:func:`~..decoders.frame.decode_frame`, persisted), and counts it in one Spark job: records, key +
value bytes and bad records per topic-partition. Then, before the sink sees a row:

* a record written with a schema the reader schema cannot read (an incompatible change) fails the
  batch, its message naming the subject, both versions and the field;
* more bad records than the pipeline's ``max_bad_records`` fail the batch, naming the first bad
  offsets and why each did not decode.

What it returns: the rows to commit (:func:`~..decoders.frame.query_rows`: a record value's fields as
columns, Kafka's metadata as ``kafka_*``; :func:`~..decoders.frame.good_rows` when only the key is
decoded into a non-record value) and the :class:`~..sinks.SetAside` the sink commits with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow_kafka_backpressure.batch.models import JobSpec, TopicPartition
from airflow_kafka_backpressure.decoders import decoder_from_spec
from airflow_kafka_backpressure.decoders.decoding import Decoding, bound_text
from airflow_kafka_backpressure.decoders.frame import REASON, bad_rows, decode_frame, fatal_rows, query_rows
from airflow_kafka_backpressure.sinks import SetAside
from airflow_kafka_backpressure.spark.errors import JobError

#: how many bad records a refusal names
SHOWN_BAD_RECORDS = 5


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _session_problems(spark: Any, decoding: Decoding) -> list[str]:
    return [p for s in decoding.specs.values() if (p := decoder_from_spec(s).session_problem(spark))]


def _where(row: Any) -> str:
    return f"{row['topic']}-{row['partition']}@{row['offset']}"


@contextmanager
def decode_batch(spark: Any, spec: JobSpec, read: Any) -> Iterator[tuple[Any, SetAside]]:
    """The batch ``read`` decoded as ``spec.decoding`` says: ``(rows, set_aside)`` (module doc);
    raises :class:`JobError` for an incompatible schema, a bad-record count above the bound, or a
    Spark session that cannot decode (a missing package). The decoded data stays persisted until
    the ``with`` block ends (the sink's commit reads it)."""
    from pyspark.sql import functions as F

    assert spec.decoding is not None
    decoding = Decoding.from_dict(spec.decoding)
    plan = spec.plan
    where = f"batch {plan.batch_id} of pipeline {plan.pipeline!r}"
    decoded = decode_frame(read, decoding.specs).persist()
    try:
        size = F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))
        try:
            stats = (
                decoded.groupBy("topic", "partition")
                .agg(
                    F.count(F.lit(1)).alias("n"),
                    F.sum(size).alias("b"),
                    F.sum(F.col(REASON).isNotNull().cast("long")).alias("bad"),
                )
                .collect()
            )
        except Exception as e:
            problems = _session_problems(spark, decoding)
            if problems:
                raise JobError(f"{where}: " + "; ".join(problems)) from e
            raise
        counts = {TopicPartition(r["topic"], int(r["partition"])): r for r in stats}
        reads = tuple(
            (
                r,
                int(counts[r.tp]["n"]) if r.tp in counts else 0,
                int(counts[r.tp]["b"] or 0) if r.tp in counts else 0,
            )
            for r in plan.ranges
        )
        records = sum(n for _, n, _ in reads)
        bad = sum(int(r["bad"] or 0) for r in stats)
        if bad:
            for row in fatal_rows(decoded).orderBy("topic", "partition", "offset").limit(1).collect():
                raise JobError(
                    f"{where}: the record at {_where(row)} was written with an incompatible schema, so nothing of "
                    f"the batch was committed: {row['reason']}"
                )
            allowed = decoding.allowed(records)
            if allowed is not None and bad > allowed:
                first = (
                    bad_rows(decoded)
                    .orderBy("topic", "partition", "offset")
                    .limit(SHOWN_BAD_RECORDS)
                    .collect()
                )
                shown = "; ".join(f"{_where(r)}: {r['reason']}" for r in first)
                raise JobError(
                    f"{where}: {bad} of {records} records did not decode, more than {bound_text(decoding.max_bad_records)} "
                    f"allows ({allowed}); nothing of the batch was committed. First bad records: {shown}. Fix the "
                    "producer or the pipeline's key_format/value_format and replay the batch, or raise max_bad_records "
                    "to set them aside in the error table"
                )
        rows = query_rows(decoded, keep_raw_value=decoding.keep_raw_value)
        yield rows, SetAside(bad_rows(decoded), bad, records - bad, reads)
    finally:
        decoded.unpersist()
