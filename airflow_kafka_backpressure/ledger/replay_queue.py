"""Which replayable batches a replay run takes, and in which order (pure: no database).

A run takes at most a few batches (the replay DAG: ``REPLAY_BATCHES_PER_RUN``). Taking the
earliest failed ones every time let batches that are refused every time (retention or a topic
reset under ``"fail"``, a poison batch) fill every run: the batches after them were never tried
until someone abandoned the first ones, while retention went on deleting their offsets too.

So each batch has a time it is **due**:

* a batch that failed on the main line (or whose worker died) is due from when it failed (its
  ``ended_at_ms``; a stale in-flight batch: when its lease expired, else its last activity);
* a batch whose replay failed ``k`` times in a row (``replay_failures``: failed, refused, or its
  worker died while replaying) is due again only ``base × 2^(k-1)`` after that failure, at most
  ``max(REPLAY_BACKOFF_MAX_S, base)`` — ``base`` is the replay interval, so a batch refused once is
  tried again about one run later, then after 2, 4, 8 … runs, at least once an hour.

A run takes the due batches in the order they became due (then by batch id): a batch never waits
behind batches that became due after it, so every batch gets its turn, and a batch that was just
refused goes behind every batch that was already waiting. Batches in their backoff wait (the
replay task logs until when).

This only orders the work. The consumer group is still committed only to the end of the contiguous
run of finished ranges of each partition, so it never passes a failed batch, whatever the order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .records import BatchRecord
from .states import FAILED, REPLAYING

__all__ = ["REPLAY_BACKOFF_MAX_S", "ReplayQueue", "due_at_ms", "replay_backoff_ms", "replay_queue"]

#: The longest a batch whose replays keep failing waits between two tries (unless the replay
#: interval is longer): it stays tried at least once an hour, so a cause that went away (a fixed
#: transform, ``on_data_loss`` switched to ``"skip"``) is noticed within the hour.
REPLAY_BACKOFF_MAX_S = 3600.0


def replay_backoff_ms(failures: int, base_ms: int, max_ms: int | None = None) -> int:
    """How long after its last failure a batch whose replays failed ``failures`` times in a row
    waits: 0, then ``base_ms`` doubling per failure, capped at ``max(max_ms, base_ms)``."""
    if failures <= 0:
        return 0
    cap = max(int(REPLAY_BACKOFF_MAX_S * 1000) if max_ms is None else int(max_ms), int(base_ms))
    return min(int(base_ms) * 2 ** min(failures - 1, 40), cap)


def due_at_ms(batch: BatchRecord, base_ms: int, max_ms: int | None = None) -> int:
    """When ``batch`` (replayable: failed, or in flight with its worker gone) is due for a replay."""
    if batch.status == FAILED:
        failed_at = batch.ended_at_ms if batch.ended_at_ms is not None else batch.last_activity_ms
        failures = batch.replay_failures
    else:  # its worker is gone: when its lease ran out, else its last sign of life
        failed_at = (
            batch.lease_expires_at_ms if batch.lease_expires_at_ms is not None else batch.last_activity_ms
        )
        failures = batch.replay_failures + (1 if batch.status == REPLAYING else 0)
    return int(failed_at) + replay_backoff_ms(failures, base_ms, max_ms)


@dataclass(frozen=True)
class ReplayQueue:
    """``due``: the batches to replay now, in order; ``waiting``: ``(batch, due at epoch ms)`` of the
    batches in their backoff, soonest first."""

    due: tuple[BatchRecord, ...]
    waiting: tuple[tuple[BatchRecord, int], ...]


def replay_queue(
    batches: Iterable[BatchRecord], now_ms: int, base_ms: int, max_ms: int | None = None
) -> ReplayQueue:
    """Split replayable ``batches`` into those due at ``now_ms`` (in the order they became due, then
    by batch id) and those waiting (see the module doc)."""
    timed = sorted(((due_at_ms(b, base_ms, max_ms), b.batch_id, b) for b in batches), key=lambda x: x[:2])
    return ReplayQueue(
        tuple(b for at, _, b in timed if at <= now_ms),
        tuple((b, at) for at, _, b in timed if at > now_ms),
    )
