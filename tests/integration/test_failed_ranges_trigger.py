"""The deferrable wait for failed batches: the real trigger loop over a real SQLite ledger."""

from __future__ import annotations

import asyncio
import threading

from airflow_kafka_backpressure.ledger import Ledger
from airflow_kafka_backpressure.models import OffsetRange
from airflow_kafka_backpressure.triggers.failed_ranges import FailedRangesTrigger


def first_event(trigger: FailedRangesTrigger, timeout_s: float = 60):
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


def test_trigger_fires_when_a_batch_fails_and_round_trips_through_serialize(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(url)
    ledger.create_all()
    first = _plan(ledger, "r1", 0)
    ledger.mark_running(first)
    ledger.mark_succeeded(first, 10, 5)
    second = _plan(ledger, "r2", 10)
    ledger.mark_running(second)

    trigger = FailedRangesTrigger(url, "p", stale_before_ms=None, poll_interval_s=0.05)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_kafka_backpressure.triggers.failed_ranges.FailedRangesTrigger"
    revived = FailedRangesTrigger(**kwargs)

    # the batch fails while the trigger is already waiting
    threading.Timer(0.3, lambda: ledger.mark_failed(second, "boom")).start()

    assert first_event(revived).payload == {"status": "found", "batch_ids": [second]}


def test_trigger_reports_an_unreachable_ledger_instead_of_spinning(tmp_path):
    trigger = FailedRangesTrigger("postgresql+psycopg2://nobody:x@127.0.0.1:1/none", "p", None, 0.05)

    event = first_event(trigger)
    assert event.payload["status"] == "error" and "OperationalError" in event.payload["message"]


def test_trigger_times_out_by_itself_at_its_deadline(tmp_path):
    import time

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    Ledger(url).create_all()
    trigger = FailedRangesTrigger(url, "p", None, poll_interval_s=10, deadline_ms=int(time.time() * 1000) + 300)

    assert first_event(trigger).payload == {"status": "timeout"}
