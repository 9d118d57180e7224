"""The :class:`SinkFormat` interface and what it returns."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..models import OffsetRange


class SinkFormatError(RuntimeError):
    """A batch could not be committed, or what the sink holds is not what was asked for."""


class SinkFenced(SinkFormatError):
    """A newer attempt of the batch has committed: this (older) attempt's write was refused."""


class UnknownSinkFormat(ValueError):
    pass


def same_batch_offsets(committed: Sequence[OffsetRange], planned: Sequence[OffsetRange]) -> bool:
    """Whether a commit of ``committed`` ranges holds the batch planned as ``planned`` (pure): the same
    ranges, or the same partitions with the same ends where either starts later (a replay that
    retention or a topic reset trimmed at the start, or the full plan rewritten after such a
    replay). Other ranges under the same batch id are another batch: the ledger's batch ids started
    again (a reset, a restore from an older backup, another ledger)."""
    theirs = {r.tp: r for r in committed}
    ours = {r.tp: r for r in planned}
    if len(theirs) != len(committed) or len(ours) != len(planned) or set(theirs) != set(ours):
        return False
    return all(theirs[tp].until_offset == r.until_offset for tp, r in ours.items())


@dataclass(frozen=True)
class BatchCommit:
    """What one batch committed, as the sink records it: the pipeline, batch id, the ledger's
    attempt number that wrote it, the offset ranges it holds and its row count (the batch's rows the
    commit published, counted by the sink: rows of other batches it copied are not counted).
    ``version``: the sink's own version of the commit (a Delta table version), when it has one;
    ``bytes``: the data it added, when the sink says; ``expected_records``: the rows the writer said
    the batch must publish (None if it did not say); ``details``: what the writer stored with the
    commit (the job's per-partition record counts)."""

    pipeline: str
    batch_id: int
    attempt: int
    ranges: tuple[OffsetRange, ...]
    record_count: int
    version: int | None = None
    # what the sink reports beside the commit's identity: not compared
    bytes: int | None = field(default=None, compare=False)
    expected_records: int | None = field(default=None, compare=False)
    details: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def count_problem(self) -> str | None:
        """Why the commit does not hold the rows its batch must publish (its row count is not the
        ``expected_records`` recorded with it), or None: a commit a writer's check refused stays in
        the sink, and must not be taken over as the batch's output."""
        if self.expected_records is None or self.record_count == self.expected_records:
            return None
        return (
            f"it holds {self.record_count} rows of the batch but the batch must publish {self.expected_records} "
            f"(attempt {self.attempt}'s own check refused it)"
        )


class SinkFormat(abc.ABC):
    """How a batch lands in a sink. ``sink`` is the sink's location (a path or URI Spark's writer
    takes: a local path, ``s3a://bucket/prefix``, …); ``spark`` a SparkSession that can write it.

    The contract, for every format:

    * :meth:`write_batch` commits the batch's rows as ONE commit, idempotent by (pipeline, batch
      id, attempt): a retry of a committed attempt changes nothing; a newer attempt replaces the
      batch's rows (never appends beside them); an older attempt after a newer one is refused with
      :class:`SinkFenced`; a replay of an old batch after newer ones lands.
    * :meth:`committed` reads back what the batch committed (None if nothing);
    * :meth:`commit_lock_reason` says whether its commits into a sink must be serialized across
      Spark drivers (the pipeline then holds a lock of the ledger around each batch's job).
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def write_batch(
        self,
        spark: Any,
        df: Any,
        sink: str,
        *,
        pipeline: str,
        batch_id: int,
        attempt: int,
        ranges: Sequence[OffsetRange],
        expected_records: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> BatchCommit:
        """Commit ``df`` as batch ``batch_id`` of ``pipeline`` by the ledger's attempt ``attempt``
        (>= 1, growing with every new attempt of the batch). ``expected_records``: the rows the batch
        must publish (what was read, or what the transform returned); a commit of another count
        raises :class:`SinkFormatError`. ``details``: JSON-able facts stored with the commit and
        read back in :attr:`BatchCommit.details`. Returns what the sink now holds for the batch."""

    @abc.abstractmethod
    def committed(self, spark: Any, sink: str, *, pipeline: str, batch_id: int) -> BatchCommit | None:
        """What batch ``batch_id`` of ``pipeline`` last committed in ``sink``, or None."""

    def commit_lock_reason(self, sink: str, spark_conf: Mapping[str, str]) -> str | None:
        """Why two Spark drivers committing batches into ``sink`` at the same time could lose a
        commit, so that the pipeline must run one batch's job at a time there (the ledger's lock of
        the table, :func:`~.commit_lock.commit_lock_name`); None when the format's commit is safe
        among any number of drivers. ``spark_conf``: the pipeline's Spark settings, which may choose
        the store's commit protocol. Called on the Airflow worker: no Spark session. Default None."""
        return None

    def is_committed(
        self, spark: Any, sink: str, *, pipeline: str, batch_id: int, attempt: int | None = None
    ) -> bool:
        """Whether the batch is committed (by ``attempt``, if given)."""
        commit = self.committed(spark, sink, pipeline=pipeline, batch_id=batch_id)
        return commit is not None and (attempt is None or commit.attempt == attempt)
