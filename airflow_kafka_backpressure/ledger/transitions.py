"""Status transitions of a batch (with leases and fencing), the terminal way out, recorded losses."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select, update

from airflow_kafka_backpressure.batch.models import DataLoss, OffsetRange

from . import bookkeeping
from .base import LedgerBase, at_or_now
from .chain import check_losses_inside
from .losses import record_spans
from .records import BatchRecord, batch_record
from .schema import batch_table, range_table
from .states import (
    ABANDONED,
    DONE_RANGE_STATUSES,
    FAILED,
    IN_FLIGHT_STATUSES,
    LOST,
    REPLAYED,
    REPLAYING,
    RUNNING,
    SUCCEEDED,
    InvalidTransition,
    LeaseLost,
    check_transition,
    is_stale,
)

__all__ = ["TransitionsMixin", "new_attempt_token"]


class TransitionsMixin(LedgerBase):
    """Moves batches between statuses under a row lock (see ``ALLOWED_TRANSITIONS``).

    **Leases and fencing.** An attempt that starts a batch (:meth:`mark_running`,
    :meth:`mark_replaying`) may pass a ``token`` (its own random id, e.g. :func:`new_attempt_token`)
    and a ``lease_ms``: it then owns the batch until ``now + lease_ms`` and keeps it by calling
    :meth:`renew_lease` periodically. Once the lease has expired the batch counts as abandoned by its
    worker: :meth:`~.repository.Ledger.replayable_batches` lists it and :meth:`mark_replaying` may
    claim it, whenever it started. Finishing calls (:meth:`mark_succeeded`, :meth:`mark_replayed`,
    :meth:`mark_failed`, :meth:`record_losses`) given a ``token`` raise :class:`LeaseLost` if another
    attempt owns the batch now, so an old attempt can never finish a batch a newer one took over.
    Without a token the calls behave as before leases existed (no lease; ``stale_before_ms`` decides).
    """

    if TYPE_CHECKING:

        def batch(self, batch_id: int) -> BatchRecord | None: ...  # the Ledger's query

    def mark_running(
        self,
        batch_id: int,
        executors: int | None = None,
        *,
        at_ms: int | None = None,
        token: str | None = None,
        lease_ms: int | None = None,
    ) -> BatchRecord:
        """The ingest task starts (or retries / re-runs) the batch: ``attempts`` += 1, new start time.
        With ``token`` this attempt owns it from now on (a retry takes it over from an older one)."""
        at = at_or_now(at_ms)
        values: dict[str, Any] = {
            "started_at_ms": at,
            "ended_at_ms": None,
            **_lease(batch_id, token, lease_ms, at),
        }
        if executors is not None:
            values["executors"] = int(executors)
        return self._transition(batch_id, RUNNING, values, count_attempt=True, at_ms=at)

    def mark_succeeded(
        self,
        batch_id: int,
        records: int,
        processing_ms: int,
        *,
        at_ms: int | None = None,
        token: str | None = None,
    ) -> BatchRecord:
        """The batch's output is committed to the sink."""
        return self._finish(batch_id, SUCCEEDED, records, processing_ms, at_ms, token)

    def mark_failed(
        self,
        batch_id: int,
        error: str,
        *,
        at_ms: int | None = None,
        token: str | None = None,
        only_from: tuple[str, ...] | None = None,
    ) -> BatchRecord:
        """The batch (or its replay) failed; it becomes replayable. ``error`` is kept for the UI.
        ``only_from``: statuses it may fail from, for a caller that holds no token (a task that
        failed before it claimed the batch must not take it from the attempt that did)."""
        at = at_or_now(at_ms)
        values = {"ended_at_ms": at, "error": str(error), "lease_expires_at_ms": None}
        return self._transition(batch_id, FAILED, values, at_ms=at, token=token, only_from=only_from)

    def mark_replaying(
        self,
        batch_id: int,
        *,
        stale_before_ms: int | None = None,
        at_ms: int | None = None,
        token: str | None = None,
        lease_ms: int | None = None,
    ) -> BatchRecord:
        """The replay DAG claims the batch: from ``failed``; from planned/running/replaying only when
        stale (its lease expired; without a lease, last activity before ``stale_before_ms``). Atomic:
        two replayers cannot both claim it."""
        at = at_or_now(at_ms)
        values = {"started_at_ms": at, "ended_at_ms": None, **_lease(batch_id, token, lease_ms, at)}
        return self._transition(
            batch_id, REPLAYING, values, count_attempt=True, stale_before_ms=stale_before_ms, at_ms=at
        )

    def mark_replayed(
        self,
        batch_id: int,
        records: int,
        processing_ms: int,
        *,
        at_ms: int | None = None,
        token: str | None = None,
    ) -> BatchRecord:
        """The replay rewrote the batch's sink path."""
        return self._finish(batch_id, REPLAYED, records, processing_ms, at_ms, token)

    def _finish(
        self,
        batch_id: int,
        target: str,
        records: int,
        processing_ms: int,
        at_ms: int | None,
        token: str | None,
    ) -> BatchRecord:
        at = at_or_now(at_ms)
        values = {
            "ended_at_ms": at,
            "records": int(records),
            "processing_ms": int(processing_ms),
            "lease_expires_at_ms": None,
        }
        return self._transition(batch_id, target, values, at_ms=at, token=token)

    def renew_lease(self, batch_id: int, token: str, lease_ms: int, *, at_ms: int | None = None) -> int:
        """Extend this attempt's lease to ``now + lease_ms``; returns the new expiry (epoch ms).

        Raises :class:`LeaseLost` when the attempt no longer owns the batch (taken over, or no longer
        running or replaying): it must stop working on it. An expired lease can still be renewed if
        nobody took the batch over meanwhile.
        """
        if not token:
            raise ValueError(f"renew_lease: batch {batch_id}: token must be the attempt's token")
        expires = at_or_now(at_ms) + _positive_lease(batch_id, lease_ms)
        with self.engine.begin() as conn:
            n = conn.execute(
                update(batch_table)
                .where(
                    batch_table.c.batch_id == batch_id,
                    batch_table.c.owner_token == token,
                    batch_table.c.status.in_((RUNNING, REPLAYING)),
                )
                .values(lease_expires_at_ms=expires)
            ).rowcount
            if n != 1:
                row = conn.execute(select(batch_table).where(batch_table.c.batch_id == batch_id)).first()
                if row is None:
                    raise self._unknown(batch_id)
                raise _lease_lost(batch_record(row), token, "renew its lease")
        return expires

    def record_metrics(
        self,
        batch_id: int,
        *,
        scheduling_delay_ms: int | None = None,
        rate: float | None = None,
        executors: int | None = None,
        bad_records: int | None = None,
    ) -> BatchRecord:
        """Store measurements that are not part of a transition (only the arguments given)."""
        values: dict[str, Any] = {}
        if scheduling_delay_ms is not None:
            values["scheduling_delay_ms"] = int(scheduling_delay_ms)
        if rate is not None:
            values["rate"] = float(rate)
        if executors is not None:
            values["executors"] = int(executors)
        if bad_records is not None:
            values["bad_records"] = int(bad_records)
        with self.engine.begin() as conn:
            if values:
                n = conn.execute(
                    update(batch_table).where(batch_table.c.batch_id == batch_id).values(**values)
                ).rowcount
                if n == 0:
                    raise self._unknown(batch_id)
            row = conn.execute(select(batch_table).where(batch_table.c.batch_id == batch_id)).first()
        if row is None:
            raise self._unknown(batch_id)
        return batch_record(row)

    def _locked(self, conn: Connection, batch_id: int, token: str | None, action: str) -> BatchRecord:
        """The batch under its row lock (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises
        writers), refusing an attempt whose ``token`` no longer owns it."""
        row = conn.execute(
            select(batch_table).where(batch_table.c.batch_id == batch_id).with_for_update()
        ).first()
        if row is None:
            raise self._unknown(batch_id)
        current = batch_record(row)
        if token is not None and current.owner_token != token:
            raise _lease_lost(current, token, action)
        return current

    def _transition(
        self,
        batch_id: int,
        target: str,
        values: dict[str, Any],
        *,
        count_attempt: bool = False,
        stale_before_ms: int | None = None,
        at_ms: int | None = None,
        token: str | None = None,
        before_ranges: Callable[[Connection, BatchRecord], None] | None = None,
        only_from: tuple[str, ...] | None = None,
    ) -> BatchRecord:
        """Move a batch to ``target`` under its row lock; its ranges follow (an abandoned batch's
        become ``lost``) and the commit watermarks with them. ``before_ranges`` runs in the same
        transaction after the checks, before the ranges change."""
        with self.engine.begin() as conn:
            current = self._locked(conn, batch_id, token, f"mark it {target!r}")
            if only_from is not None and current.status not in only_from:
                raise InvalidTransition(
                    f"Batch {batch_id} is {current.status!r}: left as it is, not marked {target!r} (this caller "
                    f"may only move it from {', '.join(only_from)})"
                )
            stale = is_stale(
                current.status,
                current.lease_expires_at_ms,
                current.last_activity_ms,
                at_or_now(at_ms),
                stale_before_ms,
            )
            check_transition(batch_id, current.status, target, stale=stale)
            new_values = dict(values)
            new_values["status"] = target
            if count_attempt:
                new_values["attempts"] = batch_table.c.attempts + 1
            new_values.update(_replay_failures(current.status, target))
            # Compare-and-set on the status read above (belt and braces with the row lock).
            n = conn.execute(
                update(batch_table)
                .where(batch_table.c.batch_id == batch_id, batch_table.c.status == current.status)
                .values(**new_values)
            ).rowcount
            if n != 1:
                raise InvalidTransition(
                    f"Batch {batch_id} changed status concurrently while moving from "
                    f"{current.status!r} to {target!r}; read it again and retry if still appropriate."
                )
            if before_ranges is not None:
                before_ranges(conn, current)
            range_status = LOST if target == ABANDONED else target
            conn.execute(
                update(range_table)
                .where(range_table.c.batch_id == batch_id, range_table.c.status != LOST)
                .values(status=range_status)
            )
            if range_status in DONE_RANGE_STATUSES:
                bookkeeping.advance_watermarks(conn, current.pipeline, batch_id)
            elif current.status in DONE_RANGE_STATUSES:
                bookkeeping.retreat_watermarks(conn, current.pipeline, batch_id)
            row = conn.execute(select(batch_table).where(batch_table.c.batch_id == batch_id)).first()
        return batch_record(row)

    # -- the terminal way out, and recorded losses -------------------------------------------------

    def abandon(
        self, batch_id: int, reason: str, *, stale_before_ms: int | None = None, at_ms: int | None = None
    ) -> BatchRecord:
        """Give a batch up for good: its offsets can never be read again (retention deleted them).

        From ``failed``; from planned/running/replaying only when stale (its worker died: its lease
        expired, or without a lease its last activity is before ``stale_before_ms``). The batch
        becomes ``abandoned`` (terminal), every range not yet lost becomes ``lost`` with ``reason``
        recorded for each offset span, and the consumer group may then commit past it. Abandoning an abandoned batch changes nothing. Users run
        ``python -m airflow_kafka_backpressure.ledger abandon`` (:func:`~.commands.abandon_command`).
        """
        if not str(reason or "").strip():
            raise ValueError(
                f"abandon: batch {batch_id}: give a reason (it is recorded with the lost offsets)"
            )
        at = at_or_now(at_ms)
        existing = self.batch(batch_id)
        if existing is not None and existing.status == ABANDONED:
            return existing

        def record(conn: Connection, current: BatchRecord) -> None:
            record_spans(
                conn, current.pipeline, batch_id, _open_ranges(conn, batch_id), "abandon", str(reason), at
            )

        return self._transition(
            batch_id,
            ABANDONED,
            {"ended_at_ms": at, "lease_expires_at_ms": None},
            stale_before_ms=stale_before_ms,
            at_ms=at,
            before_ranges=record,
        )

    def record_losses(
        self,
        batch_id: int,
        lost: Sequence[DataLoss],
        reason: str | None = None,
        *,
        at_ms: int | None = None,
        token: str | None = None,
    ) -> list[DataLoss]:
        """Record offsets of a batch found deleted by retention when it was (re)read.

        Each span must lie inside one of the batch's ranges; the batch must be in flight or failed.
        Parts already recorded are skipped (a retried replay records nothing twice); returns the spans
        newly recorded. The ranges keep their status: the replay writes what still exists and marks
        the batch replayed, and the monitoring page lists the lost offsets with their counts.
        """
        at = at_or_now(at_ms)
        with self.engine.begin() as conn:
            current = self._locked(conn, batch_id, token, "record losses")
            if current.status not in (*IN_FLIGHT_STATUSES, FAILED):
                raise InvalidTransition(
                    f"Batch {batch_id} is {current.status!r}: losses are recorded while it is read "
                    "(planned, running, replaying) or failed, not after it finished."
                )
            check_losses_inside(batch_id, list(lost), _open_ranges(conn, batch_id))
            return record_spans(conn, current.pipeline, batch_id, list(lost), "replay", reason, at)


