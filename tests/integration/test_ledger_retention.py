"""The terminal way out (abandon), recorded losses and retention (prune), on SQLite and PostgreSQL.

Every test ends by checking the chain constraints still hold in the database: a range that
overlaps, leaves a gap or starts a second chain is refused, and the middle of a chain cannot be
deleted.
"""

from __future__ import annotations

import shlex
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from airflow_kafka_backpressure.batch.models import DataLoss, OffsetRange, TopicPartition
from airflow_kafka_backpressure.ledger import InvalidTransition, Ledger, LedgerConflict, LedgerError
from tests.integration.ledger_dbs import ledger, ledger_url  # noqa: F401 (fixtures)

P, T = "orders", "events"
TP0, TP1 = TopicPartition(T, 0), TopicPartition(T, 1)


def r(n: int, a: int, b: int) -> OffsetRange:
    return OffsetRange(T, n, a, b)


def plan(led: Ledger, run: str, *ranges: OffsetRange, data_loss=(), pipeline: str = P) -> int:
    return led.record_plan(pipeline, run, list(ranges), "/s", 1000, 0, data_loss=list(data_loss)).batch_id


def run_batches(
    led: Ledger, n: int, *, width: int = 10, fail: tuple[int, ...] = (), partitions: int = 2, start: int = 0
) -> list[int]:
    """``n`` batches of one ``width`` range per partition; the i-th in ``fail`` fails, others succeed.
    ``start``: the number of batches before them (their offsets continue from there)."""
    ids = []
    for i in range(start, start + n):
        b = plan(led, f"run-{i}", *[r(p, width * i, width * (i + 1)) for p in range(partitions)])
        led.mark_running(b, at_ms=1_000 + i)
        if i - start in fail:
            led.mark_failed(b, "boom", at_ms=2_000 + i)
        else:
            led.mark_succeeded(b, width * partitions, 1, at_ms=2_000 + i)
        ids.append(b)
    return ids


def rows(led: Ledger) -> list[tuple]:
    with led.engine.connect() as conn:
        return [
            tuple(x)
            for x in conn.execute(
                text(
                    'SELECT "partition", from_offset, until_offset, prev_until, status FROM kbp_ranges '
                    'WHERE pipeline = :p ORDER BY "partition", from_offset'
                ),
                {"p": P},
            )
        ]


def assert_chains_enforced(led: Ledger) -> None:
    """The database still refuses overlaps, gaps, second chain starts and deleting a chain's middle."""
    first = rows(led)
    if not first:
        return
    part, start, end, _, _ = first[0]
    last_end = max(u for p, _, u, _, _ in first if p == part)
    batch_id = led.recent_batches(P, 1)[0].batch_id
    insert = text(
        'INSERT INTO kbp_ranges (batch_id, pipeline, topic, "partition", from_offset, until_offset, prev_until, '
        "status) VALUES (:b, :p, :t, :n, :f, :u, :prev, 'planned')"
    )
    for f, u, prev in [
        (start, last_end + 5, None),
        (last_end + 1, last_end + 5, last_end + 1),
        (last_end - 1, last_end + 5, last_end - 1),
    ]:
        with pytest.raises(IntegrityError):
            with led.engine.begin() as conn:
                conn.execute(insert, {"b": batch_id, "p": P, "t": T, "n": part, "f": f, "u": u, "prev": prev})
    middle = [x for x in first if x[0] == part]
    if len(middle) >= 3:
        with pytest.raises(IntegrityError):
            with led.engine.begin() as conn:
                conn.execute(
                    text(
                        'DELETE FROM kbp_ranges WHERE pipeline = :p AND "partition" = :n AND from_offset = :f'
                    ),
                    {"p": P, "n": part, "f": middle[1][1]},
                )
    assert rows(led) == first


# --------------------------------------------------------------------------------------------------
# abandon
# --------------------------------------------------------------------------------------------------


