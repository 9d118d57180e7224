"""The ledger on SQLite (a file) and on a real PostgreSQL server.

The chain constraints are proven at the database level: conflicting rows are inserted with plain SQL,
bypassing the repository, and the database itself must refuse them.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

import airflow_kafka_backpressure.ledger.plans as plans_mod
from airflow_kafka_backpressure.batch.models import BatchPlan, DataLoss, OffsetRange, TopicPartition
from airflow_kafka_backpressure.ledger import (
    InvalidTransition,
    Ledger,
    LedgerConflict,
    UnknownBatch,
)
from tests.integration.ledger_dbs import ledger, ledger_url, with_ledgers_at_once  # noqa: F401 (fixtures)

P = "orders"
T = "events"
TP0 = TopicPartition(T, 0)
TP1 = TopicPartition(T, 1)
SINK = "/data/orders"


def r(partition: int, start: int, end: int, topic: str = T) -> OffsetRange:
    return OffsetRange(topic, partition, start, end)


def plan(
    led: Ledger, run_id: str, *ranges: OffsetRange, pipeline: str = P, data_loss=(), rate=100.0
) -> BatchPlan:
    return led.record_plan(
        pipeline,
        run_id,
        list(ranges),
        SINK,
        batch_interval_ms=5000,
        planned_at_ms=1_000,
        rate=rate,
        data_loss=list(data_loss),
    )


def stored(led: Ledger, pipeline: str = P) -> list[tuple]:
    """(topic, partition, from, until, prev_until, status) of every range row, chain order."""
    with led.engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text(
                    'SELECT topic, "partition", from_offset, until_offset, prev_until, status '
                    'FROM kbp_ranges WHERE pipeline = :p ORDER BY topic, "partition", from_offset'
                ),
                {"p": pipeline},
            )
        ]


# --------------------------------------------------------------------------------------------------
# Schema and plans
# --------------------------------------------------------------------------------------------------


def test_create_all_is_idempotent(ledger: Ledger):
    plan(ledger, "run-1", r(0, 0, 10))
    ledger.create_all()
    ledger.create_all()
    assert ledger.heads(P) == {TP0: 10}


def test_record_plan_assigns_the_batch_id_and_stores_the_full_plan(ledger: Ledger):
    p = plan(ledger, "run-1", r(1, 7, 9), r(0, 0, 10))
    assert p.batch_id >= 1
    assert p.pipeline == P and p.run_id == "run-1" and p.sink == SINK and p.rate == 100.0
    assert p.ranges == (r(0, 0, 10), r(1, 7, 9))
    assert p.output_path == f"{SINK}/batch_id={p.batch_id}"
    assert ledger.get_plan(P, "run-1") == p
    rec = ledger.batch(p.batch_id)
    assert rec is not None and rec.plan == p and rec.status == "planned" and rec.attempts == 0
    assert rec.rate == 100.0 and rec.sink == SINK and rec.run_id == "run-1"
    assert rec.created_at_ms > 0 and rec.started_at_ms is None and rec.ended_at_ms is None
    with ledger.engine.connect() as conn:
        plan_json = conn.execute(
            text("SELECT plan_json FROM kbp_batches WHERE batch_id = :b"), {"b": p.batch_id}
        ).scalar_one()
    assert BatchPlan.from_json(plan_json) == p
    assert stored(ledger) == [(T, 0, 0, 10, None, "planned"), (T, 1, 7, 9, None, "planned")]


def test_the_same_run_id_reuses_the_stored_plan(ledger: Ledger):
    first = plan(ledger, "run-1", r(0, 0, 10))
    # A retry, a cleared task or a backfill of the same run never computes a new range.
    again = plan(ledger, "run-1", r(0, 0, 999), rate=1.0)
    assert again == first
    assert ledger.heads(P) == {TP0: 10}
    assert len(ledger.recent_batches(P, 10)) == 1
    assert ledger.get_plan(P, "other-run") is None
    assert ledger.get_plan("other-pipeline", "run-1") is None


def test_batch_ids_grow_and_are_never_reused(ledger: Ledger):
    a = plan(ledger, "run-1", r(0, 0, 10))
    b = plan(ledger, "run-2", r(0, 10, 10))  # no range rows: the batch row alone can be deleted
    assert b.batch_id > a.batch_id
    # Even if the newest batch is deleted, its id (a sink path key) is not handed out again.
    with ledger.engine.begin() as conn:
        conn.execute(text("DELETE FROM kbp_batches WHERE batch_id = :b"), {"b": b.batch_id})
    c = plan(ledger, "run-3", r(0, 10, 20))
    assert c.batch_id > b.batch_id


def test_heads_continue_after_the_last_range_even_when_it_failed(ledger: Ledger):
    assert ledger.heads(P) == {}
    b1 = plan(ledger, "run-1", r(0, 0, 10), r(1, 0, 5))
    b2 = plan(ledger, "run-2", r(0, 10, 25), r(1, 5, 6))
    ledger.mark_running(b2.batch_id)
    ledger.mark_failed(b2.batch_id, "executor lost")
    assert ledger.heads(P) == {TP0: 25, TP1: 6}
    b3 = plan(ledger, "run-3", r(0, 25, 30), r(1, 6, 6))
    assert ledger.heads(P) == {TP0: 30, TP1: 6}
    assert b1.batch_id < b2.batch_id < b3.batch_id


def test_empty_ranges_are_not_stored_but_the_plan_lists_them(ledger: Ledger):
    p = plan(ledger, "run-1", r(0, 0, 10), r(1, 4, 4))
    assert p.ranges == (r(0, 0, 10), r(1, 4, 4))
    assert ledger.batch(p.batch_id).plan.ranges == p.ranges
    assert stored(ledger) == [(T, 0, 0, 10, None, "planned")]
    assert [x.offset_range for x in ledger.batch_ranges(p.batch_id)] == [r(0, 0, 10)]
    # An idle partition keeps its position from the latest plan: it must not jump to the log end.
    assert ledger.heads(P) == {TP0: 10, TP1: 4}
    p2 = plan(ledger, "run-2", r(0, 10, 10), r(1, 4, 9))
    assert p2.ranges == (r(0, 10, 10), r(1, 4, 9))
    assert stored(ledger) == [(T, 0, 0, 10, None, "planned"), (T, 1, 4, 9, None, "planned")]
    assert ledger.heads(P) == {TP0: 10, TP1: 9}


def test_an_all_empty_plan_is_recorded(ledger: Ledger):
    p = plan(ledger, "run-1", r(0, 3, 3), r(1, 0, 0))
    assert ledger.get_plan(P, "run-1") == p
    assert stored(ledger) == []
    assert ledger.heads(P) == {TP0: 3, TP1: 0}


def test_a_new_partition_may_start_anywhere(ledger: Ledger):
    plan(ledger, "run-1", r(0, 0, 10))
    plan(ledger, "run-2", r(0, 10, 20), r(1, 500, 510), r(0, 0, 5, topic="other"))
    assert ledger.heads(P) == {TP0: 20, TP1: 510, TopicPartition("other", 0): 5}


def test_pipelines_have_separate_chains_on_the_same_topic(ledger: Ledger):
    plan(ledger, "run-1", r(0, 0, 10), pipeline="a")
    plan(ledger, "run-1", r(0, 0, 10), pipeline="b")
    assert ledger.heads("a") == ledger.heads("b") == {TP0: 10}
    assert ledger.pipelines() == ["a", "b"]


@pytest.mark.parametrize(
    "bad, claimed",
    [
        (r(0, 5, 30), "[5, 20) are already claimed"),  # overlaps the last range
        (r(0, 0, 30), "[0, 20) are already claimed"),  # restarts the chain
        (r(0, 25, 30), "[20, 25) would never be read"),  # leaves a gap
        (r(0, 21, 21), "[20, 21) would never be read"),  # an empty range that is not at the head
    ],
)
def test_a_plan_that_does_not_start_at_the_head_is_rejected(ledger: Ledger, bad, claimed):
    plan(ledger, "run-1", r(0, 0, 10))
    plan(ledger, "run-2", r(0, 10, 20))
    with pytest.raises(LedgerConflict) as e:
        plan(ledger, "run-3", r(1, 0, 5), bad)
    msg = str(e.value)
    assert P in msg and "events-0" in msg and claimed in msg and "re-run the plan task" in msg
    # Nothing of the rejected plan was written: not the batch, not the range of the other partition.
    assert ledger.get_plan(P, "run-3") is None
    assert stored(ledger) == [(T, 0, 0, 10, None, "planned"), (T, 0, 10, 20, 10, "planned")]


def test_an_inconsistent_plan_is_rejected_before_writing(ledger: Ledger):
    with pytest.raises(ValueError, match="two ranges for events-0"):
        plan(ledger, "run-1", r(0, 0, 10), r(0, 10, 20))
    with pytest.raises(ValueError, match="overlap"):
        plan(ledger, "run-1", r(0, 10, 20), data_loss=[DataLoss(T, 0, 0, 15)])
    with pytest.raises(ValueError, match="gap"):
        plan(ledger, "run-1", r(0, 10, 20), data_loss=[DataLoss(T, 0, 0, 5)])
    assert ledger.get_plan(P, "run-1") is None and stored(ledger) == []


# --------------------------------------------------------------------------------------------------
# The chain, enforced by the database itself
# --------------------------------------------------------------------------------------------------

INSERT_RANGE = text(
    'INSERT INTO kbp_ranges (batch_id, pipeline, topic, "partition", from_offset, until_offset, '
    "prev_until, status) VALUES (:batch_id, :pipeline, :topic, :partition, :from_offset, "
    ":until_offset, :prev_until, 'planned')"
)


def raw_insert(
    led: Ledger,
    batch_id: int,
    start: int,
    end: int,
    prev: int | None,
    *,
    pipeline: str = P,
    partition: int = 0,
) -> None:
    with led.engine.begin() as conn:
        conn.execute(
            INSERT_RANGE,
            {
                "batch_id": batch_id,
                "pipeline": pipeline,
                "topic": T,
                "partition": partition,
                "from_offset": start,
                "until_offset": end,
                "prev_until": prev,
            },
        )


@pytest.fixture
def chain(ledger: Ledger) -> tuple[Ledger, int]:
    """events-0 holds [0, 100) and [100, 200); returns the ledger and a batch id to attach rows to."""
    plan(ledger, "run-1", r(0, 0, 100))
    b = plan(ledger, "run-2", r(0, 100, 200))
    plan(ledger, "other-run", r(0, 0, 50), pipeline="other")
    return ledger, b.batch_id


@pytest.mark.parametrize(
    "start, end, prev",
    [
        pytest.param(50, 150, None, id="overlap-as-second-chain-start"),
        pytest.param(150, 250, 150, id="overlap-chained-to-a-missing-end"),
        pytest.param(100, 250, 100, id="overlap-same-start"),
        pytest.param(0, 100, None, id="duplicate-of-first-range"),
        pytest.param(150, 200, 100, id="prev-until-differs-from-start"),
        pytest.param(250, 300, None, id="gap-as-second-chain-start"),
        pytest.param(250, 300, 250, id="gap-chained-to-a-missing-end"),
        pytest.param(250, 300, 200, id="gap-with-prev-until-at-head"),
        pytest.param(200, 200, 200, id="empty-range"),
        pytest.param(200, 150, 200, id="backwards-range"),
    ],
)
def test_the_database_refuses_overlapping_or_gapped_ranges(chain, start, end, prev):
    led, batch_id = chain
    before = stored(led)
    with pytest.raises(IntegrityError):
        raw_insert(led, batch_id, start, end, prev)
    assert stored(led) == before


def test_the_database_accepts_the_contiguous_next_range(chain):
    """Control for the test above: the same SQL with a correct row succeeds."""
    led, batch_id = chain
    raw_insert(led, batch_id, 200, 300, 200)
    assert [row[2:5] for row in stored(led)] == [(0, 100, None), (100, 200, 100), (200, 300, 200)]


def test_the_database_refuses_a_range_of_another_pipelines_batch(chain):
    led, batch_id = chain
    with pytest.raises(IntegrityError):  # batch_id belongs to pipeline P, not "other"
        raw_insert(led, batch_id, 50, 60, 50, pipeline="other")


def test_the_database_refuses_to_break_a_chain_by_delete_or_update(chain):
    led, _ = chain
    with pytest.raises(IntegrityError):
        with led.engine.begin() as conn:  # deleting the middle would orphan [100, 200)
            conn.execute(text("DELETE FROM kbp_ranges WHERE pipeline = :p AND from_offset = 0"), {"p": P})
    with pytest.raises(IntegrityError):
        with led.engine.begin() as conn:  # moving the end of [0, 100) would detach [100, 200)
            conn.execute(
                text("UPDATE kbp_ranges SET until_offset = 150 WHERE pipeline = :p AND from_offset = 0"),
                {"p": P},
            )
    assert [row[2:4] for row in stored(led)] == [(0, 100), (100, 200)]


def test_a_database_refusal_becomes_a_ledger_conflict(ledger: Ledger, monkeypatch):
    """If the code's own head check is bypassed (a stale read), the database still refuses."""
    plan(ledger, "run-1", r(0, 0, 100))
    monkeypatch.setattr(Ledger, "_stored_heads", lambda self, known: {})
    with pytest.raises(LedgerConflict) as e:
        plan(ledger, "run-2", r(1, 0, 5), r(0, 50, 150))
    msg = str(e.value)
    assert "events-0" in msg and "[50, 150)" in msg and "re-run the plan task" in msg.lower()
    assert ledger.get_plan(P, "run-2") is None
    assert ledger.heads(P) == {TP0: 100}


