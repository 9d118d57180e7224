"""Per-partition bookkeeping (heads, commit watermarks) against a from-scratch computation over every
range row, on SQLite and PostgreSQL; and the statements of one batch's bookkeeping use indexes only."""

from __future__ import annotations

import random
import re

import pytest
from sqlalchemy import event, text

from airflow_kafka_backpressure.batch.models import DataLoss, OffsetRange, TopicPartition
from airflow_kafka_backpressure.ledger import InvalidTransition, Ledger
from tests.integration.ledger_dbs import ledger, ledger_url  # noqa: F401 (fixtures)

P, T = "orders", "events"
DONE = ("succeeded", "replayed", "lost")


def from_scratch(led: Ledger, pipeline: str = P) -> tuple[dict, dict]:
    """(heads of stored ranges, committable offsets) computed from all range rows, as before the
    bookkeeping table existed: head = max until; commit = first unfinished ``from`` else max until."""
    with led.engine.connect() as conn:
        rows = conn.execute(
            text(
                'SELECT topic, "partition", from_offset, until_offset, status FROM kbp_ranges WHERE pipeline = :p'
            ),
            {"p": pipeline},
        ).all()
    by_tp: dict[TopicPartition, list] = {}
    for t, n, a, b, s in rows:
        by_tp.setdefault(TopicPartition(t, n), []).append((a, b, s))
    heads, commit = {}, {}
    for tp, rs in by_tp.items():
        rs.sort()
        heads[tp] = rs[-1][1]
        first_not_done = next((a for a, _, s in rs if s not in DONE), None)
        c = rs[-1][1] if first_not_done is None else first_not_done
        if c > rs[0][0]:
            commit[tp] = c
    return heads, commit


def stored_heads(led: Ledger) -> dict:
    """heads() without the positions of partitions that only had empty ranges."""
    with led.engine.connect() as conn:
        return {
            TopicPartition(t, n)
            for t, n in conn.execute(
                text('SELECT DISTINCT topic, "partition" FROM kbp_ranges WHERE pipeline = :p'), {"p": P}
            )
        }


@pytest.mark.parametrize("seed", [1, 2])
def test_random_histories_keep_heads_and_watermarks_equal_to_a_full_recount(ledger: Ledger, seed: int):
    rng = random.Random(seed)
    partitions = 4
    batches: list[int] = []
    for step in range(120):
        op = rng.random()
        if op < 0.35 or not batches:
            heads = ledger.heads(P)
            ranges, losses = [], []
            for n in range(partitions):
                if rng.random() < 0.2:
                    continue  # not in this plan
                start = heads.get(TopicPartition(T, n), rng.randrange(0, 50))
                if rng.random() < 0.1:  # retention deleted some offsets before the plan
                    losses.append(DataLoss(T, n, start, start + rng.randrange(1, 5)))
                    start = losses[-1].until_offset
                ranges.append(OffsetRange(T, n, start, start + rng.choice([0, 0, 1, 3, 7])))
            if not ranges:
                continue
            batches.append(
                ledger.record_plan(P, f"run-{step}", ranges, "/s", 1000, 0, data_loss=losses).batch_id
            )
        else:
            b = rng.choice(batches)
            action = rng.choice(["running", "succeeded", "failed", "replaying", "replayed"])
            try:
                mark, args = {
                    "running": (ledger.mark_running, ()),
                    "succeeded": (ledger.mark_succeeded, (1, 1)),
                    "failed": (ledger.mark_failed, ("x",)),
                    "replaying": (ledger.mark_replaying, ()),
                    "replayed": (ledger.mark_replayed, (1, 1)),
                }[action]
                mark(b, *args)
            except InvalidTransition:
                continue
        heads, commit = from_scratch(ledger)
        assert {tp: h for tp, h in ledger.heads(P).items() if tp in stored_heads(ledger)} == heads, step
        assert ledger.committable_offsets(P) == commit, step
    assert any(commit for commit in [from_scratch(ledger)[1]]), "the walk never committed anything"


def test_a_replayed_range_lets_the_watermark_jump_over_every_done_range_after_it(ledger: Ledger):
    ids = [
        ledger.record_plan(P, f"r{i}", [OffsetRange(T, 0, 10 * i, 10 * i + 10)], "/s", 1, 0).batch_id
        for i in range(30)
    ]
    for i, b in enumerate(ids):
        ledger.mark_running(b)
        ledger.mark_failed(b, "x") if i == 3 else ledger.mark_succeeded(b, 10, 1)
    assert ledger.committable_offsets(P) == {TopicPartition(T, 0): 30}
    ledger.mark_replaying(ids[3])
    ledger.mark_replayed(ids[3], 10, 1)
    assert ledger.committable_offsets(P) == {TopicPartition(T, 0): 300}


def test_a_cleared_finished_run_pulls_the_watermark_back_until_it_succeeds_again(ledger: Ledger):
    ids = [
        ledger.record_plan(P, f"r{i}", [OffsetRange(T, 0, 10 * i, 10 * i + 10)], "/s", 1, 0).batch_id
        for i in range(4)
    ]
    for b in ids:
        ledger.mark_running(b)
        ledger.mark_succeeded(b, 10, 1)
    assert ledger.committable_offsets(P) == {TopicPartition(T, 0): 40}
    ledger.mark_running(ids[1])  # a user cleared the finished run of batch 2
    assert ledger.committable_offsets(P) == {TopicPartition(T, 0): 10}
    ledger.mark_running(ids[0])
    assert ledger.committable_offsets(P) == {}
    ledger.mark_succeeded(ids[0], 10, 1)
    ledger.mark_succeeded(ids[1], 10, 1)
    assert ledger.committable_offsets(P) == {TopicPartition(T, 0): 40}


