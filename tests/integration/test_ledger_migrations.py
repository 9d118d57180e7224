"""Schema evolution of the ledger: Alembic revisions with their own version table, on SQLite and a
real PostgreSQL. A ledger made before migrations existed (the frozen DDL of main at ff81bc0), filled
with batches and ranges, is upgraded in place and keeps its data and its chain constraints."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from airflow_kafka_backpressure.batch.models import BatchPlan, DataLoss, OffsetRange, TopicPartition
from airflow_kafka_backpressure.ledger import Ledger, LedgerError, metadata
from airflow_kafka_backpressure.ledger.migrate import BASELINE_REVISION, VERSION_TABLE, head_revision
from tests.integration.ledger_dbs import describe_schema, new_database, run_ddl, with_ledgers_at_once  # noqa: F401
from tests.integration.ledger_v0_ddl import DDL

P, T = "orders", "events"
TP0, TP1, TP2 = TopicPartition(T, 0), TopicPartition(T, 1), TopicPartition(T, 2)


def dialect_of(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def schema_of(url: str) -> dict:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return describe_schema(conn)
    finally:
        engine.dispose()


def legacy_ledger(url: str) -> None:
    """A ledger as main's code left it: its DDL and rows written the way its repository wrote them.

    orders, events-0: [0,10) succeeded, [10,20) failed, [20,30) succeeded, [30,35) running.
    orders, events-1: [0,5) succeeded, (batch 2 empty), [5,8) lost + [8,12) succeeded, (batch 4 empty).
    orders, events-2: only an empty range at 7 in the latest plan.  other, events-0: [100,150) replayed.
    """
    run_ddl(url, DDL[dialect_of(url)])
    batches = [
        # batch_id, pipeline, run_id, status, ranges, data loss
        (1, P, "run-1", "succeeded", [(0, 0, 10), (1, 0, 5)], []),
        (2, P, "run-2", "failed", [(0, 10, 20), (1, 5, 5)], []),
        (3, P, "run-3", "succeeded", [(0, 20, 30), (1, 8, 12)], [(1, 5, 8)]),
        (4, P, "run-4", "running", [(0, 30, 35), (1, 12, 12), (2, 7, 7)], []),
        (5, "other", "run-1", "replayed", [(0, 100, 150)], []),
    ]
    heads: dict[tuple[str, int], int] = {}
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for batch_id, pipeline, run_id, status, ranges, losses in batches:
                plan = BatchPlan(
                    pipeline,
                    batch_id,
                    run_id,
                    tuple(OffsetRange(T, p, a, b) for p, a, b in ranges),
                    "/sink",
                    5000,
                    1000 * batch_id,
                    10.0,
                    tuple(DataLoss(T, p, a, b) for p, a, b in losses),
                    3,
                )
                conn.execute(
                    text(
                        "INSERT INTO kbp_batches (batch_id, pipeline, run_id, status, created_at_ms, "
                        "started_at_ms, attempts, error, plan_json, sink, rate) VALUES (:b, :p, :r, :s, "
                        ":c, :c, 1, :e, :j, '/sink', 10.0)"
                    ),
                    {
                        "b": batch_id,
                        "p": pipeline,
                        "r": run_id,
                        "s": status,
                        "c": 1000 * batch_id,
                        "e": "boom" if status == "failed" else None,
                        "j": plan.to_json(),
                    },
                )
                rows = [(p, a, b, "lost") for p, a, b in losses] + [
                    (p, a, b, status) for p, a, b in ranges if b > a
                ]
                for p, a, b, st in sorted(rows):
                    conn.execute(
                        text(
                            'INSERT INTO kbp_ranges (batch_id, pipeline, topic, "partition", from_offset, '
                            "until_offset, prev_until, status) VALUES (:b, :p, :t, :n, :f, :u, :prev, :s)"
                        ),
                        {
                            "b": batch_id,
                            "p": pipeline,
                            "t": T,
                            "n": p,
                            "f": a,
                            "u": b,
                            "prev": heads.get((pipeline, p)),
                            "s": st,
                        },
                    )
                    heads[(pipeline, p)] = b
        if dialect_of(url) == "postgresql":  # rows were inserted with explicit ids: move the sequence on
            with engine.begin() as conn:
                conn.execute(text("SELECT setval(pg_get_serial_sequence('kbp_batches', 'batch_id'), 5)"))
    finally:
        engine.dispose()


def all_rows(url: str) -> dict[str, list[tuple]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                "batches": [
                    tuple(r)
                    for r in conn.execute(
                        text(
                            "SELECT batch_id, pipeline, run_id, status, created_at_ms, started_at_ms, ended_at_ms, "
                            "records, processing_ms, attempts, error, plan_json, sink FROM kbp_batches ORDER BY batch_id"
                        )
                    )
                ],
                "ranges": [
                    tuple(r)
                    for r in conn.execute(
                        text(
                            'SELECT id, batch_id, pipeline, topic, "partition", from_offset, until_offset, prev_until, '
                            "status FROM kbp_ranges ORDER BY id"
                        )
                    )
                ],
            }
    finally:
        engine.dispose()


# --------------------------------------------------------------------------------------------------


def test_the_baseline_revision_is_the_schema_made_before_migrations(new_database):
    frozen, baseline = new_database(), new_database()
    run_ddl(frozen, DDL[dialect_of(frozen)])
    with Ledger(baseline) as led:
        assert led.upgrade(BASELINE_REVISION) == (None, BASELINE_REVISION)
    assert schema_of(baseline) == schema_of(frozen)
    assert "kbp_batches" in schema_of(frozen) and "kbp_ranges" in schema_of(frozen)


def test_the_newest_revision_is_the_schema_the_code_declares(new_database):
    """One definition: the tables of ``schema.py`` and the result of every migration are the same."""
    declared, migrated = new_database(), new_database()
    engine = create_engine(declared)
    try:
        with engine.begin() as conn:
            metadata.create_all(conn)
    finally:
        engine.dispose()
    with Ledger(migrated) as led:
        assert led.upgrade() == (None, head_revision())
        assert led.schema_revision() == head_revision()
    assert schema_of(migrated) == schema_of(declared)


def test_a_ledger_made_before_migrations_is_upgraded_with_its_data(new_database):
    url = new_database()
    legacy_ledger(url)
    before = all_rows(url)
    with Ledger(url) as led:
        assert led.schema_revision() is None
        assert led.upgrade() == (None, head_revision())
        assert led.schema_revision() == head_revision()
        assert all_rows(url) == before  # nothing of the old rows changed
        # The repository reads the old history as the old code did.
        assert led.heads(P) == {TP0: 35, TP1: 12, TP2: 7}
        assert led.committable_offsets(P) == {TP0: 10, TP1: 12}
        assert led.committable_offsets("other") == {TP0: 150}
        assert [b.batch_id for b in led.replayable_batches(P)] == [2]
        # ... and goes on writing it: the next plan continues every chain; ids are never reused.
        nxt = led.record_plan(
            P, "run-5", [OffsetRange(T, 0, 35, 40), OffsetRange(T, 1, 12, 13)], "/sink", 5000, 0
        )
        assert nxt.batch_id == 6
        assert led.heads(P) == {TP0: 40, TP1: 13}
        led.mark_replaying(2)
        led.mark_replayed(2, 10, 1)
        assert led.committable_offsets(P) == {TP0: 30, TP1: 12}
        # The loss the old plan recorded is listed; the new states and retention work on old rows.
        assert [(b.batch_id, [(s.loss, s.kind) for s in b.spans]) for b in led.losses(P)] == [
            (3, [(DataLoss(T, 1, 5, 8), "plan")])
        ]
        led.mark_running(4)
        led.mark_failed(4, "gone")
        led.abandon(4, "retention")
        assert led.committable_offsets(P) == {TP0: 35, TP1: 12}
        assert led.prune(P, keep_batches=1).batches == 4
        assert led.heads(P) == {TP0: 40, TP1: 13}
    # The database still enforces the chains on the upgraded tables (through the ledger's engine:
    # SQLite enforces foreign keys only on connections that switch them on).
    led = Ledger(url)
    engine = led.engine
    try:
        for start, end, prev in [(20, 45, 20), (40, 50, None), (45, 50, 45)]:  # overlap, 2nd start, gap
            with pytest.raises(IntegrityError):
                with engine.begin() as conn:
                    conn.execute(
                        text(
                            'INSERT INTO kbp_ranges (batch_id, pipeline, topic, "partition", from_offset, '
                            "until_offset, prev_until, status) VALUES (6, :p, :t, 0, :f, :u, :prev, 'planned')"
                        ),
                        {"p": P, "t": T, "f": start, "u": end, "prev": prev},
                    )
        with pytest.raises(IntegrityError):
            with engine.begin() as conn:  # a range others refer to (here: the head) cannot be deleted
                conn.execute(
                    text("DELETE FROM kbp_ranges WHERE pipeline = :p AND from_offset = 35"), {"p": P}
                )
    finally:
        led.dispose()


def test_an_upgrade_never_hands_out_a_deleted_batch_id_again(new_database):
    url = new_database()
    legacy_ledger(url)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:  # the newest batch was deleted by hand before the upgrade
            conn.execute(text("DELETE FROM kbp_ranges WHERE batch_id = 5"))
            conn.execute(text("DELETE FROM kbp_batches WHERE batch_id = 5"))
    finally:
        engine.dispose()
    with Ledger(url) as led:
        led.upgrade()
        assert led.record_plan("other", "run-2", [OffsetRange(T, 0, 0, 5)], "/sink", 5000, 0).batch_id == 6


def test_concurrent_first_use_upgrades_once(new_database):
    url = new_database()
    results = with_ledgers_at_once(url, 4, lambda led, i: led.upgrade())
    assert all(isinstance(r, tuple) and r[1] == head_revision() for r in results), results
    assert sum(r[0] is None for r in results) >= 1
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == [
                head_revision()
            ]
    finally:
        engine.dispose()


def test_a_ledger_newer_than_the_code_is_refused(new_database):
    url = new_database()
    with Ledger(url) as led:
        led.upgrade()
        with led.engine.begin() as conn:
            conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999_from_the_future'"))
        with pytest.raises(LedgerError) as e:
            led.upgrade()
    msg = str(e.value)
    assert "'9999_from_the_future'" in msg and head_revision() in msg
    assert "newer release" in msg and "Install that release" in msg


def test_airflows_own_alembic_version_is_left_alone(new_database):
    """A ledger pointed at Airflow's metadata database keeps its own version table."""
    url = new_database()
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
            conn.execute(text("INSERT INTO alembic_version VALUES ('airflow_rev_3_3')"))
        with Ledger(url) as led:
            led.upgrade()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [
                "airflow_rev_3_3"
            ]
    finally:
        engine.dispose()


