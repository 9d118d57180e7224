"""Leases instead of start times, and fencing of old attempts, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from airflow_kafka_backpressure.batch.models import DataLoss, OffsetRange
from airflow_kafka_backpressure.ledger import InvalidTransition, LeaseLost, Ledger, new_attempt_token
from tests.integration.ledger_dbs import ledger, ledger_url, with_ledgers_at_once  # noqa: F401 (fixtures)

P, T = "orders", "events"


def new_batch(led: Ledger, run: str = "run-1", start: int = 0) -> int:
    return led.record_plan(P, run, [OffsetRange(T, 0, start, start + 10)], "/s", 1000, 0).batch_id


def replayable(led: Ledger, now: int, stale_before: int | None = None) -> list[int]:
    return [b.batch_id for b in led.replayable_batches(P, stale_before, now_ms=now)]


def test_an_expired_lease_makes_a_running_batch_replayable_and_fences_its_old_attempt(ledger: Ledger):
    b = new_batch(ledger)
    ingest, replay = new_attempt_token(), new_attempt_token()
    run = ledger.mark_running(b, token=ingest, lease_ms=1_000, at_ms=1_000)
    assert (run.owner_token, run.lease_expires_at_ms) == (ingest, 2_000)
    assert run.to_dict()["lease_expires_at_ms"] == 2_000 and ingest not in str(run.to_dict())
    assert ledger.renew_lease(b, ingest, 1_000, at_ms=1_500) == 2_500
    assert replayable(ledger, now=2_499) == []
    with pytest.raises(InvalidTransition, match="may still be in progress"):
        ledger.mark_replaying(b, at_ms=2_499, token=replay)
    # the worker died: nobody renews; no stale_before_ms is needed, the lease says it
    assert replayable(ledger, now=2_500) == [b]
    claimed = ledger.mark_replaying(b, at_ms=2_600, token=replay, lease_ms=5_000)
    assert (claimed.status, claimed.owner_token, claimed.lease_expires_at_ms) == ("replaying", replay, 7_600)
    assert replayable(ledger, now=3_000) == []
    # the old attempt comes back to life: it can neither keep nor finish the batch
    with pytest.raises(
        LeaseLost,
        match=rf"Batch {b}: this attempt \(token {ingest[:8]}…\) cannot renew its lease: "
        rf"another attempt \(token {replay[:8]}…\) took it over",
    ):
        ledger.renew_lease(b, ingest, 1_000, at_ms=3_000)
    for finish in (
        lambda: ledger.mark_succeeded(b, 10, 1, token=ingest),
        lambda: ledger.mark_failed(b, "late failure", token=ingest),
        lambda: ledger.record_losses(b, [DataLoss(T, 0, 0, 1)], token=ingest),
    ):
        with pytest.raises(LeaseLost, match="Stop working on it"):
            finish()
    assert ledger.batch(b) == claimed and ledger.losses(P) == []
    done = ledger.mark_replayed(b, 10, 1, token=replay, at_ms=4_000)
    assert (done.status, done.lease_expires_at_ms) == ("replayed", None)
    with pytest.raises(LeaseLost, match="it is 'replayed' now"):
        ledger.renew_lease(b, replay, 1_000)


def test_a_renewed_lease_keeps_a_long_batch_its_own_whatever_its_start_time(ledger: Ledger):
    b = new_batch(ledger)
    token = new_attempt_token()
    ledger.mark_running(b, token=token, lease_ms=60_000, at_ms=1_000)
    ledger.renew_lease(b, token, 60_000, at_ms=100_000)
    # started long before stale_before_ms, but the lease is live: not stale
    assert replayable(ledger, now=120_000, stale_before=50_000) == []
    with pytest.raises(InvalidTransition, match="may still be in progress"):
        ledger.mark_replaying(b, stale_before_ms=50_000, at_ms=120_000)
    with pytest.raises(InvalidTransition, match="may still be in progress"):
        ledger.abandon(b, "x", stale_before_ms=50_000, at_ms=120_000)
    assert ledger.mark_succeeded(b, 10, 1, token=token).status == "succeeded"


def test_rows_without_a_lease_fall_back_to_stale_before_ms(ledger: Ledger):
    b = new_batch(ledger)
    ledger.mark_running(b, at_ms=1_000)  # an operator that sets no token yet
    assert ledger.batch(b).lease_expires_at_ms is None
    assert replayable(ledger, now=10**12) == []
    assert replayable(ledger, now=10**12, stale_before=1_001) == [b]
    assert ledger.mark_replaying(b, stale_before_ms=1_001).status == "replaying"
    assert ledger.mark_replayed(b, 10, 1).status == "replayed"  # no token: no fencing, as before


def test_a_retry_takes_the_batch_over_and_fences_the_attempt_before_it(ledger: Ledger):
    b = new_batch(ledger)
    first, second = new_attempt_token(), new_attempt_token()
    ledger.mark_running(b, token=first, lease_ms=10_000)
    ledger.mark_running(b, token=second, lease_ms=10_000)  # Airflow retried the ingest task
    with pytest.raises(LeaseLost):
        ledger.mark_succeeded(b, 10, 1, token=first)
    assert ledger.mark_succeeded(b, 10, 1, token=second).status == "succeeded"
    assert ledger.mark_succeeded(b, 10, 2, token=second).processing_ms == 2  # a retried record task


def test_an_expired_lease_lets_a_user_abandon_the_batch(ledger: Ledger):
    b = new_batch(ledger)
    ledger.mark_running(b, token=new_attempt_token(), lease_ms=1_000, at_ms=1_000)
    with pytest.raises(InvalidTransition, match="may still be in progress"):
        ledger.abandon(b, "gone", at_ms=1_999)
    assert ledger.abandon(b, "gone", at_ms=2_000).status == "abandoned"
    assert ledger.committable_offsets(P) == {OffsetRange(T, 0, 0, 1).tp: 10}


def test_bad_lease_arguments_are_refused(ledger: Ledger):
    b = new_batch(ledger)
    with pytest.raises(ValueError, match=f"Batch {b}: lease_ms needs a token"):
        ledger.mark_running(b, lease_ms=1_000)
    with pytest.raises(ValueError, match="lease_ms must be > 0"):
        ledger.mark_running(b, token="t", lease_ms=0)
    with pytest.raises(ValueError, match="at most 64 characters"):
        ledger.mark_running(b, token="x" * 65)
    assert ledger.batch(b).status == "planned"


def test_two_replayers_cannot_both_claim_an_expired_batch(ledger: Ledger, ledger_url: str):
    b = new_batch(ledger)
    ledger.mark_running(b, token=new_attempt_token(), lease_ms=1, at_ms=1_000)
    results = with_ledgers_at_once(
        ledger_url,
        3,
        lambda led, i: led.mark_replaying(b, token=f"replayer-{i}", lease_ms=60_000, at_ms=5_000),
    )
    assert sum(isinstance(x, InvalidTransition) for x in results) == 2, results
    winner = next(x for x in results if not isinstance(x, Exception))
    assert ledger.batch(b).owner_token == winner.owner_token


def test_a_planned_batch_nobody_claims_becomes_replayable_when_its_plan_lease_expires(ledger: Ledger):
    """The plan task died after recording the plan, or the ingest task before claiming it: the batch
    is found once the plan's lease expires, not after a day (no stale_before_ms needed)."""
    b = ledger.record_plan(P, "run-1", [OffsetRange(T, 0, 0, 10)], "/s", 1000, 0, lease_ms=60_000).batch_id
    planned = ledger.batch(b)
    assert planned.status == "planned" and planned.owner_token is None
    expires = planned.created_at_ms + 60_000
    assert planned.lease_expires_at_ms == expires
    assert replayable(ledger, now=expires - 1) == []
    with pytest.raises(InvalidTransition, match="may still be in progress"):
        ledger.mark_replaying(b, at_ms=expires - 1, token=new_attempt_token())
    assert replayable(ledger, now=expires) == [b]
    replay = new_attempt_token()
    claimed = ledger.mark_replaying(b, at_ms=expires + 1, token=replay, lease_ms=5_000)
    assert (claimed.status, claimed.owner_token) == ("replaying", replay)
    # the late ingest task can no longer start it
    with pytest.raises(InvalidTransition, match="replay DAG is replaying it"):
        ledger.mark_running(b, token=new_attempt_token(), lease_ms=5_000, at_ms=expires + 2)