# --------------------------------------------------------------------------------------------------
# Concurrent writers
# --------------------------------------------------------------------------------------------------


def _race(url: str, runs: list[str], ranges: list[OffsetRange]) -> list[object]:
    """record_plan from one thread (own engine and connections) per run id, started together."""
    return with_ledgers_at_once(url, len(runs), lambda led, i: plan(led, runs[i], *ranges))


@pytest.fixture
def hold_writers(ledger: Ledger, monkeypatch):
    """``hold_writers(n)``: on PostgreSQL, hold each of ``n`` writers after it read the heads until
    all have: they then insert the same offsets and the database constraints (not the code's head
    check) decide. SQLite serialises writers (BEGIN IMMEDIATE): the later writer sees the new head."""

    def hold(n: int) -> None:
        if ledger.engine.dialect.name != "postgresql":
            return
        original = plans_mod.chain_segments
        gate = threading.Barrier(n)

        def held(*args, **kwargs):
            segments = original(*args, **kwargs)
            gate.wait(timeout=30)
            return segments

        monkeypatch.setattr(plans_mod, "chain_segments", held)

    return hold


def test_concurrent_plans_for_the_same_offsets_exactly_one_wins(ledger: Ledger, ledger_url, hold_writers):
    plan(ledger, "run-0", r(0, 0, 10))
    hold_writers(3)
    results = _race(ledger_url, ["run-a", "run-b", "run-c"], [r(1, 0, 5), r(0, 10, 20)])
    wins = [x for x in results if isinstance(x, BatchPlan)]
    conflicts = [x for x in results if isinstance(x, LedgerConflict)]
    assert len(wins) == 1 and len(conflicts) == 2, results
    assert all("re-run the plan task" in str(c).lower() and "events-" in str(c) for c in conflicts)
    if ledger.engine.dialect.name == "postgresql":  # decided by the unique constraint, not the code
        assert all("Database said" in str(c) for c in conflicts), conflicts
    assert [row[:4] for row in stored(ledger)] == [(T, 0, 0, 10), (T, 0, 10, 20), (T, 1, 0, 5)]
    assert ledger.get_plan(P, wins[0].run_id) == wins[0]
    assert {b.run_id for b in ledger.recent_batches(P, 10)} == {"run-0", wins[0].run_id}