def test_abandoning_a_failed_batch_records_its_offsets_as_lost_and_lets_commits_pass(ledger: Ledger):
    ids = run_batches(ledger, 4, fail=(1,))
    assert ledger.committable_offsets(P) == {TP0: 10, TP1: 10}
    done = ledger.abandon(ids[1], "retention deleted [10, 20) before the replay", at_ms=9_000)
    assert done.status == "abandoned" and done.ended_at_ms == 9_000 and done.error == "boom"
    assert [x.status for x in ledger.batch_ranges(ids[1])] == ["lost", "lost"]
    assert ledger.committable_offsets(P) == {TP0: 40, TP1: 40}
    assert ledger.replayable_batches(P, stale_before_ms=10**15) == []
    (entry,) = ledger.losses(P)
    assert (entry.batch_id, entry.status, entry.lost) == (ids[1], "abandoned", 20)
    assert [(s.loss, s.kind, s.reason, s.recorded_at_ms) for s in entry.spans] == [
        (DataLoss(T, 0, 10, 20), "abandon", "retention deleted [10, 20) before the replay", 9_000),
        (DataLoss(T, 1, 10, 20), "abandon", "retention deleted [10, 20) before the replay", 9_000),
    ]
    assert entry.to_dict()["lost"] == 20 and entry.to_dict()["spans"][0]["kind"] == "abandon"
    assert ledger.abandon(ids[1], "again") == ledger.batch(ids[1])  # idempotent: nothing recorded twice
    assert ledger.losses(P)[0].lost == 20
    assert_chains_enforced(ledger)


def test_abandoned_is_terminal(ledger: Ledger):
    ids = run_batches(ledger, 2, fail=(0,))
    ledger.abandon(ids[0], "gone")
    for attempt in (
        lambda: ledger.mark_running(ids[0]),
        lambda: ledger.mark_replaying(ids[0]),
        lambda: ledger.mark_failed(ids[0], "x"),
        lambda: ledger.mark_succeeded(ids[0], 1, 1),
    ):
        with pytest.raises(InvalidTransition, match="abandoned: its offsets are recorded as lost"):
            attempt()
    assert ledger.batch(ids[0]).status == "abandoned"


def test_only_failed_or_stale_batches_can_be_abandoned(ledger: Ledger):
    ids = run_batches(ledger, 2)
    with pytest.raises(InvalidTransition, match="nothing to abandon"):
        ledger.abandon(ids[0], "x")
    b = plan(ledger, "run-x", r(0, 20, 30))
    ledger.mark_running(b, at_ms=5_000)
    with pytest.raises(InvalidTransition, match="may still be in progress"):
        ledger.abandon(b, "x")
    with pytest.raises(InvalidTransition, match="may still be in progress"):
        ledger.abandon(b, "x", stale_before_ms=5_000)
    assert ledger.abandon(b, "worker died, offsets gone", stale_before_ms=5_001).status == "abandoned"
    with pytest.raises(ValueError, match="give a reason"):
        ledger.abandon(ids[1], "  ")


def test_a_batch_with_losses_found_by_its_plan_abandons_only_the_rest(ledger: Ledger):
    b = plan(ledger, "run-1", r(0, 40, 50), data_loss=[DataLoss(T, 0, 30, 40)])
    assert [(s.loss, s.kind) for s in ledger.losses(P)[0].spans] == [(DataLoss(T, 0, 30, 40), "plan")]
    ledger.mark_running(b)
    ledger.mark_failed(b, "x")
    ledger.abandon(b, "gone too")
    spans = ledger.losses(P)[0].spans
    assert [(s.loss, s.kind) for s in spans] == [
        (DataLoss(T, 0, 30, 40), "plan"),
        (DataLoss(T, 0, 40, 50), "abandon"),
    ]
    assert ledger.committable_offsets(P) == {TP0: 50}


# --------------------------------------------------------------------------------------------------
# record_losses (a replay found part of a range deleted)
# --------------------------------------------------------------------------------------------------


def test_a_replay_records_a_partial_loss_and_commits_move_past_the_batch(ledger: Ledger):
    ids = run_batches(ledger, 3, fail=(1,))
    ledger.mark_replaying(ids[1])
    new = ledger.record_losses(ids[1], [DataLoss(T, 0, 10, 13)], "earliest offset is now 13", at_ms=7_000)
    assert new == [DataLoss(T, 0, 10, 13)]
    # a retried replay finds more gone: only the new part is recorded
    assert ledger.record_losses(ids[1], [DataLoss(T, 0, 10, 15)]) == [DataLoss(T, 0, 13, 15)]
    assert ledger.record_losses(ids[1], [DataLoss(T, 0, 10, 15)]) == []
    ledger.mark_replayed(ids[1], records=15, processing_ms=1)
    assert ledger.committable_offsets(P) == {TP0: 30, TP1: 30}
    (entry,) = ledger.losses(P)
    assert entry.status == "replayed" and entry.lost == 5
    assert [(s.from_offset, s.until_offset, s.kind, s.reason) for s in entry.spans] == [
        (10, 13, "replay", "earliest offset is now 13"),
        (13, 15, "replay", None),
    ]