def test_the_upgrade_command(tmp_path):
    url = f"sqlite:///{tmp_path / 'legacy.db'}"
    legacy_ledger(url)
    cmd = [sys.executable, "-m", "airflow_kafka_backpressure.ledger"]
    current = subprocess.run(cmd + ["current", "--url", url], capture_output=True, text=True, timeout=120)
    assert current.returncode == 0, current.stderr
    assert "revision none" in current.stdout and "upgrade" in current.stdout
    up = subprocess.run(cmd + ["upgrade", "--url", url], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    assert f"upgraded from no schema to revision {head_revision()}" in up.stdout
    again = subprocess.run(cmd + ["upgrade", "--url", url], capture_output=True, text=True, timeout=120)
    assert f"already at revision {head_revision()}" in again.stdout
    with Ledger(url) as led:
        assert led.heads(P) == {TP0: 35, TP1: 12, TP2: 7}


def test_losses_recorded_before_the_upgrade_outlive_their_pruned_batches(new_database):
    """Issue 39, item 8: revision 0005 lets a recorded loss outlive its batch (kbp_losses no longer
    references kbp_batches). The old ledger's loss (batch 3's, found by its plan) is upgraded with
    it; pruning its batch keeps the loss, with every column of its row."""
    url = new_database()
    legacy_ledger(url)
    with Ledger(url) as led:
        led.upgrade()
        led.mark_replaying(2)
        led.mark_replayed(2, 10, 1)
        led.record_plan(P, "run-5", [OffsetRange(T, 0, 35, 40), OffsetRange(T, 1, 12, 13)], "/sink", 5000, 0)
        before = led.losses(P)
        assert [(x.batch_id, x.status, x.lost) for x in before] == [(3, "succeeded", 3)]
        assert led.prune(P, keep_batches=1).batches == 3
        assert led.batch(3) is None
        (after,) = led.losses(P)
        assert (after.batch_id, after.status, after.spans) == (3, None, before[0].spans)
    assert schema_of(url)["kbp_losses"]["foreign_keys"] == []
