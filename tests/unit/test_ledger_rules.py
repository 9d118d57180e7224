"""The ledger's pure rules: status transitions, how a plan becomes chain rows, the default URL."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from airflow_kafka_backpressure.batch.models import DataLoss, OffsetRange, TopicPartition
from airflow_kafka_backpressure.ledger import (
    ALLOWED_TRANSITIONS,
    BATCH_STATUSES,
    ChainSegment,
    InvalidTransition,
    LedgerConflict,
    LedgerError,
    chain_segments,
    check_transition,
    default_ledger_url,
    is_stale,
)
from airflow_kafka_backpressure.ledger.chain import (
    PrunableRange,
    check_losses_inside,
    prunable_batches,
    subtract_spans,
)

# (from, to) pairs allowed without staleness; every other pair must be refused.
EXPECTED = {
    ("planned", "running"),
    ("running", "running"),
    ("failed", "running"),
    ("succeeded", "running"),
    ("replayed", "running"),
    ("running", "succeeded"),
    ("succeeded", "succeeded"),
    ("planned", "failed"),
    ("running", "failed"),
    ("replaying", "failed"),
    ("failed", "failed"),
    ("failed", "replaying"),
    ("replaying", "replayed"),
    ("replayed", "replayed"),
    ("failed", "abandoned"),
}
STALE_ONLY = {
    ("planned", "replaying"),
    ("running", "replaying"),
    ("replaying", "replaying"),
    ("planned", "abandoned"),
    ("running", "abandoned"),
    ("replaying", "abandoned"),
}


@pytest.mark.parametrize("current, target", list(itertools.product(BATCH_STATUSES, BATCH_STATUSES)))
def test_transition_table(current, target):
    if target == "planned":
        with pytest.raises(InvalidTransition, match="not a status a batch can be moved to"):
            check_transition(1, current, target)
        return
    if (current, target) in EXPECTED:
        check_transition(1, current, target)
        check_transition(1, current, target, stale=True)
    elif (current, target) in STALE_ONLY:
        with pytest.raises(InvalidTransition, match="stale"):
            check_transition(1, current, target)
        check_transition(1, current, target, stale=True)
    else:
        with pytest.raises(InvalidTransition, match=f"Batch 1 is '{current}' and cannot become '{target}'"):
            check_transition(1, current, target, stale=True)


def test_the_table_covers_only_known_statuses():
    for target, sources in ALLOWED_TRANSITIONS.items():
        assert target in BATCH_STATUSES and sources <= set(BATCH_STATUSES)


def r(p: int, a: int, b: int) -> OffsetRange:
    return OffsetRange("t", p, a, b)


def seg(p: int, a: int, b: int, status: str = "planned") -> ChainSegment:
    return ChainSegment("t", p, a, b, status)


def test_segments_skip_empty_ranges_and_sort_by_partition_then_offset():
    out = chain_segments("p", [r(1, 5, 9), r(0, 10, 10), r(2, 0, 3)], [DataLoss("t", 1, 2, 5)], {})
    assert out == [seg(1, 2, 5, "lost"), seg(1, 5, 9), seg(2, 0, 3)]


def test_segments_must_start_at_the_head():
    heads = {TopicPartition("t", 0): 10}
    assert chain_segments("p", [r(0, 10, 20)], [], heads) == [seg(0, 10, 20)]
    assert chain_segments("p", [r(0, 10, 10)], [], heads) == []
    assert chain_segments("p", [r(0, 30, 40)], [DataLoss("t", 0, 10, 30)], heads) == [
        seg(0, 10, 30, "lost"),
        seg(0, 30, 40),
    ]
    with pytest.raises(LedgerConflict, match=r"\[5, 10\) are already claimed.*re-run the plan task"):
        chain_segments("p", [r(0, 5, 20)], [], heads)
    with pytest.raises(LedgerConflict, match=r"\[10, 12\) would never be read.*data loss"):
        chain_segments("p", [r(0, 12, 20)], [], heads)
    with pytest.raises(LedgerConflict, match="'p', t-0"):
        chain_segments("p", [r(0, 11, 11)], [], heads)


def test_segments_of_one_partition_must_be_contiguous():
    with pytest.raises(ValueError, match="overlap"):
        chain_segments("p", [r(0, 10, 20)], [DataLoss("t", 0, 0, 11)], {})
    with pytest.raises(ValueError, match="leave a gap"):
        chain_segments("p", [r(0, 10, 20)], [DataLoss("t", 0, 0, 9)], {})
    with pytest.raises(ValueError, match="does not follow the plan's data loss"):
        chain_segments("p", [r(0, 12, 12)], [DataLoss("t", 0, 0, 10)], {})
    # a backwards data-loss span cannot even be built (DataLoss is an OffsetRange)
    with pytest.raises(ValueError, match="until_offset 3 is below from_offset 9"):
        chain_segments("p", [], [DataLoss("t", 0, 9, 3)], {})


def test_nothing_leaves_abandoned():
    for target in ALLOWED_TRANSITIONS:
        with pytest.raises(InvalidTransition, match="never runs again"):
            check_transition(1, "abandoned", target, stale=True)


@pytest.mark.parametrize(
    "status, lease, activity, now, stale_before, expected",
    [
        ("running", 2_000, 0, 1_999, None, False),  # live lease
        ("running", 2_000, 0, 2_000, None, True),  # expired at its expiry time
        ("running", 2_000, 0, 1_999, 10_000, False),  # a live lease wins over an old start
        ("replaying", 2_000, 0, 5_000, None, True),
        ("planned", None, 100, 5_000, None, False),  # no lease, no threshold: never stale
        ("planned", None, 100, 5_000, 101, True),
        ("running", None, 100, 5_000, 100, False),
        ("failed", 1, 0, 5_000, 10_000, False),  # not in flight
        ("succeeded", None, 0, 5_000, 10_000, False),
    ],
)
def test_staleness_by_lease_else_by_last_activity(status, lease, activity, now, stale_before, expected):
    assert is_stale(status, lease, activity, now, stale_before) is expected


def test_subtract_spans_keeps_only_what_is_not_covered_merged_in_order():
    d = lambda p, a, b: DataLoss("t", p, a, b)  # noqa: E731
    assert subtract_spans([r(0, 0, 10)], []) == [d(0, 0, 10)]
    assert subtract_spans([r(0, 0, 10)], [r(0, 2, 4), r(0, 6, 8)]) == [d(0, 0, 2), d(0, 4, 6), d(0, 8, 10)]
    assert subtract_spans([r(0, 0, 10)], [r(0, 0, 10)]) == []
    assert subtract_spans([r(0, 0, 5), r(0, 5, 10), r(1, 3, 3)], [r(1, 0, 4)]) == [d(0, 0, 10)]
    assert subtract_spans([r(0, 0, 10)], [r(1, 0, 10), r(0, 8, 20)]) == [d(0, 0, 8)]
    assert subtract_spans([r(1, 0, 2), r(0, 4, 6)], [r(0, 3, 5)]) == [d(0, 5, 6), d(1, 0, 2)]


def test_losses_must_lie_inside_one_range_of_the_batch():
    ranges = [r(0, 10, 20), r(1, 0, 5)]
    check_losses_inside(7, [DataLoss("t", 0, 10, 20), DataLoss("t", 1, 2, 3)], ranges)
    with pytest.raises(
        LedgerError, match=r"Batch 7: the lost offsets t-0\[15, 25\) are not inside .*t-0\[10, 20\)"
    ):
        check_losses_inside(7, [DataLoss("t", 0, 15, 25)], ranges)
    with pytest.raises(LedgerError, match=r"t-2\[0, 1\).*\(t-2: none\)"):
        check_losses_inside(7, [DataLoss("t", 2, 0, 1)], ranges)
    with pytest.raises(LedgerError, match="empty range"):
        check_losses_inside(7, [DataLoss("t", 0, 12, 12)], ranges)


def pr(p: int, a: int, b: int) -> PrunableRange:
    return PrunableRange("t", p, a, b)


def test_prunable_batches_take_whole_batches_from_the_chain_fronts_only():
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    heads, marks, starts = {tp0: 50, tp1: 50}, {tp0: 50, tp1: 25}, {tp0: 0, tp1: 0}
    candidates = [
        (1, [pr(0, 0, 10), pr(1, 0, 10)]),
        (2, [pr(0, 10, 20)]),
        (3, [pr(1, 10, 20), pr(0, 20, 30)]),
        (4, []),  # an all-empty plan
        (5, [pr(1, 20, 30)]),  # past the watermark of events-1 (25)
        (6, [pr(0, 30, 40)]),
        (7, [pr(0, 40, 50)]),  # the head of events-0
    ]
    chosen, moved = prunable_batches(candidates, starts, heads, marks)
    assert chosen == [1, 2, 3, 4, 6] and moved == {tp0: 40, tp1: 20}
    # a batch not at the front (its predecessor stays) must stay too
    chosen, moved = prunable_batches(
        [(2, [pr(0, 10, 20)]), (3, [pr(1, 10, 20), pr(0, 20, 30)])], starts, heads, marks
    )
    assert chosen == [] and moved == {}


def test_default_ledger_url_lives_in_airflow_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert default_ledger_url() == f"sqlite:///{tmp_path}/kafka_backpressure_ledger.db"
    monkeypatch.delenv("AIRFLOW_HOME")
    assert default_ledger_url() == f"sqlite:///{Path.home()}/airflow/kafka_backpressure_ledger.db"


def test_the_ledger_module_does_not_import_airflow():
    import subprocess
    import sys

    code = (
        "import sys, airflow_kafka_backpressure.ledger; "
        "sys.exit(1 if any(m == 'airflow' or m.startswith('airflow.') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    # nor alembic: DAG files import the operators, which import the ledger; migrations load on use
    code = "import sys, airflow_kafka_backpressure.ledger; sys.exit(1 if 'alembic' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