def test_a_new_ledgers_first_commit_follows_each_chain_through_the_index(ledger: Ledger):
    """PostgreSQL, before its first ANALYZE of a new ledger, believes the tables nearly empty. The
    step of the commit watermark's recursive query must still look up each run's next range in the
    unique index (a correlated subquery), not join every range with every run: that join was planned
    as a nested loop comparing both (10,000 x 10,000 rows, 5-10 s for a batch's first commit)."""
    if ledger.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's planner: SQLite's plans are checked below")
    ranges = [OffsetRange(T, n, 0, 10) for n in range(500)]
    b = ledger.record_plan(P, "run-1", ranges, "/s", 1, 0).batch_id
    ledger.mark_running(b)
    plans: list[str] = []

    def explain(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("WITH RECURSIVE"):
            cursor.execute("EXPLAIN ANALYZE " + statement, parameters)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))

    event.listen(ledger.engine, "before_cursor_execute", explain)
    try:
        ledger.mark_succeeded(b, 5000, 1)
    finally:
        event.remove(ledger.engine, "before_cursor_execute", explain)
    assert plans, "the commit watermark's recursive query did not run"
    assert all("SubPlan" in plan and "Join Filter" not in plan for plan in plans), plans
    assert ledger.committable_offsets(P) == {r.tp: 10 for r in ranges}


def test_names_with_quotes_commas_and_braces_keep_their_partitions_apart(ledger: Ledger):
    """On PostgreSQL a plan's rows go to the server as one array literal per column: names that
    array syntax treats specially come back as they were, each partition with its own bookkeeping."""
    pipeline = 'p "q", {r} \\s NULL'
    topics = ['t"1', "t,2", "t{3}", "t\\4", "NULL", "t 5", ""]
    topics.remove("")  # a topic name is never empty (OffsetRange refuses it)
    ranges = [OffsetRange(t, n, 10 * n, 10 * n + 5) for t in topics for n in range(2)]
    b = ledger.record_plan(pipeline, "run-1", ranges, "/s", 1, 0).batch_id
    ledger.mark_running(b)
    ledger.mark_succeeded(b, 5 * len(ranges), 1)
    want = {r.tp: r.until_offset for r in ranges}
    assert ledger.heads(pipeline) == want
    assert ledger.committable_offsets(pipeline) == want
    assert ledger.pipelines() == [pipeline]
    nxt = [OffsetRange(t, n, 10 * n + 5, 10 * n + 9) for t in topics for n in range(2)]
    ledger.record_plan(pipeline, "run-2", nxt, "/s", 1, 0)
    assert ledger.heads(pipeline) == {r.tp: r.until_offset for r in nxt}
    assert ledger.committable_offsets(pipeline) == want


def test_one_batch_of_bookkeeping_reads_through_indexes_only(tmp_path):
    """SQLite's query plans for every statement of plan + transitions + heads + commits (and the
    replayable batches and pipelines the page asks for): no table is scanned, so the cost does not
    grow with the history."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.upgrade()
    try:
        for i in range(3):  # some history, and a second pipeline
            for pipeline in (P, "other"):
                b = led.record_plan(
                    pipeline, f"r{i}", [OffsetRange(T, n, 10 * i, 10 * i + 10) for n in range(3)], "/s", 1, 0
                ).batch_id
                led.mark_running(b)
                led.mark_succeeded(b, 30, 1)
        statements: list[tuple[str, object]] = []

        def capture(conn, cursor, statement, parameters, context, executemany):
            if statement.lstrip().upper().startswith(("SELECT", "UPDATE", "INSERT", "DELETE", "WITH")):
                statements.append((statement, parameters[0] if executemany else parameters))

        event.listen(led.engine, "before_cursor_execute", capture)
        b = led.record_plan(
            P, "r9", [OffsetRange(T, n, 30, 40) for n in range(3)], "/s", 1, 0, data_loss=[]
        ).batch_id
        led.mark_running(b)
        led.mark_failed(b, "x")
        led.mark_replaying(b)
        led.mark_replayed(b, 30, 1)
        led.mark_running(b)
        led.mark_succeeded(b, 30, 1)
        led.heads(P)
        led.committable_offsets(P)
        led.replayable_batches(P)
        assert led.pipelines() == [P, "other"]
        event.remove(led.engine, "before_cursor_execute", capture)
        assert len(statements) > 10
        with led.engine.connect() as conn:
            for sql, params in statements:
                plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params).all()
                # (scans of a recursive query's own rows, one per step it takes, are not tables)
                scans = [
                    row[-1]
                    for row in plan
                    if re.match(r"SCAN (kbp_(batches|ranges|partitions|losses|next))\b", row[-1])
                ]
                assert not scans, (sql, plan)
                # Nor read every row of the pipeline's history through an index on (pipeline, ...).
                history = [
                    row[-1]
                    for row in plan
                    if re.match(
                        r"SEARCH kbp_(batches|ranges|next) .*\((pipeline=\?( AND topic=\?( AND partition=\?)?)?)\)$",
                        row[-1],
                    )
                    and "COVERING INDEX ix_kbp_batches_pipeline_batch_id"
                    not in row[-1]  # max(batch_id): one row
                ]
                assert not history, (sql, plan)
    finally:
        led.dispose()