def _replay_failures(current: str, target: str) -> dict[str, Any]:
    """How a transition changes ``replay_failures``: a replay that failed (``replaying`` → ``failed``)
    or whose worker died (a stale ``replaying`` claimed again) counts one; running on the main line
    again (a cleared ingest run) starts afresh."""
    if current == REPLAYING and target in (FAILED, REPLAYING):
        return {"replay_failures": batch_table.c.replay_failures + 1}
    if target == RUNNING:
        return {"replay_failures": 0}
    return {}


def _open_ranges(conn: Connection, batch_id: int) -> list[OffsetRange]:
    """The batch's stored ranges not (yet) lost."""
    rt = range_table
    return [
        OffsetRange(t, int(p), int(a), int(b))
        for t, p, a, b in conn.execute(
            select(rt.c.topic, rt.c.partition, rt.c.from_offset, rt.c.until_offset).where(
                rt.c.batch_id == batch_id, rt.c.status != LOST
            )
        )
    ]


def new_attempt_token() -> str:
    """A fresh random token for one attempt at a batch (pass it to mark_running / mark_replaying,
    renew_lease and the finishing calls)."""
    return secrets.token_hex(16)


def _positive_lease(batch_id: int, lease_ms: int) -> int:
    if int(lease_ms) <= 0:
        raise ValueError(f"Batch {batch_id}: lease_ms must be > 0, got {lease_ms}")
    return int(lease_ms)


