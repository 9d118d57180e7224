"""The interface every reader implements (one batch's exact offset ranges into a DataFrame)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from airflow_kafka_backpressure.batch.models import JobSpec


class Reader(ABC):
    """How a batch's records are read into Spark: the DataFrame of its exact offset ranges, with the
    Kafka source's schema (``key``, ``value``, ``topic``, ``partition``, ``offset``, ``timestamp``,
    ``timestampType``, ``headers``)."""

    name: ClassVar[str]
    #: each input partition read to its end leaves a completion record (its records and bytes) in
    #: the directory it is given, which the Parquet sink's commit counts; otherwise the write counts
    #: the rows it writes, or a second read counts what a transform did not consume
    leaves_completion_records: ClassVar[bool] = False
    #: the arrow writer's tasks can read with it (and write what they read, in the same task)
    feeds_arrow_writer: ClassVar[bool] = False

    @abstractmethod
    def problem(self, spark: Any, spec: JobSpec) -> str | None:
        """Why this reader cannot read ``spec``'s batch in ``spark`` (None: it can), with what to do."""

    @abstractmethod
    def read(self, spark: Any, spec: JobSpec, *, read_records_dir: str | None = None) -> Any:
        """The batch's records (lazy). ``read_records_dir``: where the completion records go, for a
        reader that leaves them."""
