"""The arithmetic of the per-partition chains (pure: no database).

Per partition the stored ranges of a pipeline form one contiguous chain. :func:`chain_segments`
checks a new plan against the partitions' heads and returns the rows it adds;
:func:`prunable_batches` chooses which finished batches retention may delete from the chains' fronts;
:func:`subtract_spans` and :func:`check_losses_inside` keep recorded losses disjoint and inside
their batch's ranges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from airflow_kafka_backpressure.batch.models import DataLoss, OffsetRange, TopicPartition

from .states import LOST, PLANNED, LedgerConflict, LedgerError

__all__ = [
    "ChainSegment",
    "PrunableRange",
    "chain_segments",
    "check_losses_inside",
    "prunable_batches",
    "subtract_spans",
]


@dataclass(frozen=True)
class ChainSegment:
    """A non-empty range to store: read by the batch (``planned``) or deleted by retention (``lost``)."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    status: str  # planned | lost

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def offset_range(self) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, self.from_offset, self.until_offset)


def chain_segments(
    pipeline: str,
    ranges: Sequence[OffsetRange],
    data_loss: Sequence[DataLoss],
    heads: Mapping[TopicPartition, int],
) -> list[ChainSegment]:
    """The rows a plan adds to the chains, in insertion order (by topic, partition, offset).

    Empty ranges and empty losses are not stored. Per partition, the stored segments must be
    contiguous and start at the partition's head (the ``until`` of its last stored range); a partition
    without stored ranges may start anywhere. An empty range must sit at the partition's position after
    its losses. Raises :class:`LedgerConflict` (head mismatch: another batch claimed the offsets, or a
    gap) or :class:`ValueError` (the plan itself is inconsistent).
    """
    by_tp: dict[TopicPartition, list[ChainSegment]] = {}
    empty: dict[TopicPartition, int] = {}
    for r in ranges:
        if r.until_offset > r.from_offset:
            by_tp.setdefault(r.tp, []).append(
                ChainSegment(r.topic, r.partition, r.from_offset, r.until_offset, PLANNED)
            )
        else:
            empty[r.tp] = r.from_offset
    for d in data_loss:
        if d.until_offset < d.from_offset or d.from_offset < 0:
            raise ValueError(
                f"Pipeline {pipeline!r}: data loss of {TopicPartition(d.topic, d.partition)} "
                f"[{d.from_offset}, {d.until_offset}) is not a valid offset range"
            )
        if d.until_offset > d.from_offset:
            by_tp.setdefault(TopicPartition(d.topic, d.partition), []).append(
                ChainSegment(d.topic, d.partition, d.from_offset, d.until_offset, LOST)
            )

    out: list[ChainSegment] = []
    for tp in sorted(set(by_tp) | set(empty)):
        segs = sorted(by_tp.get(tp, []), key=lambda s: (s.from_offset, s.until_offset))
        for a, b in zip(segs, segs[1:]):
            if b.from_offset != a.until_offset:
                what = "overlap" if b.from_offset < a.until_offset else "leave a gap"
                raise ValueError(
                    f"Pipeline {pipeline!r}, {tp}: the plan's {a.status} range "
                    f"[{a.from_offset}, {a.until_offset}) and {b.status} range "
                    f"[{b.from_offset}, {b.until_offset}) {what}; a plan must cover one contiguous "
                    "run of offsets per partition (data loss first, then the range read)."
                )
        head = heads.get(tp)
        start = segs[0].from_offset if segs else empty[tp]
        if head is not None and start != head:
            claimed = start < head
            raise LedgerConflict(
                f"Pipeline {pipeline!r}, {tp}: the plan starts at offset {start} but the ledger's "
                f"head for this partition is {head}: "
                + (
                    f"offsets [{start}, {head}) are already claimed by another batch"
                    if claimed
                    else f"offsets [{head}, {start}) would never be read (record them as data loss "
                    "if retention deleted them)"
                )
                + ". Another writer probably planned concurrently; re-run the plan task so it plans "
                "from the current head."
            )
        end = segs[-1].until_offset if segs else start
        if tp in empty and segs and empty[tp] != end:
            raise ValueError(
                f"Pipeline {pipeline!r}, {tp}: the empty range at offset {empty[tp]} does not follow "
                f"the plan's data loss, which ends at {end}"
            )
        out.extend(segs)
    return out