def test_an_ingest_task_claims_its_planned_batch_within_the_plan_lease(ledger: Ledger):
    b = ledger.record_plan(P, "run-1", [OffsetRange(T, 0, 0, 10)], "/s", 1000, 0, lease_ms=60_000).batch_id
    token = new_attempt_token()
    run = ledger.mark_running(b, token=token, lease_ms=1_000, at_ms=1_000)  # its own lease from now on
    assert (run.status, run.owner_token, run.lease_expires_at_ms) == ("running", token, 2_000)
    with pytest.raises(ValueError, match="lease_ms must be > 0"):
        ledger.record_plan(P, "run-2", [OffsetRange(T, 0, 10, 20)], "/s", 1000, 0, lease_ms=0)


def test_a_failure_before_the_claim_never_takes_the_batch_from_the_attempt_that_holds_it(ledger: Ledger):
    """The ingest task fails before claiming (settings, connection): it marks the batch failed only
    while it is still planned; a replay that took it over, or a finished batch, stays as it is."""
    b = new_batch(ledger)
    replay = new_attempt_token()
    ledger.mark_failed(b, "first failure")
    ledger.mark_replaying(b, token=replay, lease_ms=60_000)
    with pytest.raises(
        InvalidTransition, match=rf"Batch {b} is 'replaying': left as it is, not marked 'failed'"
    ):
        ledger.mark_failed(b, "before the job started: bad settings", only_from=("planned",))
    assert (ledger.batch(b).status, ledger.batch(b).owner_token) == ("replaying", replay)
    ledger.mark_replayed(b, 10, 5, token=replay)
    with pytest.raises(InvalidTransition, match="is 'replayed': left as it is"):
        ledger.mark_failed(b, "a cleared run's settings failed", only_from=("planned",))
    fresh = new_batch(ledger, "run-2", start=10)
    assert ledger.mark_failed(fresh, "before the job started", only_from=("planned",)).status == "failed"
