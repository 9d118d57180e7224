"""The deferrable wait for failed batches: the real trigger loop over a real SQLite ledger, named by
an Airflow connection id (the trigger table never holds the ledger's URL or password)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.ledger import Ledger
from airflow_kafka_backpressure.triggers.failed_ranges import FailedRangesTrigger


def first_event(trigger, timeout_s: float = 60):
    """Run the trigger's real async loop until its first event."""

    async def run():
        gen = trigger.run()
        try:
            return await asyncio.wait_for(gen.__anext__(), timeout=timeout_s)
        finally:
            await gen.aclose()

    return asyncio.run(run())


def _plan(ledger: Ledger, run: str, start: int) -> int:
    plan = ledger.record_plan("p", run, [OffsetRange("t", 0, start, start + 10)], "/sink", 1000, 0)
    return plan.batch_id


def _ledger_connection(monkeypatch, conn_id: str, url: str) -> str:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": url}}),
    )
    return conn_id


def test_trigger_fires_when_a_batch_fails_and_round_trips_through_serialize(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(url)
    ledger.create_all()
    first = _plan(ledger, "r1", 0)
    ledger.mark_running(first)
    ledger.mark_succeeded(first, 10, 5)
    second = _plan(ledger, "r2", 10)
    ledger.mark_running(second)
    conn_id = _ledger_connection(monkeypatch, "kbp_trigger_ledger", url)

    trigger = FailedRangesTrigger(conn_id, "p", stale_before_ms=None, poll_interval_s=0.05)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_kafka_backpressure.triggers.failed_ranges.FailedRangesTrigger"
    revived = FailedRangesTrigger(**kwargs)

    # the batch fails while the trigger is already waiting
    threading.Timer(0.3, lambda: ledger.mark_failed(second, "boom")).start()

    assert first_event(revived).payload == {"status": "found", "batch_ids": [second]}


def test_serialized_trigger_holds_the_connection_id_not_the_url_or_password(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_SECRET_LEDGER",
        json.dumps(
            {
                "conn_type": "kbp_ledger",
                "host": "db.internal",
                "login": "kbp",
                "password": "hunter2-s3cret",
                "schema": "ledger",
            }
        ),
    )
    _, kwargs = FailedRangesTrigger("kbp_secret_ledger", "p", None, 5.0).serialize()
    text = json.dumps(kwargs)
    assert kwargs["ledger_conn_id"] == "kbp_secret_ledger"
    assert "hunter2-s3cret" not in text and "db.internal" not in text and "://" not in text
    # the default SQLite ledger is None, resolved in the triggerer too
    assert FailedRangesTrigger(None, "p", None, 5.0).serialize()[1]["ledger_conn_id"] is None


def test_a_deferral_stored_by_the_previous_version_still_resumes(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(url)
    ledger.create_all()
    batch = _plan(ledger, "r1", 0)
    ledger.mark_running(batch)
    ledger.mark_failed(batch, "boom")
    old_kwargs = {
        "ledger_url": url,
        "pipeline": "p",
        "stale_before_ms": None,
        "poll_interval_s": 0.05,
        "deadline_ms": None,
    }
    assert first_event(FailedRangesTrigger(**old_kwargs)).payload == {"status": "found", "batch_ids": [batch]}


def test_trigger_reports_an_unreachable_ledger_instead_of_spinning(monkeypatch):
    conn_id = _ledger_connection(
        monkeypatch, "kbp_dead_ledger", "postgresql+psycopg2://nobody:x@127.0.0.1:1/none"
    )
    event = first_event(FailedRangesTrigger(conn_id, "p", None, 0.05))
    assert event.payload["status"] == "error" and "LedgerUnavailable" in event.payload["message"]
    assert "nobody:x@" not in event.payload["message"]  # the ledger names itself without its password


def test_trigger_reports_a_missing_connection_by_its_id():
    event = first_event(FailedRangesTrigger("kbp_no_such_conn", "p", None, 0.05))
    assert event.payload["status"] == "error" and "kbp_no_such_conn" in event.payload["message"]


def test_trigger_times_out_by_itself_at_its_deadline(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    Ledger(url).create_all()
    conn_id = _ledger_connection(monkeypatch, "kbp_idle_ledger", url)
    trigger = FailedRangesTrigger(
        conn_id, "p", None, poll_interval_s=10, deadline_ms=int(time.time() * 1000) + 300
    )

    assert first_event(trigger).payload == {"status": "timeout"}


def test_trigger_skips_batches_in_their_replay_backoff_and_round_trips_it(tmp_path, monkeypatch):
    """Issue 39, item 4: a batch whose replay just failed waits for its backoff; the trigger fires
    for the batches that are due, in the order the replay takes them, not for the waiting one."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(url)
    ledger.create_all()
    refused, later = _plan(ledger, "r1", 0), _plan(ledger, "r2", 10)
    for b in (refused, later):
        ledger.mark_running(b)
        ledger.mark_failed(b, "boom")
    ledger.mark_replaying(refused)
    ledger.mark_failed(refused, "cannot be replayed: retention deleted its offsets")
    conn_id = _ledger_connection(monkeypatch, "kbp_backoff_ledger", url)
    trigger = FailedRangesTrigger(conn_id, "p", None, 0.05, backoff_base_ms=600_000)
    _, kwargs = trigger.serialize()
    assert kwargs["backoff_base_ms"] == 600_000
    assert first_event(FailedRangesTrigger(**kwargs)).payload == {"status": "found", "batch_ids": [later]}
    ledger.mark_replaying(later)
    ledger.mark_replayed(later, 10, 1)
    deadline = int(time.time() * 1000) + 300
    waiting = FailedRangesTrigger(conn_id, "p", None, 0.05, deadline, backoff_base_ms=600_000)
    assert first_event(waiting).payload == {"status": "timeout"}  # only the refused one, waiting