def test_losses_outside_the_batch_or_after_it_finished_are_refused(ledger: Ledger):
    ids = run_batches(ledger, 2, fail=(1,))
    with pytest.raises(
        LedgerError,
        match=rf"Batch {ids[1]}: the lost offsets events-0\[5, 15\) are not inside one of its "
        r"ranges \(events-0: events-0\[10, 20\)\)",
    ):
        ledger.record_losses(ids[1], [DataLoss(T, 0, 5, 15)])
    with pytest.raises(LedgerError, match="not inside"):
        ledger.record_losses(ids[1], [DataLoss(T, 7, 10, 12)])
    with pytest.raises(InvalidTransition, match="not after it finished"):
        ledger.record_losses(ids[0], [DataLoss(T, 0, 0, 1)])
    assert ledger.losses(P) == []


# --------------------------------------------------------------------------------------------------
# prune
# --------------------------------------------------------------------------------------------------


def test_prune_keeps_the_newest_batches_and_restarts_the_chains_at_the_first_kept_range(ledger: Ledger):
    ids = run_batches(ledger, 10)
    heads, commits = ledger.heads(P), ledger.committable_offsets(P)
    result = ledger.prune(P, keep_batches=3)
    assert (result.batches, result.ranges) == (7, 14)
    assert [b.batch_id for b in ledger.recent_batches(P, 100)] == ids[:6:-1]
    assert rows(ledger)[0] == (0, 70, 80, None, "succeeded") and rows(ledger)[1] == (
        0,
        80,
        90,
        80,
        "succeeded",
    )
    assert ledger.heads(P) == heads and ledger.committable_offsets(P) == commits
    assert ledger.prune(P, keep_batches=3) == type(result)()  # nothing more to do
    # the pipeline goes on: plans continue the chains, a failure still holds the commits back
    b = plan(ledger, "run-next", r(0, 100, 110), r(1, 100, 110))
    ledger.mark_running(b)
    ledger.mark_failed(b, "x")
    assert ledger.committable_offsets(P) == commits
    assert_chains_enforced(ledger)


def test_prune_never_passes_the_commit_watermark_or_deletes_what_is_not_done(ledger: Ledger):
    ids = run_batches(ledger, 6, fail=(2,))
    ledger.prune(P, keep_batches=1)
    # batches 0 and 1 go; the failed batch 2 and everything after it on its partitions stay
    assert [b.batch_id for b in sorted(ledger.recent_batches(P, 100), key=lambda b: b.batch_id)] == ids[2:]
    assert rows(ledger)[0][:4] == (0, 20, 30, None)
    ledger.mark_replaying(ids[2])
    ledger.mark_replayed(ids[2], 20, 1)
    assert ledger.committable_offsets(P) == {TP0: 60, TP1: 60}
    ledger.prune(P, keep_batches=1)
    # the newest batch stays (it holds the heads)
    assert [b.batch_id for b in ledger.recent_batches(P, 100)] == [ids[5]]
    assert rows(ledger) == [(0, 50, 60, None, "succeeded"), (1, 50, 60, None, "succeeded")]
    assert_chains_enforced(ledger)


def test_prune_by_age_and_of_abandoned_batches(ledger: Ledger):
    ids = run_batches(ledger, 5, fail=(1,))
    ledger.abandon(ids[1], "gone", at_ms=2_001)
    result = ledger.prune(P, older_than_ms=2_002)  # ended at 2000 (ids[0]) and 2001 (abandoned ids[1])
    assert result.batches == 2 and result.losses == 0
    # the abandoned batch's losses stay (issue 39, item 8): its row is gone, so no status
    assert [(x.batch_id, x.status, x.lost) for x in ledger.losses(P)] == [(ids[1], None, 20)]
    assert sorted(b.batch_id for b in ledger.recent_batches(P, 100)) == ids[2:]
    assert ledger.committable_offsets(P) == {TP0: 50, TP1: 50}
    with pytest.raises(ValueError, match="keep_batches and/or older_than_ms"):
        ledger.prune(P)
    with pytest.raises(ValueError, match="keep_batches must be >= 1"):
        ledger.prune(P, keep_batches=0)
    assert_chains_enforced(ledger)