def subtract_spans(spans: Iterable[OffsetRange], covered: Iterable[OffsetRange]) -> list[DataLoss]:
    """The parts of ``spans`` not inside ``covered`` (per topic-partition), merged, in offset order."""
    by_tp: dict[TopicPartition, list[tuple[int, int]]] = {}
    for s in spans:
        if s.until_offset > s.from_offset:
            by_tp.setdefault(s.tp, []).append((s.from_offset, s.until_offset))
    cover: dict[TopicPartition, list[tuple[int, int]]] = {}
    for span in covered:
        cover.setdefault(span.tp, []).append((span.from_offset, span.until_offset))
    out: list[DataLoss] = []
    for tp in sorted(by_tp):
        for a, b in _merge(by_tp[tp]):
            pos = a
            for c, d in _merge(cover.get(tp, [])):
                if d <= pos or c >= b:
                    continue
                if c > pos:
                    out.append(DataLoss(tp.topic, tp.partition, pos, c))
                pos = max(pos, d)
            if pos < b:
                out.append(DataLoss(tp.topic, tp.partition, pos, b))
    return out


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def check_losses_inside(batch_id: int, losses: Sequence[DataLoss], ranges: Sequence[OffsetRange]) -> None:
    """Raise :class:`LedgerError` unless every loss lies inside one of the batch's ranges."""
    for loss in losses:
        if loss.until_offset <= loss.from_offset:
            raise LedgerError(
                f"Batch {batch_id}: the lost offsets {loss} are an empty range; give [from, until)."
            )
        if not any(
            r.tp == loss.tp and r.from_offset <= loss.from_offset and loss.until_offset <= r.until_offset
            for r in ranges
        ):
            mine = ", ".join(str(r) for r in ranges if r.tp == loss.tp) or "none"
            raise LedgerError(
                f"Batch {batch_id}: the lost offsets {loss} are not inside one of its ranges ({loss.tp}: "
                f"{mine}). Record only offsets the batch claimed; check the batch id and the offsets."
            )


@dataclass(frozen=True)
class PrunableRange:
    """A stored range of a prune candidate: where it sits on its chain."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def prunable_batches(
    candidates: Sequence[tuple[int, Sequence[PrunableRange]]],
    chain_starts: Mapping[TopicPartition, int],
    heads: Mapping[TopicPartition, int],
    watermarks: Mapping[TopicPartition, int],
) -> tuple[list[int], dict[TopicPartition, int]]:
    """Which of the finished ``candidates`` (ascending batch ids, with their ranges) can be deleted
    without breaking a chain, and the new chain starts.

    A batch goes only if each of its ranges is at the front of its chain (after the batches already
    chosen), ends at or before the partition's commit watermark and is not the partition's last range
    (the head). Offsets grow with batch ids on every partition, so a batch that must stay keeps every
    later range of its partitions too.
    """
    starts = dict(chain_starts)
    chosen: list[int] = []
    for batch_id, ranges in candidates:
        trial: dict[TopicPartition, int] = {}
        ok = True
        for r in sorted(ranges, key=lambda x: (x.tp, x.from_offset)):
            front = trial.get(r.tp, starts.get(r.tp))
            head = heads.get(r.tp)
            if (
                r.from_offset != front
                or head is None
                or r.until_offset >= head
                or r.until_offset > watermarks.get(r.tp, -1)
            ):
                ok = False
                break
            trial[r.tp] = r.until_offset
        if ok:
            chosen.append(batch_id)
            starts.update(trial)
    moved = {tp: s for tp, s in starts.items() if s != chain_starts.get(tp)}
    return chosen, moved
