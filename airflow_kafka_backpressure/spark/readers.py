"""The readers: one interface (:class:`~.reader_base.Reader`), one registry (:data:`READERS`).

A pipeline names one with ``reader`` — a name of :data:`READERS` (``native``: Spark's own Kafka
source; ``python``: the Python Data Source) or ``auto``: the first reader of :data:`READERS`, in
order, that can read the batch (:meth:`~.reader_base.Reader.problem`): Spark's source where its
connector is on the driver's classpath and the batch's credentials may reach it, else the Python
reader. The pipelines file's validation, the job and the docs read this registry; nothing else
names a reader. Adding one is a module with a :class:`~.reader_base.Reader` and a line here (or
:func:`register`).
"""

from __future__ import annotations

from typing import Any

from airflow_kafka_backpressure.batch.models import JobSpec
from airflow_kafka_backpressure.spark.errors import JobError
from airflow_kafka_backpressure.spark.native_reader import (
    NATIVE_FETCH_DEFAULTS,
    NATIVE_PROVIDER_CLASS,
    NativeReader,
    native_options,
    native_reader_available,
    read_kafka_through_v2,
)
from airflow_kafka_backpressure.spark.python_reader import PythonReader, reader_settings
from airflow_kafka_backpressure.spark.reader_base import Reader

#: Every reader by name, in the order ``auto`` tries them.
READERS: dict[str, type[Reader]] = {NativeReader.name: NativeReader, PythonReader.name: PythonReader}
#: The ``reader`` that picks one per batch.
AUTO = "auto"


def reader_names() -> tuple[str, ...]:
    """What a pipeline's ``reader`` may be: ``auto`` and every registered reader."""
    return (AUTO, *READERS)


def register(reader: type[Reader]) -> type[Reader]:
    """Add ``reader`` to :data:`READERS` under its ``name`` (tried last by ``auto``)."""
    READERS[reader.name] = reader
    return reader


def feeds_arrow_writer(name: str) -> bool:
    """Whether the pipeline's ``reader`` (``auto`` or a reader's name) can feed the arrow writer."""
    return name == AUTO or (name in READERS and READERS[name].feeds_arrow_writer)


def reader_for(name: str) -> Reader:
    """The reader called ``name`` (one of :data:`READERS`)."""
    try:
        return READERS[name]()
    except KeyError:
        raise JobError(f"unknown reader {name!r}: use one of {', '.join(reader_names())}") from None


def choose_reader(spark: Any, spec: JobSpec) -> Reader:
    """The reader that reads ``spec``'s batch: the one it names, or for ``auto`` the first that can;
    raises :class:`JobError` with the reader's problem when the named one cannot."""
    if spec.reader != AUTO:
        reader = reader_for(spec.reader)
        problem = reader.problem(spark, spec)
        if problem is not None:
            raise JobError(problem)
        return reader
    problems = []
    for kind in READERS.values():
        reader = kind()
        problem = reader.problem(spark, spec)
        if problem is None:
            return reader
        problems.append(problem)
    raise JobError("no reader can read this batch: " + "; ".join(problems))


def read_ranges(spark: Any, spec: JobSpec, reader: Reader, *, read_records_dir: str | None = None) -> Any:
    """The batch's records as a DataFrame with the Kafka source schema (lazy): nothing to read gives
    an empty one, without asking the reader."""
    from airflow_kafka_backpressure.spark.kafka_range_source import KAFKA_SCHEMA  # defers pyspark

    if not any(r.count > 0 for r in spec.plan.ranges):
        return spark.createDataFrame([], KAFKA_SCHEMA)
    return reader.read(spark, spec, read_records_dir=read_records_dir)


__all__ = [
    "AUTO",
    "NATIVE_FETCH_DEFAULTS",
    "NATIVE_PROVIDER_CLASS",
    "READERS",
    "Reader",
    "choose_reader",
    "feeds_arrow_writer",
    "native_options",
    "native_reader_available",
    "read_kafka_through_v2",
    "read_ranges",
    "reader_for",
    "reader_names",
    "reader_settings",
    "register",
]