def test_concurrent_writers_of_the_same_run_get_the_same_plan(ledger: Ledger, ledger_url, hold_writers):
    hold_writers(3)
    results = _race(ledger_url, ["run-a"] * 3, [r(0, 0, 10)])
    assert all(isinstance(x, BatchPlan) for x in results), results
    assert len({x.batch_id for x in results}) == 1
    assert len(ledger.recent_batches(P, 10)) == 1
    assert stored(ledger) == [(T, 0, 0, 10, None, "planned")]


def test_sequential_writers_with_many_connections_build_one_chain(ledger_url, ledger: Ledger):
    """Writers racing in a loop, each re-planning from the current head after a conflict."""

    def writer(name: str) -> None:
        led = Ledger(ledger_url)
        try:
            for i in range(8):
                while True:
                    head = led.heads(P).get(TP0, 0)
                    try:
                        plan(led, f"{name}-{i}", r(0, head, head + 3))
                        break
                    except LedgerConflict:
                        continue
        finally:
            led.dispose()

    threads = [threading.Thread(target=writer, args=(f"w{k}",)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    rows = stored(ledger)
    assert len(rows) == 24
    assert [row[2] for row in rows] == list(range(0, 72, 3))
    assert ledger.heads(P) == {TP0: 72}


# --------------------------------------------------------------------------------------------------
# Status transitions
# --------------------------------------------------------------------------------------------------


def statuses(led: Ledger, batch_id: int) -> list[str]:
    return [x.status for x in led.batch_ranges(batch_id)]


def test_the_normal_life_of_a_batch(ledger: Ledger):
    b = plan(ledger, "run-1", r(0, 0, 10), r(1, 0, 4)).batch_id
    assert statuses(ledger, b) == ["planned", "planned"]
    run = ledger.mark_running(b, executors=3, at_ms=1_000)
    assert (run.status, run.attempts, run.executors, run.started_at_ms) == ("running", 1, 3, 1_000)
    assert statuses(ledger, b) == ["running", "running"]
    ledger.record_metrics(b, scheduling_delay_ms=250, rate=42.5)
    done = ledger.mark_succeeded(b, records=14, processing_ms=3_200, at_ms=4_200)
    assert (done.status, done.records, done.processing_ms, done.ended_at_ms) == (
        "succeeded",
        14,
        3_200,
        4_200,
    )
    assert (done.scheduling_delay_ms, done.rate, done.executors) == (250, 42.5, 3)
    assert statuses(ledger, b) == ["succeeded", "succeeded"]
    assert ledger.batch(b) == done


def test_retries_and_reruns_are_allowed_and_counted(ledger: Ledger):
    b = plan(ledger, "run-1", r(0, 0, 10)).batch_id
    ledger.mark_running(b)
    assert ledger.mark_running(b).attempts == 2  # the worker died: the ingest task retries
    failed = ledger.mark_failed(b, "spark-submit exited with 1")
    assert failed.status == "failed" and failed.error == "spark-submit exited with 1"
    assert statuses(ledger, b) == ["failed"]
    assert ledger.mark_running(b).attempts == 3  # Airflow retry of the failed task
    ledger.mark_succeeded(b, 10, 100)
    assert ledger.mark_succeeded(b, 10, 120).processing_ms == 120  # a retried record task
    rerun = ledger.mark_running(b, at_ms=9_000)  # a user cleared the finished run
    assert (rerun.status, rerun.attempts, rerun.started_at_ms, rerun.ended_at_ms) == (
        "running",
        4,
        9_000,
        None,
    )
    assert ledger.mark_succeeded(b, 10, 90).status == "succeeded"


def test_the_replay_life_of_a_batch(ledger: Ledger):
    b = plan(ledger, "run-1", r(0, 0, 10)).batch_id
    ledger.mark_running(b)
    ledger.mark_failed(b, "boom")
    rep = ledger.mark_replaying(b)
    assert (rep.status, rep.attempts) == ("replaying", 2)
    assert statuses(ledger, b) == ["replaying"]
    assert ledger.mark_failed(b, "boom again").status == "failed"  # the replay failed: still replayable
    ledger.mark_replaying(b)
    done = ledger.mark_replayed(b, records=10, processing_ms=500)
    assert (done.status, done.records, done.attempts) == ("replayed", 10, 3)
    assert statuses(ledger, b) == ["replayed"]
    assert ledger.mark_running(b).status == "running"  # a cleared main run may rewrite it again


@pytest.mark.parametrize(
    "path, target",
    [
        (["running", "succeeded"], "replaying"),
        (["running", "succeeded"], "failed"),
        ([], "succeeded"),
        ([], "replayed"),
        (["running"], "replayed"),
        (["running", "failed"], "succeeded"),
        (["running", "failed", "replaying"], "running"),
        (["running", "failed", "replaying"], "succeeded"),
        (["running", "failed", "replaying", "replayed"], "replaying"),
        (["running", "failed", "replaying", "replayed"], "failed"),
        ([], "replaying"),  # planned, not stale: a worker may be about to run it
        (["running"], "replaying"),
    ],
)
def test_invalid_transitions_are_refused(ledger: Ledger, path, target):
    b = plan(ledger, "run-1", r(0, 0, 10)).batch_id
    do = {
        "running": lambda: ledger.mark_running(b),
        "succeeded": lambda: ledger.mark_succeeded(b, 1, 1),
        "failed": lambda: ledger.mark_failed(b, "x"),
        "replaying": lambda: ledger.mark_replaying(b),
        "replayed": lambda: ledger.mark_replayed(b, 1, 1),
    }
    for step in path:
        do[step]()
    before = ledger.batch(b)
    with pytest.raises(InvalidTransition) as e:
        do[target]()
    assert f"Batch {b}" in str(e.value) and repr(target) in str(e.value)
    assert ledger.batch(b) == before
    assert set(statuses(ledger, b)) == {before.status}


def test_a_stale_in_flight_batch_can_be_claimed_for_replay(ledger: Ledger):
    b = plan(ledger, "run-1", r(0, 0, 10)).batch_id
    ledger.mark_running(b, at_ms=1_000)
    with pytest.raises(InvalidTransition, match="stale"):
        ledger.mark_replaying(b, stale_before_ms=500)
    claimed = ledger.mark_replaying(b, stale_before_ms=2_000, at_ms=3_000)
    assert claimed.status == "replaying" and claimed.started_at_ms == 3_000
    # A second replayer with the same threshold cannot claim it again: it is active since 3000.
    with pytest.raises(InvalidTransition):
        ledger.mark_replaying(b, stale_before_ms=2_000)


def test_two_replayers_cannot_claim_the_same_batch(ledger: Ledger, ledger_url):
    b = plan(ledger, "run-1", r(0, 0, 10)).batch_id
    ledger.mark_running(b)
    ledger.mark_failed(b, "boom")
    results = with_ledgers_at_once(ledger_url, 4, lambda led, i: led.mark_replaying(b))
    assert sum(isinstance(x, InvalidTransition) for x in results) == 3, results
    assert ledger.batch(b).status == "replaying" and ledger.batch(b).attempts == 2


def test_unknown_batches_are_reported(ledger: Ledger):
    assert ledger.batch(12345) is None
    with pytest.raises(UnknownBatch, match="No batch 12345"):
        ledger.mark_running(12345)
    with pytest.raises(UnknownBatch):
        ledger.record_metrics(12345, rate=1.0)


# --------------------------------------------------------------------------------------------------
# Replay and commits
# --------------------------------------------------------------------------------------------------


def test_replayable_batches_are_failed_ones_earliest_first_plus_stale_ones(ledger: Ledger):
    ids = [plan(ledger, f"run-{i}", r(0, 10 * i, 10 * i + 10)).batch_id for i in range(5)]
    for b in ids:
        ledger.mark_running(b, at_ms=1_000)
    ledger.mark_failed(ids[3], "x")
    ledger.mark_failed(ids[1], "y")
    ledger.mark_succeeded(ids[0], 10, 1)
    # ids[2] and ids[4] are still running (since 1000)
    assert [b.batch_id for b in ledger.replayable_batches(P)] == [ids[1], ids[3]]
    assert [b.batch_id for b in ledger.replayable_batches(P, stale_before_ms=500)] == [ids[1], ids[3]]
    assert [b.batch_id for b in ledger.replayable_batches(P, stale_before_ms=1_001)] == ids[1:]
    # A planned batch never started counts from its creation time.
    late = plan(ledger, "run-late", r(0, 50, 60)).batch_id
    now = int(time.time() * 1000)
    assert late not in [b.batch_id for b in ledger.replayable_batches(P, stale_before_ms=now - 60_000)]
    assert late in [b.batch_id for b in ledger.replayable_batches(P, stale_before_ms=now + 60_000)]
    first = ledger.replayable_batches(P)[0]
    assert first.plan.ranges == (r(0, 10, 20),) and first.error == "y"
    assert ledger.replayable_batches("other") == []


def test_committable_offsets_stop_at_a_failed_range_and_advance_after_its_replay(ledger: Ledger):
    b1 = plan(ledger, "run-1", r(0, 0, 10), r(1, 0, 5)).batch_id
    b2 = plan(ledger, "run-2", r(0, 10, 20), r(1, 5, 5)).batch_id
    b3 = plan(ledger, "run-3", r(0, 20, 30), r(1, 5, 8)).batch_id
    assert ledger.committable_offsets(P) == {}
    for b in (b1, b2, b3):
        ledger.mark_running(b)
    ledger.mark_succeeded(b1, 15, 1)
    ledger.mark_failed(b2, "boom")
    ledger.mark_succeeded(b3, 13, 1)
    # events-0 stops at the failed [10, 20); events-1 had nothing in b2, so it runs to 8.
    assert ledger.committable_offsets(P) == {TP0: 10, TP1: 8}
    ledger.mark_replaying(b2)
    assert ledger.committable_offsets(P) == {TP0: 10, TP1: 8}
    ledger.mark_replayed(b2, 10, 1)
    assert ledger.committable_offsets(P) == {TP0: 30, TP1: 8}
    # A new batch in flight holds the commit at its start.
    b4 = plan(ledger, "run-4", r(0, 30, 40)).batch_id
    ledger.mark_running(b4)
    assert ledger.committable_offsets(P) == {TP0: 30, TP1: 8}


def test_data_loss_is_recorded_as_lost_ranges_that_keep_the_chain_and_count_as_done(ledger: Ledger):
    b1 = plan(ledger, "run-1", r(0, 0, 10), r(1, 0, 10)).batch_id
    ledger.mark_running(b1)
    ledger.mark_succeeded(b1, 20, 1)
    # Retention deleted [10, 40) of events-0 and [10, 12) of events-1 before they were read.
    p2 = plan(
        ledger,
        "run-2",
        r(0, 40, 50),
        r(1, 12, 12),
        data_loss=[DataLoss(T, 0, 10, 40), DataLoss(T, 1, 10, 12)],
    )
    assert p2.data_loss == (DataLoss(T, 0, 10, 40), DataLoss(T, 1, 10, 12))
    assert ledger.get_plan(P, "run-2") == p2
    assert stored(ledger) == [
        (T, 0, 0, 10, None, "succeeded"),
        (T, 0, 10, 40, 10, "lost"),
        (T, 0, 40, 50, 40, "planned"),
        (T, 1, 0, 10, None, "succeeded"),
        (T, 1, 10, 12, 10, "lost"),
    ]
    assert ledger.heads(P) == {TP0: 50, TP1: 12}
    assert ledger.committable_offsets(P) == {TP0: 40, TP1: 12}
    ledger.mark_running(p2.batch_id)
    assert [x.status for x in ledger.batch_ranges(p2.batch_id)] == ["lost", "running", "lost"]
    ledger.mark_failed(p2.batch_id, "x")
    ledger.mark_replaying(p2.batch_id)
    ledger.mark_replayed(p2.batch_id, 10, 1)
    assert [x.status for x in ledger.batch_ranges(p2.batch_id)] == ["lost", "replayed", "lost"]
    assert ledger.committable_offsets(P) == {TP0: 50, TP1: 12}


def test_data_loss_on_the_first_run_starts_the_chain(ledger: Ledger):
    p = plan(ledger, "run-1", r(0, 100, 120), data_loss=[DataLoss(T, 0, 40, 100)])
    assert stored(ledger) == [(T, 0, 40, 100, None, "lost"), (T, 0, 100, 120, 100, "planned")]
    assert ledger.committable_offsets(P) == {TP0: 100}
    ledger.mark_running(p.batch_id)
    ledger.mark_succeeded(p.batch_id, 20, 1)
    assert ledger.committable_offsets(P) == {TP0: 120}


# --------------------------------------------------------------------------------------------------
# Queries for the operators and the UI
# --------------------------------------------------------------------------------------------------


def test_recent_batches_are_newest_first_with_their_metrics(ledger: Ledger):
    ids = [plan(ledger, f"run-{i}", r(0, 10 * i, 10 * i + 10)).batch_id for i in range(4)]
    for b in ids[:3]:
        ledger.mark_running(b, executors=2)
        ledger.mark_succeeded(b, 10, 1_000 + b)
    ledger.record_metrics(ids[2], scheduling_delay_ms=30, rate=12.0)
    recent = ledger.recent_batches(P, limit=2)
    assert [b.batch_id for b in recent] == [ids[3], ids[2]]
    assert recent[1].processing_ms == 1_000 + ids[2] and recent[1].records == 10
    assert (recent[1].scheduling_delay_ms, recent[1].rate, recent[1].executors) == (30, 12.0, 2)
    done = ledger.recent_batches(P, limit=10, statuses=["succeeded"])
    assert [b.batch_id for b in done] == ids[2::-1]
    assert recent[1].to_dict()["plan"]["batch_id"] == ids[2]
    with pytest.raises(ValueError, match="Unknown batch statuses"):
        ledger.recent_batches(P, statuses=["done"])


def test_a_ledger_can_use_an_existing_engine(ledger_url):
    from sqlalchemy import create_engine

    engine = create_engine(ledger_url)
    try:
        first, second = Ledger(engine), Ledger(engine)  # configuring twice is harmless
        first.create_all()
        p = plan(first, "run-1", r(0, 0, 10))
        assert second.get_plan(P, "run-1") == p
    finally:
        engine.dispose()


def test_sqlite_connections_enforce_foreign_keys_and_use_wal(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'sub' / 'ledger.db'}")
    try:
        led.create_all()  # creates the missing directory too
        with led.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    finally:
        led.dispose()


def test_tasks_opening_a_new_sqlite_ledger_together_all_get_in(tmp_path):
    # A fresh installation: several tasks open the not-yet-existing ledger file at the same moment.
    # Switching a new file to WAL needs it to itself, and SQLite refused the losers at once with
    # "database is locked" (its busy timeout does not cover the switch); about one round in eight
    # failed that way with four tasks. Every task now waits its turn, bounded by the ledger's timeout.
    def first_query(led: Ledger, i: int) -> object:
        with led.engine.connect() as conn:
            return conn.exec_driver_sql("PRAGMA journal_mode").scalar()

    for round_ in range(40):
        folder = tmp_path / f"round-{round_}"
        folder.mkdir()  # only the ledger's upgrade creates a missing folder, not a bare connection
        results = with_ledgers_at_once(f"sqlite:///{folder / 'ledger.db'}", 6, first_query)
        assert results == ["wal"] * 6, (round_, results)
