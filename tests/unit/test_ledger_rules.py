"""The ledger's pure rules: status transitions, how a plan becomes chain rows, the default URL."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from airflow_kafka_backpressure.ledger import (
    ALLOWED_TRANSITIONS,
    BATCH_STATUSES,
    ChainSegment,
    InvalidTransition,
    LedgerConflict,
    chain_segments,
    check_transition,
    default_ledger_url,
)
from airflow_kafka_backpressure.models import DataLoss, OffsetRange, TopicPartition

# (from, to) pairs allowed without staleness; every other pair must be refused.
EXPECTED = {
    ("planned", "running"), ("running", "running"), ("failed", "running"), ("succeeded", "running"),
    ("replayed", "running"),
    ("running", "succeeded"), ("succeeded", "succeeded"),
    ("planned", "failed"), ("running", "failed"), ("replaying", "failed"), ("failed", "failed"),
    ("failed", "replaying"),
    ("replaying", "replayed"), ("replayed", "replayed"),
}
STALE_ONLY = {("planned", "replaying"), ("running", "replaying"), ("replaying", "replaying")}


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
        seg(0, 10, 30, "lost"), seg(0, 30, 40)
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