def test_recorded_losses_outlive_their_pruned_batches_until_their_own_retention(ledger: Ledger):
    """Issue 39, item 8: pruning old batches (``ledger_keep_batches``) deleted their recorded
    losses with them, so a retention or topic-reset loss vanished from the ledger and the page a few
    days later. The losses stay, listed as before, and go only by their own retention."""
    from airflow_kafka_backpressure.plugins import views

    ids = run_batches(ledger, 5, fail=(1, 2))
    ledger.abandon(ids[1], "retention deleted them", at_ms=2_001)
    ledger.mark_replaying(ids[2], at_ms=2_500)
    assert ledger.record_losses(ids[2], [DataLoss(T, 0, 20, 23)], "retention, before the replay", at_ms=3_000)
    ledger.mark_replayed(ids[2], 17, 1, at_ms=3_001)
    before = [x.to_dict() for x in ledger.losses(P)]
    assert [(x["batch_id"], x["status"], x["lost"]) for x in before] == [
        (ids[2], "replayed", 3),
        (ids[1], "abandoned", 20),
    ]

    result = ledger.prune(P, keep_batches=1)
    assert (result.batches, result.losses) == (4, 0)
    assert [b.batch_id for b in ledger.recent_batches(P, 100)] == [ids[4]]
    after = [x.to_dict() for x in ledger.losses(P)]
    assert after == [{**x, "status": None} for x in before]  # every span, count and reason kept
    assert views.losses(ledger, P, 10) == after  # what the monitoring page's losses API lists
    assert ledger.losses("other") == []

    # their own retention: only those recorded before the cut whose batch is gone (a batch still in
    # the ledger keeps all of its losses, however old)
    (later,) = run_batches(ledger, 1, fail=(0,), start=5)
    ledger.abandon(later, "an old loss of a batch still in the ledger", at_ms=1_000)
    assert ledger.prune_losses(P, older_than_ms=2_500).losses == 2  # the abandon's two spans (2_001)
    assert [(x.batch_id, x.lost) for x in ledger.losses(P)] == [(later, 20), (ids[2], 3)]
    assert ledger.prune_losses(P, older_than_ms=3_001).losses == 1
    assert [x.batch_id for x in ledger.losses(P)] == [later]
    assert_chains_enforced(ledger)


def test_the_record_task_keeps_losses_for_ledger_keep_losses_days(ledger: Ledger):
    """The record task's retention (``ledger_keep_batches``, and ``ledger_keep_losses_days`` for
    recorded losses), run by the real operator against the real ledger."""
    from airflow_kafka_backpressure.config.pipeline import PipelineConfig
    from airflow_kafka_backpressure.operators import RecordBatchMetricsOperator

    now = int(time.time() * 1000)
    ids = run_batches(ledger, 4, fail=(0, 1))
    ledger.abandon(ids[0], "retention deleted them", at_ms=now - 3 * 86_400_000)  # 3 days ago
    ledger.abandon(ids[1], "a topic reset", at_ms=now - 3_600_000)  # an hour ago

    def record_task(**fields) -> RecordBatchMetricsOperator:
        p = PipelineConfig(name=P, topics=(T,), sink="/s", ledger_keep_batches=1, **fields)
        return RecordBatchMetricsOperator(task_id=f"record_{len(fields)}", pipeline=p)

    assert record_task()._prune(ledger) == 3
    assert [(x.batch_id, x.status) for x in ledger.losses(P)] == [(ids[1], None), (ids[0], None)]
    assert record_task(ledger_keep_losses_days=1.0)._prune(ledger) == 0
    assert [x.batch_id for x in ledger.losses(P)] == [ids[1]]  # the one 3 days old went


def test_prune_works_per_partition_and_in_chunks(ledger: Ledger):
    """A partition held back by a failed batch keeps its ranges; the other partition is pruned."""
    ids = []
    for i in range(8):
        b = plan(ledger, f"run-{i}", r(0, 0, 10) if i == 0 else r(1, 10 * i, 10 * (i + 1)))
        ledger.mark_running(b)
        ledger.mark_failed(b, "x") if i == 0 else ledger.mark_succeeded(b, 10, 1)
        ids.append(b)
    result = ledger.prune(P, keep_batches=1, chunk=2)
    assert (result.batches, result.ranges) == (6, 6)
    assert sorted(b.batch_id for b in ledger.recent_batches(P, 100)) == [ids[0], ids[7]]
    assert rows(ledger) == [(0, 0, 10, None, "failed"), (1, 70, 80, None, "succeeded")]
    assert ledger.heads(P) == {TP0: 10, TP1: 80}
    assert ledger.committable_offsets(P) == {TP1: 80}
    assert_chains_enforced(ledger)


def test_pruning_keeps_other_pipelines_apart(ledger: Ledger):
    run_batches(ledger, 4)
    other = plan(ledger, "run-0", r(0, 0, 10), pipeline="other")
    ledger.mark_running(other)
    ledger.mark_succeeded(other, 10, 1)
    ledger.prune(P, keep_batches=1)
    assert [b.batch_id for b in ledger.recent_batches("other", 10)] == [other]
    assert ledger.committable_offsets("other") == {TP0: 10}


