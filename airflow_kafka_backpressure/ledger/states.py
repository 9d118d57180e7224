"""Batch and range statuses, the transitions between them, and the ledger's errors.

Pure: no database, no Airflow.
"""

from __future__ import annotations

__all__ = [
    "ABANDONED",
    "ALLOWED_TRANSITIONS",
    "BATCH_STATUSES",
    "DONE_RANGE_STATUSES",
    "FAILED",
    "FINISHED_BATCH_STATUSES",
    "IN_FLIGHT_STATUSES",
    "LOSS_KINDS",
    "LOST",
    "PLANNED",
    "RANGE_STATUSES",
    "REPLAYED",
    "REPLAYING",
    "RUNNING",
    "STALE_ONLY_REPLAY_SOURCES",
    "STALE_ONLY_SOURCES",
    "SUCCEEDED",
    "InvalidTransition",
    "LeaseLost",
    "LedgerConflict",
    "LedgerError",
    "LedgerUnavailable",
    "UnknownBatch",
    "check_transition",
    "is_stale",
]

PLANNED = "planned"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
REPLAYING = "replaying"
REPLAYED = "replayed"
#: Terminal: the batch's offsets can never be read again (retention deleted them); its ranges are
#: ``lost``, so commits move past them. Only an explicit :meth:`Ledger.abandon` leads here.
ABANDONED = "abandoned"
LOST = "lost"

BATCH_STATUSES: tuple[str, ...] = (PLANNED, RUNNING, SUCCEEDED, FAILED, REPLAYING, REPLAYED, ABANDONED)
#: Ranges follow their batch, except that an abandoned batch's ranges are ``lost``.
RANGE_STATUSES: tuple[str, ...] = (PLANNED, RUNNING, SUCCEEDED, FAILED, REPLAYING, REPLAYED, LOST)
#: Range statuses that count as processed for consumer-group commits.
DONE_RANGE_STATUSES: tuple[str, ...] = (SUCCEEDED, REPLAYED, LOST)
#: Batch statuses whose offsets are all written or recorded as lost (old ones may be pruned).
FINISHED_BATCH_STATUSES: tuple[str, ...] = (SUCCEEDED, REPLAYED, ABANDONED)
#: Batch statuses in which a worker may be (or may have died) working on the batch.
IN_FLIGHT_STATUSES: tuple[str, ...] = (PLANNED, RUNNING, REPLAYING)

#: How offsets came to be recorded as lost: found by the plan (deleted before they were planned),
#: found by a replay (deleted before it could re-read them), or given up by :meth:`Ledger.abandon`.
LOSS_KINDS: tuple[str, ...] = ("plan", "replay", "abandon")

#: target status -> the statuses a batch may move to it from.
#:
#: * ``running``: the ingest task starts the batch (``planned``), retries it (``running`` after a worker
#:   died, ``failed``), or re-runs it because a user cleared a finished Airflow run (``succeeded``,
#:   ``replayed``): the sink path is keyed by batch id, so the rewrite is idempotent. Not from
#:   ``replaying``: the replay DAG owns the batch until the replay ends.
#: * ``succeeded`` from ``running`` (and again from ``succeeded``: a retried record task).
#: * ``failed`` from ``planned`` (failed before launch), ``running``, ``replaying`` (the replay failed: it
#:   stays replayable) and ``failed`` (a retried task updates the error).
#: * ``replaying`` from ``failed``; from ``planned``/``running``/``replaying`` only when the batch is
#:   stale (no activity since ``stale_before_ms``: its worker died), see :meth:`Ledger.mark_replaying`.
#: * ``replayed`` from ``replaying`` (and again from ``replayed``).
#: * ``abandoned`` from ``failed``; from ``planned``/``running``/``replaying`` only when stale. Nothing
#:   leaves ``abandoned``.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    RUNNING: frozenset({PLANNED, RUNNING, FAILED, SUCCEEDED, REPLAYED}),
    SUCCEEDED: frozenset({RUNNING, SUCCEEDED}),
    FAILED: frozenset({PLANNED, RUNNING, REPLAYING, FAILED}),
    REPLAYING: frozenset({FAILED, PLANNED, RUNNING, REPLAYING}),
    REPLAYED: frozenset({REPLAYING, REPLAYED}),
    ABANDONED: frozenset({FAILED, PLANNED, RUNNING, REPLAYING}),
}
#: Sources of ``replaying`` that need the batch to be stale (a live worker may still own it).
STALE_ONLY_REPLAY_SOURCES: frozenset[str] = frozenset(IN_FLIGHT_STATUSES)
#: target -> the sources that need the batch to be stale.
STALE_ONLY_SOURCES: dict[str, frozenset[str]] = {
    REPLAYING: STALE_ONLY_REPLAY_SOURCES,
    ABANDONED: frozenset(IN_FLIGHT_STATUSES),
}