def _lease(batch_id: int, token: str | None, lease_ms: int | None, at: int) -> dict[str, Any]:
    """Owner and expiry columns for an attempt that starts a batch (none without a token)."""
    if token is None:
        if lease_ms is not None:
            raise ValueError(
                f"Batch {batch_id}: lease_ms needs a token: the lease belongs to the attempt that holds it"
            )
        return {"owner_token": None, "lease_expires_at_ms": None}
    if not token or len(token) > 64:
        raise ValueError(
            f"Batch {batch_id}: token must be a non-empty string of at most 64 characters (new_attempt_token())"
        )
    expires = None if lease_ms is None else at + _positive_lease(batch_id, lease_ms)
    return {"owner_token": token, "lease_expires_at_ms": expires}


def _lease_lost(current: BatchRecord, token: str, action: str) -> LeaseLost:
    if current.owner_token is not None and current.owner_token != token:
        why = f"another attempt (token {current.owner_token[:8]}…) took it over at {current.started_at_ms}"
    elif current.owner_token is None and current.status in (RUNNING, REPLAYING):
        why = "another attempt without a token took it over"
    else:
        why = f"it is {current.status!r} now"
    return LeaseLost(
        f"Batch {current.batch_id}: this attempt (token {token[:8]}…) cannot {action}: {why}. Stop working "
        "on it; its result is not recorded (the attempt that owns the batch now decides its outcome)."
    )