# --------------------------------------------------------------------------------------------------
# the commands users run
# --------------------------------------------------------------------------------------------------


def test_the_abandon_and_prune_commands(tmp_path, capsys):
    from airflow_kafka_backpressure.ledger import abandon_command
    from airflow_kafka_backpressure.ledger.__main__ import main

    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger(url) as led:
        led.upgrade()
        ids = run_batches(led, 4, fail=(1,))
    assert main(["abandon", "--url", url, "--batch", str(ids[0]), "--reason", "x"]) == 1
    assert "nothing to abandon" in capsys.readouterr().err
    cmd = shlex.split(abandon_command(ids[1], reason="retention deleted it"))  # as a shell splits it
    assert cmd[:4] == ["python", "-m", "airflow_kafka_backpressure.ledger", "abandon"]
    assert main(cmd[3:] + ["--url", url]) == 0
    assert (
        f"Batch {ids[1]} of pipeline 'orders' is abandoned: its 20 offsets are recorded as lost"
        in capsys.readouterr().out
    )
    assert main(["prune", "--url", url, "--pipeline", P, "--keep-batches", "1"]) == 0
    assert "pruned 3 batches, 6 ranges, 0 loss records" in capsys.readouterr().out
    assert main(["prune", "--url", url, "--pipeline", P]) == 2
    assert "--losses-older-than-days" in capsys.readouterr().err
    with Ledger(url) as led:
        assert [b.batch_id for b in led.recent_batches(P, 10)] == [ids[3]]
        assert led.committable_offsets(P) == {TP0: 40, TP1: 40}
        assert [(x.batch_id, x.status, x.lost) for x in led.losses(P)] == [(ids[1], None, 20)]
    # the abandon was recorded just now: a day's retention keeps it, a tiny one deletes it
    assert main(["prune", "--url", url, "--pipeline", P, "--losses-older-than-days", "1"]) == 0
    assert "pruned 0 batches, 0 ranges, 0 loss records" in capsys.readouterr().out
    assert main(["prune", "--url", url, "--pipeline", P, "--losses-older-than-days", "0"]) == 2
    assert "must be > 0" in capsys.readouterr().err
    time.sleep(0.01)
    assert main(["prune", "--url", url, "--pipeline", P, "--losses-older-than-days", "1e-10"]) == 0
    assert "pruned 0 batches, 0 ranges, 2 loss records" in capsys.readouterr().out
    with Ledger(url) as led:
        assert led.losses(P) == []


def test_the_commands_resolve_an_airflow_connection(tmp_path):
    import json
    import os
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger(url) as led:
        led.upgrade()
        ids = run_batches(led, 2, fail=(0,))
    env = dict(
        os.environ,
        AIRFLOW_CONN_KBP_TEST_LEDGER=json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": url}}),
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_kafka_backpressure.ledger",
            "abandon",
            "--conn-id",
            "kbp_test_ledger",
            "--batch",
            str(ids[0]),
            "--reason",
            "gone",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    with Ledger(url) as led:
        assert led.batch(ids[0]).status == "abandoned"


# --------------------------------------------------------------------------------------------------
# a topic deleted and created again (issue 21, item 1)
# --------------------------------------------------------------------------------------------------


def test_a_reset_topic_keeps_its_old_rows_archived_and_the_new_topic_starts_its_chains_at_0(ledger: Ledger):
    ids = run_batches(ledger, 3, fail=(2,))  # batches 1-2 done, 3 failed
    with pytest.raises(LedgerConflict, match=rf"batches \[{ids[2]}\] still read its old offsets"):
        ledger.reset_topic(P, T, "events#old")
    ledger.abandon(ids[2], "the topic was recreated")
    assert ledger.reset_topic(P, T, "events#old") == 6
    assert ledger.heads(P) == {TopicPartition("events#old", 0): 30, TopicPartition("events#old", 1): 30}
    assert {tp.topic for tp in ledger.committable_offsets(P)} == {"events#old"}
    # the new topic's offsets start again from 0: a fresh chain, enforced as before
    b = plan(ledger, "run-new", r(0, 0, 7), r(1, 0, 8))
    ledger.mark_running(b)
    ledger.mark_succeeded(b, 15, 1)
    assert ledger.heads(P)[TP0] == 7 and ledger.heads(P)[TP1] == 8
    assert ledger.committable_offsets(P)[TP0] == 7
    assert [x.spans[0].topic for x in ledger.losses(P)] == ["events#old"]  # the abandoned offsets, archived
    with pytest.raises(LedgerConflict):  # the new chain is enforced as the old one was
        plan(ledger, "run-overlap", r(0, 3, 9))
