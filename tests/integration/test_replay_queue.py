"""Issue 39, item 4: the replay queue over the real ledger (SQLite and PostgreSQL). Batches refused
every time (retention or a topic reset under ``"fail"``, a poison batch) used to be the 10 earliest
failed batches of every replay run, so the batches after them were never tried. Now a batch whose
replay failed waits a backoff and goes behind the batches already waiting, and the consumer group
still never passes a failed batch. The replay DAG itself is in ``test_replay_reliability``."""

from __future__ import annotations

import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange, TopicPartition
from airflow_kafka_backpressure.ledger import REPLAY_BACKOFF_MAX_S, Ledger
from airflow_kafka_backpressure.ledger.replay_queue import replay_backoff_ms
from tests.integration.ledger_dbs import ledger, ledger_url  # noqa: F401 (fixtures)

P, T = "orders", "events"
TP0 = TopicPartition(T, 0)
BASE = 60_000  # the replay interval: the first backoff
T0 = 1_000_000


def failed_batches(led: Ledger, n: int, start: int = 0, at_ms: int = T0) -> list[int]:
    """``n`` batches of 10 offsets each on partition 0 (after ``start`` earlier ones), each failed on
    the main line one millisecond after the one before, from ``at_ms``."""
    ids = []
    for i in range(start, start + n):
        b = led.record_plan(P, f"run-{i}", [OffsetRange(T, 0, 10 * i, 10 * i + 10)], "/s", 1000, 0).batch_id
        led.mark_running(b, at_ms=at_ms + i - start)
        led.mark_failed(b, "the sink was down", at_ms=at_ms + i - start)
        ids.append(b)
    return ids


def replay_run(led: Ledger, now: int, refused: set[int], limit: int = 10) -> list[int]:
    """What a replay run does with the queue at ``now``: takes at most ``limit`` due batches, in the
    queue's order; the ``refused`` ones fail again, the others are replayed. Returns those taken."""
    taken = [b.batch_id for b in led.replay_queue(P, backoff_base_ms=BASE, now_ms=now).due[:limit]]
    for b in taken:
        led.mark_replaying(b, at_ms=now)
        if b in refused:
            led.mark_failed(b, f"Batch {b} cannot be replayed: retention deleted its offsets", at_ms=now)
        else:
            led.mark_replayed(b, 10, 1, at_ms=now)
    return taken


def test_ten_refused_batches_no_longer_hold_back_the_ones_after_them(ledger: Ledger):
    ids = failed_batches(ledger, 14)
    refused = set(ids[:10])
    now = T0 + 100
    assert replay_run(ledger, now, refused) == ids[:10]  # the earliest first, as before
    assert ledger.committable_offsets(P) == {}  # batch 1 failed: the group stays before it

    # The next run, one interval later (before 3c001ac: the same ten again, every run, for good)
    now += BASE // 2
    assert replay_run(ledger, now, refused) == ids[10:]
    assert [ledger.batch(b).status for b in ids[10:]] == ["replayed"] * 4
    assert ledger.committable_offsets(P) == {}  # written, but never committed past failed batch 1
    queue = ledger.replay_queue(P, backoff_base_ms=BASE, now_ms=now)
    assert queue.due == ()
    assert [(b.batch_id, b.replay_failures, at) for b, at in queue.waiting] == [
        (b, 1, T0 + 100 + BASE) for b in ids[:10]
    ]

    # once their backoff is over they are tried again, and wait twice as long after that
    now = T0 + 100 + BASE
    assert replay_run(ledger, now, refused) == ids[:10]
    assert {at - now for _, at in ledger.replay_queue(P, backoff_base_ms=BASE, now_ms=now).waiting} == {
        2 * BASE
    }
    # giving them up lets the group pass them, up to the end of everything written
    for b in ids[:10]:
        ledger.abandon(b, "retention deleted them")
    assert ledger.committable_offsets(P) == {TP0: 140}
    assert ledger.replayable_batches(P) == []


def test_a_refused_batch_goes_behind_the_batches_already_waiting_and_before_later_ones(ledger: Ledger):
    """Fairness: the queue is ordered by when each batch became due. A refused batch due again at T
    is taken after batches that failed before T and before those that failed after T, so no batch
    waits forever behind a stream of newer failures, and refused batches keep being retried."""
    (stuck,) = failed_batches(ledger, 1, at_ms=T0)
    replay_run(ledger, T0 + 10, {stuck})  # refused once: due again at T0 + 10 + BASE
    before = failed_batches(ledger, 2, start=1, at_ms=T0 + 10 + BASE // 2)
    after = failed_batches(ledger, 2, start=3, at_ms=T0 + 10 + BASE + 5)
    queue = ledger.replay_queue(P, backoff_base_ms=BASE, now_ms=T0 + 10 + 2 * BASE)
    assert [b.batch_id for b in queue.due] == [*before, stuck, *after]
    assert [b.batch_id for b in ledger.replay_queue(P, backoff_base_ms=BASE, now_ms=T0 + 20).due] == []


def test_replay_failures_count_failed_and_dead_replays_and_restart_on_the_main_line(ledger: Ledger):
    (b,) = failed_batches(ledger, 1)
    assert ledger.batch(b).replay_failures == 0  # failed on the main line
    ledger.mark_replaying(b, at_ms=T0 + 10)
    assert ledger.mark_failed(b, "poison", at_ms=T0 + 20).replay_failures == 1
    # a replay whose worker died: its lease expired, so the batch is due at once at failure count 2
    ledger.mark_replaying(b, at_ms=T0 + 30, token="a" * 32, lease_ms=100)
    (due,) = ledger.replay_queue(P, backoff_base_ms=BASE, now_ms=T0 + 130 + 2 * BASE).due
    assert due.batch_id == b and due.status == "replaying"
    assert ledger.replay_queue(P, backoff_base_ms=BASE, now_ms=T0 + 129 + 2 * BASE).waiting[0][1] == (
        T0 + 130 + 2 * BASE
    )
    assert ledger.mark_replaying(b, at_ms=T0 + 200 + 2 * BASE, token="b" * 32).replay_failures == 2
    assert ledger.mark_failed(b, "poison", at_ms=T0 + 300 + 2 * BASE).replay_failures == 3
    # a user cleared the ingest run: the batch runs on the main line again, and starts afresh
    assert ledger.mark_running(b, at_ms=T0 + 400 + 2 * BASE).replay_failures == 0


@pytest.mark.parametrize(
    "failures, expected",
    [(0, 0), (1, BASE), (2, 2 * BASE), (3, 4 * BASE), (6, 32 * BASE), (7, REPLAY_BACKOFF_MAX_S * 1000)],
)
def test_the_backoff_doubles_up_to_an_hour(failures, expected):
    assert replay_backoff_ms(failures, BASE) == expected
    assert replay_backoff_ms(500, BASE) == REPLAY_BACKOFF_MAX_S * 1000
    assert replay_backoff_ms(3, 2 * 3_600_000) == 2 * 3_600_000  # never less than one replay interval