class LedgerError(RuntimeError):
    """A ledger operation was refused; the message says what was wrong and what to do."""


class LedgerNotInitialised(LedgerError):
    """A reader found no ledger at this location, or one at an older schema than this release's:
    readers never create or upgrade one (a deploy step or the first plan task does)."""


class LedgerUnavailable(LedgerError):
    """The ledger's database could not be reached, or a call hit its time bound (busy, locked, slow)."""


class LedgerConflict(LedgerError):
    """Offsets of a plan are already claimed by another batch (or would leave a gap in the chain)."""


class InvalidTransition(LedgerError):
    """A batch cannot move from its current status to the requested one."""


class LeaseLost(InvalidTransition):
    """An attempt tried to renew or finish a batch it no longer owns (fencing): another attempt took
    it over, or it is no longer in flight. The attempt must stop; its result is not recorded."""


class UnknownBatch(LedgerError, KeyError):
    """No batch has the given id."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


def check_transition(batch_id: int, current: str, target: str, *, stale: bool = False) -> None:
    """Raise :class:`InvalidTransition` unless ``current -> target`` is allowed (see the table above)."""
    if target not in ALLOWED_TRANSITIONS:
        raise InvalidTransition(
            f"Batch {batch_id}: {target!r} is not a status a batch can be moved to; "
            f"use one of {sorted(ALLOWED_TRANSITIONS)}"
        )
    allowed = ALLOWED_TRANSITIONS[target]
    if current not in allowed:
        raise InvalidTransition(
            f"Batch {batch_id} is {current!r} and cannot become {target!r} (allowed from: "
            f"{', '.join(sorted(allowed))}). {_transition_hint(current, target)}"
        )
    if current in STALE_ONLY_SOURCES.get(target, ()) and not stale:
        raise InvalidTransition(
            f"Batch {batch_id} is {current!r} and may still be in progress: it can only become "
            f"{target!r} once it is stale (its worker's lease expired; for a batch without a lease, no "
            "activity since stale_before_ms), or after it has been marked failed."
        )


def is_stale(
    status: str,
    lease_expires_at_ms: int | None,
    last_activity_ms: int,
    now_ms: int,
    stale_before_ms: int | None = None,
) -> bool:
    """Whether an in-flight batch was abandoned by its worker.

    With a lease: when the lease has expired (a live worker renews it, however long the batch runs).
    Without one (rows written by code that set no lease, or a planned batch nobody started): when its
    last activity is before ``stale_before_ms``, if given. Batches not in flight are never stale.
    """
    if status not in IN_FLIGHT_STATUSES:
        return False
    if lease_expires_at_ms is not None:
        return lease_expires_at_ms <= now_ms
    return stale_before_ms is not None and last_activity_ms < stale_before_ms


def _transition_hint(current: str, target: str) -> str:
    if current == ABANDONED:
        return "It was abandoned: its offsets are recorded as lost and it never runs again."
    if target == ABANDONED and current in (SUCCEEDED, REPLAYED):
        return "It already processed its offsets: there is nothing to abandon."
    if target == REPLAYING and current in (SUCCEEDED, REPLAYED):
        return "It already processed its offsets: there is nothing to replay."
    if target == RUNNING and current == REPLAYING:
        return "The replay DAG is replaying it; wait for the replay to finish or fail, then retry."
    if target in (SUCCEEDED, REPLAYED):
        return f"Mark it {'running' if target == SUCCEEDED else 'replaying'} first."
    if target == FAILED and current in (SUCCEEDED, REPLAYED):
        return "A finished batch fails only by running it again: mark it running first."
    return "Check which task owns the batch."
