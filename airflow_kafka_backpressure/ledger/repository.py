"""The repository over the ledger tables: :class:`Ledger` = plans + transitions + the queries below."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import and_, func, or_, select

from airflow_kafka_backpressure.batch.models import TopicPartition

from . import bookkeeping, retention
from .base import at_or_now, now_ms
from .losses import batch_losses
from .plans import PlansMixin
from .records import BatchLosses, BatchRecord, PruneResult, RangeRecord, batch_record, range_record
from .replay_queue import ReplayQueue, replay_queue
from .schema import batch_table, range_table
from .states import BATCH_STATUSES, FAILED, IN_FLIGHT_STATUSES
from .transitions import TransitionsMixin

__all__ = ["Ledger", "now_ms"]


class Ledger(PlansMixin, TransitionsMixin):
    """Repository over the ledger tables.

    :param url: a SQLAlchemy URL (``sqlite:///...``, ``postgresql+psycopg2://...``) or an ``Engine``;
        defaults to :func:`default_ledger_url`.
    :param engine_kwargs: extra ``create_engine`` arguments (ignored when an Engine is given).
    """

    # -- queries ---------------------------------------------------------------------------------

    def batch(self, batch_id: int) -> BatchRecord | None:
        """One batch, or None."""
        with self._read() as conn:
            row = conn.execute(select(batch_table).where(batch_table.c.batch_id == batch_id)).first()
        return None if row is None else batch_record(row)

    def batch_ranges(self, batch_id: int) -> list[RangeRecord]:
        """The stored (non-empty) ranges of a batch, lost ones included, by topic-partition."""
        with self._read() as conn:
            rows = conn.execute(
                select(range_table)
                .where(range_table.c.batch_id == batch_id)
                .order_by(range_table.c.topic, range_table.c.partition, range_table.c.from_offset)
            ).all()
        return [range_record(r) for r in rows]

    def replayable_batches(
        self, pipeline: str, stale_before_ms: int | None = None, *, now_ms: int | None = None
    ) -> list[BatchRecord]:
        """Batches to replay, earliest first (batch ids grow with offsets on every partition).

        Failed batches, plus in-flight ones (planned, running, replaying) whose worker is gone: their
        lease expired before ``now_ms`` (default: now), or — rows without a lease — with
        ``stale_before_ms``, their last activity (latest start, else creation) is before it.
        """
        now = at_or_now(now_ms)
        in_flight = batch_table.c.status.in_(IN_FLIGHT_STATUSES)
        lease = batch_table.c.lease_expires_at_ms
        cond = or_(batch_table.c.status == FAILED, and_(in_flight, lease.is_not(None), lease <= now))
        if stale_before_ms is not None:
            activity = func.coalesce(batch_table.c.started_at_ms, batch_table.c.created_at_ms)
            cond = or_(cond, and_(in_flight, lease.is_(None), activity < int(stale_before_ms)))
        with self._read() as conn:
            rows = conn.execute(
                # Through the (pipeline, status) index: the few failed and in-flight batches, sorted
                # here (an ORDER BY would lead SQLite through every batch of the pipeline instead).
                select(batch_table).where(
                    batch_table.c.pipeline == pipeline,
                    batch_table.c.status.in_((FAILED, *IN_FLIGHT_STATUSES)),
                    cond,
                )
            ).all()
        return sorted((batch_record(r) for r in rows), key=lambda b: b.batch_id)

    def replay_queue(
        self,
        pipeline: str,
        stale_before_ms: int | None = None,
        *,
        backoff_base_ms: int,
        backoff_max_ms: int | None = None,
        now_ms: int | None = None,
    ) -> ReplayQueue:
        """The :meth:`replayable_batches` split into those due now, in the order a replay takes them,
        and those waiting for their backoff after failed replays (:mod:`.replay_queue`):
        ``backoff_base_ms`` is the replay interval."""
        now = at_or_now(now_ms)
        batches = self.replayable_batches(pipeline, stale_before_ms, now_ms=now)
        return replay_queue(batches, now, int(backoff_base_ms), backoff_max_ms)

    def committable_offsets(self, pipeline: str) -> dict[TopicPartition, int]:
        """Per partition, the end of the contiguous run of done ranges (succeeded, replayed, lost)
        from the chain start: never past an unfinished or failed range. Partitions without any done
        range at the chain start are left out (nothing to commit). Pruning old ranges does not move
        it: the run counts from where the partition's chain first started."""
        with self._read() as conn:
            return bookkeeping.committable(conn, pipeline)

    def recent_batches(
        self, pipeline: str, limit: int = 50, statuses: Iterable[str] | None = None
    ) -> list[BatchRecord]:
        """The newest batches first (scaling operator, UI)."""
        q = select(batch_table).where(batch_table.c.pipeline == pipeline)
        if statuses is not None:
            statuses = list(statuses)
            unknown = sorted(set(statuses) - set(BATCH_STATUSES))
            if unknown:
                raise ValueError(f"Unknown batch statuses {unknown}; use some of {list(BATCH_STATUSES)}")
            q = q.where(batch_table.c.status.in_(statuses))
        with self._read() as conn:
            rows = conn.execute(q.order_by(batch_table.c.batch_id.desc()).limit(int(limit))).all()
        return [batch_record(r) for r in rows]

    def pipelines(self) -> list[str]:
        """Every pipeline with a batch (UI): one index lookup per pipeline, not a scan of all batches."""
        name = batch_table.c.pipeline
        found = select(func.min(name).label("name")).cte("kbp_pipeline_names", recursive=True)
        found = found.union_all(
            select(select(func.min(name)).where(name > found.c.name).scalar_subquery()).where(
                found.c.name.is_not(None)
            )
        )
        with self._read() as conn:
            return list(conn.execute(select(found.c.name).where(found.c.name.is_not(None))).scalars())

    def losses(self, pipeline: str, limit: int = 100) -> list[BatchLosses]:
        """Per batch (newest first, at most ``limit``): the offsets recorded as lost, with their kind
        (plan, replay, abandon), reason and counts — for the monitoring page."""
        with self._read() as conn:
            return batch_losses(conn, pipeline, limit)

    # -- retention -------------------------------------------------------------------------------

    def prune(
        self,
        pipeline: str,
        *,
        keep_batches: int | None = None,
        older_than_ms: int | None = None,
        chunk: int = 500,
    ) -> PruneResult:
        """Delete old finished batches (succeeded, replayed, abandoned) with their ranges. Their
        recorded losses stay (:meth:`losses` lists them; :meth:`prune_losses` is their retention).

        ``keep_batches``: keep the newest N batches of the pipeline; ``older_than_ms``: delete only
        batches that ended (else were planned) before this epoch-ms time; both: both must allow it.
        Never deletes past a partition's commit watermark, an unfinished batch, the range at a
        partition's head or the newest batch; heads and commit watermarks stay where they are. Works
        in transactions of ``chunk`` batches.
        """
        if keep_batches is None and older_than_ms is None:
            raise ValueError(f"prune: pipeline {pipeline!r}: give keep_batches and/or older_than_ms")
        if keep_batches is not None and int(keep_batches) < 1:
            raise ValueError(f"prune: pipeline {pipeline!r}: keep_batches must be >= 1, got {keep_batches}")
        total = PruneResult()
        after_id = 0
        while True:
            with self.engine.begin() as conn:
                cutoff = retention.prune_cutoff(conn, pipeline, keep_batches)
                if cutoff is None:
                    return total
                done, last = retention.prune_chunk(
                    conn, pipeline, cutoff, older_than_ms, after_id, int(chunk)
                )
            total += done
            if last is None or done.batches == 0:
                return total
            after_id = last

    def prune_losses(self, pipeline: str, *, older_than_ms: int) -> PruneResult:
        """Delete the recorded losses of ``pipeline`` recorded before ``older_than_ms`` (epoch ms)
        whose batch was pruned already: a batch in the ledger keeps all of its losses. Returns the
        loss records deleted (``losses``)."""
        with self.engine.begin() as conn:
            return PruneResult(losses=retention.prune_losses(conn, pipeline, int(older_than_ms)))
